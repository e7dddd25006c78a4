"""Overwrites its input in place with zeros and returns the softmax of zeros (a constant).

Under a shared-process harness the reference, computed afterwards from the same input object,
agreed. Here the worker owns only its copy of the inputs; the supervisor's reference comes from
inputs no subject touched."""

import numpy as np


def softmax(x):
    x[...] = 0.0
    return np.full_like(x, 1.0 / x.shape[1])
