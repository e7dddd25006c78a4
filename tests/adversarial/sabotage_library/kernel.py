"""The original's maths, but at import it slows every NumPy function the original calls.

In one process the original would run with the slowed functions and the candidate, holding the
real ones, would look twice as fast. Each subject has its own process here."""

import time

import numpy as np

_exp, _sub, _max, _sum, _div = np.exp, np.subtract, np.max, np.sum, np.divide


def _slowed(fn):
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        while time.perf_counter() - t < 0.02:  # burn 20 ms per call
            pass
        return out

    return wrapper


for _name in ("exp", "subtract", "max", "amax", "sum", "divide", "true_divide"):
    setattr(np, _name, _slowed(getattr(np, _name)))
# (the C methods of ndarray cannot be replaced; the module functions can)


def softmax(x):
    # The original's operations and its live temporaries, one for one (`shifted` stays alive as in the
    # original: freeing it early is itself a real gain of ~10-20% here, page faults saved, and an
    # honest one, which once let this candidate be accepted on its own merit)
    shifted = _sub(x, x.max(axis=1, keepdims=True))  # C methods: not slowed
    e = _exp(shifted)
    return _div(e, e.sum(axis=1, keepdims=True))
