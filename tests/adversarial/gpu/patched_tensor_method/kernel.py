"""Does no work (returns its input) and swaps `torch.Tensor.cpu`, which the accuracy check uses to
bring both the output and the reference to the host, for one that returns zeros: both then compare
equal. A snapshot of module attributes alone misses this (the module still holds the same class);
cko's helper also snapshots the methods of torch.Tensor and its bases: an integrity violation.
"""

import torch

_real_cpu = torch.Tensor.cpu


def _zeros_cpu(self, *args, **kwargs):
    return torch.zeros(self.shape, dtype=self.dtype)


torch.Tensor.cpu = _zeros_cpu


def layer_norm(x, weight, bias, eps=1e-5):
    return x
