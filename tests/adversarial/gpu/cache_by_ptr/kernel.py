"""Memoises the output by the input's address and shape, the trick of several leaderboard entries.

PyTorch's caching allocator hands a new input of the same size the address the last one had, so
this returns the output of an earlier repetition for fresh data. cko draws new inputs for every
repetition and checks the outputs of timed runs, so the stale output fails accuracy.
"""

import torch


def _eager(x, weight, bias, eps):
    """The original's eager LayerNorm (no faster than it): any gain must come from the trick."""
    xf = x.float()
    xc = xf - xf.mean(dim=-1, keepdim=True)
    return (xc * torch.rsqrt((xc * xc).mean(dim=-1, keepdim=True) + eps) * weight.float() + bias.float()).to(
        x.dtype
    )


_cache = {}


def layer_norm(x, weight, bias, eps=1e-5):
    key = (x.data_ptr(), tuple(x.shape), x.dtype)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    y = _eager(x, weight, bias, eps)
    _cache[key] = y
    return y
