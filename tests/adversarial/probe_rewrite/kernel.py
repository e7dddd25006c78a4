"""The original's maths, after trying to rewrite the environment identity the invocation records.

The probe is written by cko in the supervisor's container before any driver starts; the worker
cannot reach it."""

import glob
import json
import os

import numpy as np

FORGED = {"tools": {"python": "forged-by-candidate", "numpy": "forged"}, "gpus": {"uuids": []}}
for path in [
    "/cko/out/.cko/probe.json",
    *glob.glob("/cko/**/probe.json", recursive=True),
    *glob.glob("/dev/shm/**/probe.json", recursive=True),
]:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(FORGED, f)
    except OSError:
        pass


def softmax(x):
    shifted = x - x.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=1, keepdims=True)
