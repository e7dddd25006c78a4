"""One block of a subject under torch.profiler, exported as a Chrome trace (`cko profile torch --collect`).

The collector sets CKO_PROFILE_TORCH to a path under the worker's own bounded /cko/out; the worker
then profiles its first timed block (warm-up runs are not in it) and writes the trace when that
block ends. The trace is written by the subject's own process, so it is diagnostic evidence about
where time goes, never an input to a verdict: a measurement never runs with this set.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

ENV = "CKO_PROFILE_TORCH"


class BlockProfiler:
    def __init__(self, path: str, device: str) -> None:
        self.path = path
        self.device = device
        self.done = False

    @contextlib.contextmanager
    def around(self) -> Iterator[None]:
        """Profile the enclosed block once; later blocks run unprofiled."""
        if self.done:
            yield
            return
        from torch.profiler import ProfilerActivity, profile, record_function

        activities = [ProfilerActivity.CPU]
        if self.device == "cuda":
            activities.append(ProfilerActivity.CUDA)
        prof: Any = profile(activities=activities, record_shapes=True)
        with prof, record_function("cko.block"):
            yield
        self.done = True
        tmp = self.path + ".tmp"
        prof.export_chrome_trace(tmp)
        os.replace(tmp, self.path)


def from_env(device: str) -> BlockProfiler | None:
    path = os.environ.get(ENV)
    return BlockProfiler(path, device) if path else None
