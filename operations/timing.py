"""Clocks a worker times its blocks with: perf_counter_ns on the CPU, CUDA events on a GPU.

A block is back-to-back runs of the subject, each on a set of inputs of its own (a subject that
remembers an answer per input has nothing to reuse). In `cold` mode a block is one run, and on a
GPU the L2 cache is flushed before it (a write of a buffer larger than L2, outside the window), so
it reads from memory as a cold-cache call would; in `hot` mode the runs follow each other with
nothing between them (do_bench / nvbench batch); in `graph` mode (CUDA through torch only) the
block's runs are captured once into a CUDA graph, outside the window, and the window times one
replay of it: the CPU's launch cost, which an events clock reads as GPU time on a
us-scale subject, is paid at capture and not timed (tests/gpu/README.md, fidelity). On a GPU the
window ends only after a whole-device synchronise, so work a subject left on another stream lands
inside it.

These times are the worker's claims: the supervisor bounds every block with its own clock.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar

TIMERS = ("auto", "torch", "cupy")
MODES = ("cold", "hot", "graph")
B = TypeVar("B")
L2_FLUSH_BYTES = 256 << 20  # larger than any current GPU's L2 (H200: 60 MB)


class GraphUnsupported(RuntimeError):
    """This clock cannot capture a CUDA graph (graph mode needs CUDA timed through torch)."""


class Backend:
    name = "perf_counter_ns"

    def capture(self, fns: list[Callable[[], Any]]) -> tuple[Callable[[], Any], list[Any]]:
        """(replay, each captured run's output): the runs `fns`, in order, as one CUDA graph."""
        raise GraphUnsupported(f"graph mode needs CUDA timed through torch; this clock is {self.name}")

    def sync(self) -> None:
        return None

    def flush_l2(self) -> None:
        return None

    def time_block(self, fns: list[Callable[[], Any]], mode: str) -> tuple[list[Any], int, int | None]:
        """(each run's output, the block's time in ns, the launching stream's time where known)."""
        outs = []
        t0 = time.perf_counter_ns()
        for fn in fns:
            outs.append(fn())
        return outs, time.perf_counter_ns() - t0, None


class DeviceEvents(Backend):
    """Events around the block with a whole-device synchronise inside the window.

    Subclasses bind `synchronize`, `new_event`, `record(event)`, `elapsed_ms(a, b)` and
    `flush_l2()` from their library."""

    synchronize: Callable[[], Any]
    new_event: Callable[[], Any]
    record: Callable[[Any], Any]
    elapsed_ms: Callable[[Any, Any], float]

    def sync(self) -> None:
        self.synchronize()

    def time_block(self, fns: list[Callable[[], Any]], mode: str) -> tuple[list[Any], int, int | None]:
        start, returned, end = self.new_event(), self.new_event(), self.new_event()
        outs: list[Any] = []
        self.synchronize()
        self.record(start)
        for fn in fns:
            outs.append(fn())
        self.record(returned)  # the launching stream only: for the record, misses other streams
        self.synchronize()  # whole device: work on other streams or left in flight is inside the window
        self.record(end)
        end.synchronize()
        return outs, int(self.elapsed_ms(start, end) * 1e6), int(self.elapsed_ms(start, returned) * 1e6)


class TorchCuda(DeviceEvents):
    name = "cuda_events+device_sync"

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.new_event = functools.partial(torch.cuda.Event, enable_timing=True)
        self.synchronize = torch.cuda.synchronize
        self.elapsed_ms = torch.cuda.Event.elapsed_time
        self.record = torch.cuda.Event.record
        self._scratch: Any = None

    def flush_l2(self) -> None:
        if self._scratch is None:
            self._scratch = self.torch.empty(L2_FLUSH_BYTES // 4, dtype=self.torch.int32, device="cuda")
        self._scratch.zero_()

    def capture(self, fns: list[Callable[[], Any]]) -> tuple[Callable[[], Any], list[Any]]:
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fns[0]()  # lazy handles (cuBLAS workspaces, a JIT's first launch) are made here, not captured
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # every run's output held while capturing: a freed one would let the graph's pool give its
        # memory to the next run, and one run's output would overwrite another's
        outs: list[Any] = []
        with torch.cuda.graph(graph):
            for fn in fns:
                outs.append(fn())
        torch.cuda.synchronize()
        return graph.replay, outs


class CupyCuda(DeviceEvents):
    name = "cupy_events+device_sync"

    def __init__(self) -> None:
        import cupy

        self.cupy = cupy
        self.new_event = cupy.cuda.Event
        self.synchronize = cupy.cuda.runtime.deviceSynchronize
        self.elapsed_ms = cupy.cuda.get_elapsed_time
        self.record = cupy.cuda.Event.record
        self._scratch: Any = None

    def flush_l2(self) -> None:
        if self._scratch is None:
            self._scratch = self.cupy.empty(L2_FLUSH_BYTES // 4, dtype=self.cupy.int32)
        self._scratch.fill(0)


def backend_for(device: str, timer: str = "auto") -> Backend:
    """perf_counter_ns on the CPU; on a GPU CUDA events through torch, or CuPy (`timer`; auto: torch
    when it sees a GPU, else CuPy)."""
    return choose(device, timer, (Backend, TorchCuda, CupyCuda))


def choose(device: str, timer: str, classes: tuple[Callable[[], B], Callable[[], B], Callable[[], B]]) -> B:
    """One of (CPU, torch, CuPy) `classes`, by device and timer: the rule the worker's clocks and the
    hand-written drivers' helper share."""
    cpu, torch_cls, cupy_cls = classes
    if timer not in TIMERS:
        raise ValueError(f"timer {timer!r}: one of {', '.join(TIMERS)}")
    if device != "cuda":
        return cpu()
    if timer in ("auto", "torch"):
        try:
            import torch

            if torch.cuda.is_available():
                return torch_cls()
        except ImportError:
            pass
        if timer == "torch":
            raise RuntimeError(
                "device cuda with timer torch, but torch with CUDA is not available in this container"
            )
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy_cls()
    except Exception:  # CuPy absent, or present with no usable device
        pass
    raise RuntimeError(
        f"device cuda requested but neither torch nor CuPy with CUDA is available (timer {timer})"
    )


class SmClock:
    """The SM clock from NVML inside the container (where the driver library is mounted); None off a GPU."""

    def __init__(self, device: str) -> None:
        self.handle: Any = None
        if device != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:
            self.handle = None

    def sm(self) -> int | None:
        if self.handle is None:
            return None
        try:
            return int(self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM))
        except Exception:
            return None
