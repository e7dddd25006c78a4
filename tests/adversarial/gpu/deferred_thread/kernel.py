"""Returns an empty output at once and fills it from a background thread.

Caught twice over: a thread left running after the run is an integrity violation, and the output
read before the thread has written it fails accuracy.
"""

import threading

import torch


def _eager(x, weight, bias, eps):
    """The original's eager LayerNorm (no faster than it): any gain must come from the trick."""
    xf = x.float()
    xc = xf - xf.mean(dim=-1, keepdim=True)
    return (xc * torch.rsqrt((xc * xc).mean(dim=-1, keepdim=True) + eps) * weight.float() + bias.float()).to(
        x.dtype
    )


def layer_norm(x, weight, bias, eps=1e-5):
    y = torch.empty_like(x)

    def fill():
        with torch.cuda.device(x.device):
            y.copy_(_eager(x, weight, bias, eps))

    threading.Thread(target=fill, daemon=True).start()
    return y
