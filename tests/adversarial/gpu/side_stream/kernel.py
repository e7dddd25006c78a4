"""Launches the original's eager LayerNorm on a private stream and returns without waiting for it.

A timer that stops when the caller's stream is done would see only the launches (tens of
microseconds instead of milliseconds). cko's helper synchronises the whole device before it stops
the clock, so this times honestly, as the original does.
"""

import torch


def _eager(x, weight, bias, eps):
    """The original's eager LayerNorm (no faster than it): any gain must come from the trick."""
    xf = x.float()
    xc = xf - xf.mean(dim=-1, keepdim=True)
    return (xc * torch.rsqrt((xc * xc).mean(dim=-1, keepdim=True) + eps) * weight.float() + bias.float()).to(
        x.dtype
    )


_side = None


def layer_norm(x, weight, bias, eps=1e-5):
    global _side
    if _side is None:
        _side = torch.cuda.Stream(device=x.device)
    _side.wait_stream(torch.cuda.current_stream(x.device))  # the inputs were made on the default stream
    with torch.cuda.stream(_side):
        y = _eager(x, weight, bias, eps)
    return y  # no wait_stream back: the caller's stream does not know the work is still running
