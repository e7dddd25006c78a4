import numpy as np


def softmax(x):
    return np.empty_like(x)  # never written: whatever the allocator hands back
