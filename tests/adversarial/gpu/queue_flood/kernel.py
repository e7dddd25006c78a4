"""The original's eager maths, plus a background thread that keeps the GPU queue full of spin
kernels (torch.cuda._sleep) on a side stream of its own context.

Freezing the worker stops its CPU, not the kernels it already queued: they keep running while the
other subject is timed, time-slicing the device against it. The flood starts when the module loads, so
the device is already busy when the supervisor calibrates its idle probe with every worker frozen: a
limit taken then would hide it, and the stage ends there (queue_flood_late starts it later)."""

import threading

import torch


def _flood():
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        while True:
            torch.cuda._sleep(
                50_000_000
            )  # ~25 ms of spinning per launch; launches block once the queue is full


threading.Thread(target=_flood, daemon=True).start()


def _eager(x, weight, bias, eps):
    xf = x.float()
    xc = xf - xf.mean(dim=-1, keepdim=True)
    return (xc * torch.rsqrt((xc * xc).mean(dim=-1, keepdim=True) + eps) * weight.float() + bias.float()).to(
        x.dtype
    )


def layer_norm(x, weight, bias, eps=1e-5):
    return _eager(x, weight, bias, eps)
