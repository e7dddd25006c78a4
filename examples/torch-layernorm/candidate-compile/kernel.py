"""LayerNorm over the last dimension: the original's eager code, compiled by `torch.compile`.

Inductor fuses the upcast, the two reductions, the normalisation and the affine into one or two
generated Triton kernels, so the float32 temporaries of the eager version never reach HBM. The
compile happens on the first call (the worker's warm-up), outside every timed window; Inductor's
idle helper threads stay behind and are frozen with the rest of the worker between windows.
"""

import torch


def _layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    mean = xf.mean(dim=-1, keepdim=True)
    xc = xf - mean
    var = (xc * xc).mean(dim=-1, keepdim=True)
    y = xc * torch.rsqrt(var + eps)
    return (y * weight.float() + bias.float()).to(x.dtype)


_compiled = torch.compile(_layer_norm, dynamic=False)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return _compiled(x, weight, bias, eps)
