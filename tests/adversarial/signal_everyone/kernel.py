"""The original's maths, after trying to stop, kill or trace every other process it can name:
the supervisor, the other subject's worker, the container's init.

Workers run in their own containers (own PID namespaces) under their own uids."""

import os
import signal

import numpy as np

_me = os.getpid()
for entry in os.listdir("/proc"):
    if entry.isdigit() and int(entry) != _me:
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            try:
                os.kill(int(entry), sig)
            except OSError:
                pass
for guess in range(1, 400):  # pids it cannot see: other namespaces are invisible, not just forbidden
    if guess != _me:
        try:
            os.kill(guess, 0)
        except OSError:
            pass


def softmax(x):
    shifted = x - x.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=1, keepdims=True)
