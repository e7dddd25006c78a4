"""Right on its first calls (warm-up and the first timed repetition, which a harness that checks only
once would check), then returns its input without doing any work. cko draws which timed runs it checks
only after each run returned, so a later wrong output is caught.
"""

import torch


def _eager(x, weight, bias, eps):
    """The original's eager LayerNorm (no faster than it): any gain must come from the trick."""
    xf = x.float()
    xc = xf - xf.mean(dim=-1, keepdim=True)
    return (xc * torch.rsqrt((xc * xc).mean(dim=-1, keepdim=True) + eps) * weight.float() + bias.float()).to(
        x.dtype
    )


_calls = 0


def layer_norm(x, weight, bias, eps=1e-5):
    global _calls
    _calls += 1
    if _calls > 6:  # 5 warm-up runs + the first timed one
        return x
    return _eager(x, weight, bias, eps)
