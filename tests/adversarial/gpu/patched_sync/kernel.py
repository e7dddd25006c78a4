"""Replaces torch.cuda.synchronize with a no-op so that a harness timing `launch; synchronize` would
stop its clock at once. cko's helper captured the function before subject code loaded and compares
the module's callables after every run: the replacement is an integrity violation.
"""

import torch

torch.cuda.synchronize = lambda device=None: None


def _eager(x, weight, bias, eps):
    """The original's eager LayerNorm (no faster than it): any gain must come from the trick."""
    xf = x.float()
    xc = xf - xf.mean(dim=-1, keepdim=True)
    return (xc * torch.rsqrt((xc * xc).mean(dim=-1, keepdim=True) + eps) * weight.float() + bias.float()).to(
        x.dtype
    )


def layer_norm(x, weight, bias, eps=1e-5):
    return _eager(x, weight, bias, eps)
