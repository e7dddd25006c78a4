import numpy as np


def softmax(x):
    return np.full_like(x, np.nan)
