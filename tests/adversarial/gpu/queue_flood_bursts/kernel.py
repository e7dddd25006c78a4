"""queue_flood_late's next trick: flood the device in bursts short enough that it never stays busy for
LEFT_RUNNING_PERSIST_S without a break. A thread, started by the first call, queues about 1 s of
spinning on a side stream whenever the previous burst has drained, and polls otherwise. A burst queued
inside this worker's window is caught by the window's whole-device synchronise (its own time grows);
one queued after that synchronise and before the freeze runs while the other subject is measured, and
the device is idle again before the next burst can start.

What must stop it is not the 2 s rule but the probes: each one after this worker's commands finds the
device busy with the worker frozen, that block is voided, and the third such command ends the stage."""

import threading
import time

import torch

_BURST_LAUNCHES = 40  # x ~25 ms of spinning: ~1 s, under the 2 s persistence rule
_started: list = []


def _bursts() -> None:
    s = torch.cuda.Stream()
    done = None
    while True:
        if done is not None and not done.query():  # at most one burst queued: gaps between bursts
            time.sleep(0.0005)
            continue
        with torch.cuda.stream(s):
            for _ in range(_BURST_LAUNCHES):
                torch.cuda._sleep(50_000_000)
            done = torch.cuda.Event()
            done.record(s)


def _eager(x, weight, bias, eps):
    xf = x.float()
    xc = xf - xf.mean(dim=-1, keepdim=True)
    return (xc * torch.rsqrt((xc * xc).mean(dim=-1, keepdim=True) + eps) * weight.float() + bias.float()).to(
        x.dtype
    )


def layer_norm(x, weight, bias, eps=1e-5):
    if not _started:
        _started.append(threading.Thread(target=_bursts, daemon=True))
        _started[0].start()
    return _eager(x, weight, bias, eps)
