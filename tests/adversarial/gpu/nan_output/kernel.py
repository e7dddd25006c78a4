"""Returns NaN at once: NaN never passes the accuracy gate."""

import torch


def layer_norm(x, weight, bias, eps=1e-5):
    return torch.full_like(x, float("nan"))
