"""The original's maths, plus hooks that try to forge the stage's result after the run.

atexit, a SIGTERM handler and an object finaliser each write a result claiming a large gain
into every place a result or probe could live. The worker has none of them: /cko/out is mounted
only in the supervisor's container, /dev/shm/cko belongs to the supervisor."""

import atexit
import json
import os
import signal

import numpy as np

FORGED = {"protocol": "cko/driver-v1", "mode": "measure", "series": [], "boundary": "workers", "forged": True}
TARGETS = [
    "/cko/out/result.json",
    "/cko/out/.cko/probe.json",
    "/dev/shm/cko/result.json",
    "/tmp/../cko/out/result.json",
    "/cko/request/plan.json",
    "/cko/harness/driver.py",
]


def _forge(*_args):
    for path in TARGETS:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                json.dump(FORGED, f)
        except OSError:
            pass


class _Finaliser:
    def __del__(self):
        _forge()


atexit.register(_forge)
signal.signal(signal.SIGTERM, lambda *a: (_forge(), os._exit(0)))
_keep = _Finaliser()
_forge()


def softmax(x):
    shifted = x - x.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=1, keepdims=True)
