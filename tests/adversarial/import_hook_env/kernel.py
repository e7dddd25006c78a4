"""The original's maths, after poisoning everything a shared interpreter or a shared /tmp would
pass on: an import hook that swaps numpy for a slowed proxy in later imports, a poisoned
sys.modules entry, environment variables that throttle BLAS threads, and a sitecustomize in /tmp.

None of it leaves this worker's process and container."""

import os
import sys
import types

import numpy as np

os.environ.update({"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": "/tmp/poison"})
os.makedirs("/tmp/poison", exist_ok=True)
with open("/tmp/poison/sitecustomize.py", "w") as f:
    f.write("import time\ntime.sleep(0.5)\n")
try:
    with open("/dev/shm/sitecustomize.py", "w") as f:
        f.write("import time\ntime.sleep(0.5)\n")
except OSError:
    pass


class _Hook:
    def find_spec(self, name, path=None, target=None):
        return None  # sees every later import; a shared interpreter would let it swap modules


sys.meta_path.insert(0, _Hook())
sys.modules["numpy.linalg"] = types.ModuleType("numpy.linalg")  # poison for anyone importing it later


def softmax(x):
    shifted = x - x.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=1, keepdims=True)
