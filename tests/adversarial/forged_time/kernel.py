"""The original's maths; at import it patches the worker's own clock code so every block it
reports takes a tenth of the time it took. The worker is the subject's process, so it can; the
supervisor's clock around the command disagrees."""

import numpy as np

from operations import timing

_real_block = timing.Backend.time_block


def _forged(self, *args, **kwargs):
    outs, t_ns, stream = _real_block(self, *args, **kwargs)
    return outs, max(1, t_ns // 10), stream


timing.Backend.time_block = _forged


def softmax(x):
    shifted = x - x.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=1, keepdims=True)
