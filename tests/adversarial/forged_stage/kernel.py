"""The original's maths; at import it patches the worker's reply so that nine tenths of every
window it timed are reported as input staging instead. The total still matches the supervisor's
clock around the command, and staging is untimed: only the claimed split is false. The next trick
after forged_time, which shrank the total and was caught by that clock. What catches this one is
that the supervisor's own clock, around the whole command, sees no saving at all."""

import numpy as np

from operations import worker

_real_run = worker.Worker.run


def _run(self, cmd):
    reply = _real_run(self, cmd)
    if reply.ok and reply.t_ns:
        moved = reply.t_ns * 9 // 10
        return reply.model_copy(
            update={"t_ns": reply.t_ns - moved, "stage_ns": (reply.stage_ns or 0) + moved}
        )
    return reply


worker.Worker.run = _run


def softmax(x):
    shifted = x - x.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=1, keepdims=True)
