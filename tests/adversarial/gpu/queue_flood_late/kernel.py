"""queue_flood, started by the first call instead of at load: the supervisor's idle probe is then
calibrated on an idle device, and the flood begins inside the subject's warm-up.

Every synchronise of the worker's own then waits for the kernels queued so far; frozen, the worker's
queued kernels keep the device busy. The probes after its warm-up, its windows and its releases find
the device busy with it frozen, and the third such finding ends the stage."""

import threading

import torch

_started = []


def _flood():
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        while True:
            torch.cuda._sleep(50_000_000)  # ~25 ms of spinning per launch; blocks once the queue is full


def _eager(x, weight, bias, eps):
    xf = x.float()
    xc = xf - xf.mean(dim=-1, keepdim=True)
    return (xc * torch.rsqrt((xc * xc).mean(dim=-1, keepdim=True) + eps) * weight.float() + bias.float()).to(
        x.dtype
    )


def layer_norm(x, weight, bias, eps=1e-5):
    if not _started:
        _started.append(threading.Thread(target=_flood, daemon=True))
        _started[0].start()
    return _eager(x, weight, bias, eps)
