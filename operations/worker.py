"""A measuring worker: one process per subject, in its own container, under its own uid.

It loads one subject, then serves the supervisor's commands (warm, run, fetch) until told to quit
or the socket closes. Everything here shares a process with the subject, so nothing here is
trusted: the subject may patch any of it. What makes a verdict trustworthy is outside this
process — the supervisor's clock around every block, the freezer that stops this container
whenever another subject is timed, the inputs and reference this process never sees, and the
outputs the supervisor checks itself. The worker's job is only to be fast and honest when the
subject is.
"""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from . import codec
from .compare import poison
from .refill import refill
from .timing import Backend, GraphUnsupported, backend_for
from .torchprof import BlockProfiler, from_env
from .wire import COMMAND, Capture, Drop, Fetch, Go, Hello, LineSocket, Ping, Quit, Reply, Run, Warm

CONNECT_TIMEOUT_S = 120.0


def _connect(path: str) -> LineSocket:
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return LineSocket(s)
        except OSError:
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _visible_gpus() -> list[str]:
    try:
        import pynvml

        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        out = []
        for i in range(n):
            u = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            out.append(u.decode() if isinstance(u, bytes) else str(u))
        return out
    except Exception:
        return []


class Worker:
    def __init__(
        self,
        run: Callable[[Any, Any], Any],
        make_inputs: Callable[..., Any],
        impl: Any,
        backend: Backend,
        device: str,
    ) -> None:
        self.run_fn = run
        self.make_inputs = make_inputs
        self.impl = impl
        self.backend = backend
        self.device = device
        self.last: Any = None
        # a Run with flush "supervisor", staged and waiting for its Go: (what the window runs, the
        # outputs a captured graph leaves, the staging's time)
        self.held: tuple[list[Callable[[], Any]], list[Any] | None, int] | None = None
        self.inputs: Any = None
        # graph mode: (each captured run's input buffers, replay, each run's output), for the next Run
        self.graph: tuple[list[Any], Callable[[], Any], list[Any]] | None = None
        self.profiler: BlockProfiler | None = from_env(device)  # collection runs only (torchprof.py)

    def _inputs(self, inputs_dir: str | None, params: dict[str, Any], seed: int) -> Any:
        if inputs_dir is not None:
            return codec.decode(Path(inputs_dir), max_bytes=1 << 40, device_ok=self.device == "cuda")
        value = self.make_inputs(params, np.random.default_rng(seed), self.device)
        poison(value)
        return value

    def warm(self, cmd: Warm) -> Reply:
        sources: list[tuple[str | None, int]] = (
            list(zip(cmd.inputs, cmd.seeds, strict=False)) if cmd.inputs else [(None, s) for s in cmd.seeds]
        )
        for inputs_dir, seed in sources:
            inputs = self._inputs(inputs_dir, dict(cmd.params), seed)
            for _ in range(max(1, cmd.runs)):
                self.run_fn(self.impl, inputs)
            self.backend.sync()
            del inputs
        if cmd.collect:
            gc.collect()
        return Reply(ok=True)

    def capture(self, cmd: Capture) -> Reply:
        """graph mode: capture the next block on decoy inputs (see wire.Capture), each run on decoys of
        its own; the capture's time is the subject's launch cost, reported apart as stage_ns of this
        untimed command."""
        self.graph = None
        gc.disable()
        try:
            s0 = time.perf_counter_ns()
            decoys = [self._inputs(None, dict(cmd.params), cmd.seed + i) for i in range(cmd.runs)]
            try:
                replay, outs = self.backend.capture([self._call(d) for d in decoys])
            except GraphUnsupported:
                raise
            except Exception as exc:
                raise RuntimeError(
                    f"graph mode: the subject cannot be captured as a CUDA graph ({type(exc).__name__}: "
                    f"{exc}); time it in hot mode"
                ) from exc
            self.graph = (decoys, replay, outs)
        finally:
            gc.enable()
        return Reply(ok=True, stage_ns=time.perf_counter_ns() - s0)

    def _call(self, inputs: Any) -> Callable[[], Any]:
        return lambda: self.run_fn(self.impl, inputs)

    def _staged(self, cmd: Run) -> tuple[list[Callable[[], Any]], list[Any] | None]:
        """(what the window runs, the outputs a captured graph leaves) with the block's inputs staged."""
        dirs: list[str | None] = list(cmd.inputs) or [None] * len(cmd.seeds)
        if cmd.mode != "graph":
            self.inputs = sets = [
                self._inputs(d, dict(cmd.params), s) for d, s in zip(dirs, cmd.seeds, strict=True)
            ]
            if cmd.mode == "cold" and cmd.flush == "worker":
                self.backend.flush_l2()  # part of staging: it keeps the device busy right up to the window
            return [self._call(x) for x in sets], None
        if self.graph is None:
            raise RuntimeError("graph mode: no captured graph for this block (Capture must come first)")
        buffers, replay, outs = self.graph
        if len(buffers) != len(cmd.seeds):
            raise RuntimeError(f"graph mode: {len(buffers)} captured runs for a block of {len(cmd.seeds)}")
        for buf, d, seed in zip(buffers, dirs, cmd.seeds, strict=True):
            # the real inputs into the captured buffers, one set at a time: the replay reads them
            refill(buf, self._inputs(d, dict(cmd.params), seed))
        self.inputs, self.graph = buffers, None
        return [replay], outs

    def run(self, cmd: Run) -> Reply:
        """Stage and time one block. The outputs and inputs are kept until Fetch or Drop, so freeing
        them happens in an untimed command, not in the supervisor's bracket of the next block."""
        # No collection inside the staging, the window or the rest of this command: it stays off
        # until the Fetch or Drop that follows every block. Turned on here, the objects the window
        # made (a torch.compile call makes many) set the collector off at the reply's first
        # allocation, inside the supervisor's bracket and outside the claimed window: blocks whose
        # extra time the worker's own CPU explains, "longer than its claims", on a slower host.
        gc.disable()
        self.held = None
        s0 = time.perf_counter_ns()
        fns, captured = self._staged(cmd)
        self.backend.sync()
        stage = time.perf_counter_ns() - s0
        if cmd.mode == "cold" and cmd.flush == "supervisor":
            self.held = (fns, captured, stage)
            return Reply(ok=True, stage_ns=int(stage))
        return self._window(fns, captured, stage, cmd.mode)

    def go(self) -> Reply:
        """The window of the block the last Run staged and held (the supervisor evicted L2 meanwhile)."""
        if self.held is None:
            raise RuntimeError("go: no staged block waits for its window (a Run with flush supervisor first)")
        (fns, captured, stage), self.held = self.held, None
        return self._window(fns, captured, stage, "cold")

    def _window(
        self, fns: list[Callable[[], Any]], captured: list[Any] | None, stage: int, mode: str
    ) -> Reply:
        with self.profiler.around() if self.profiler is not None else contextlib.nullcontext():
            outs, t_ns, stream_ns = self.backend.time_block(fns, mode)
        self.last = outs if captured is None else captured
        return Reply(ok=True, t_ns=int(t_ns), stage_ns=int(stage), stream_ns=stream_ns)

    def fetch(self, cmd: Fetch) -> Reply:
        t0 = time.perf_counter_ns()
        if not isinstance(self.last, list) or not 0 <= cmd.run < len(self.last):
            raise RuntimeError(f"fetch: no run {cmd.run} in the last block")
        codec.encode(self.last[cmd.run], Path(cmd.out), host_only=True)
        return self.drop(t0)

    def drop(self, t0: int | None = None) -> Reply:
        """Free the block's output and inputs; its time here is reported (the supervisor's wall of this
        command minus it is the boundary's share: thaw, socket, idle probes)."""
        t0 = time.perf_counter_ns() if t0 is None else t0
        self.last = self.inputs = self.graph = self.held = None
        gc.collect(0)
        gc.enable()  # off since the Run (see run)
        return Reply(ok=True, busy_ns=time.perf_counter_ns() - t0)

    def handle(self, cmd: Any) -> Reply | None:
        if isinstance(cmd, Quit):
            return None
        if isinstance(cmd, Ping):
            return Reply(ok=True)
        try:
            if isinstance(cmd, Warm):
                return self.warm(cmd)
            if isinstance(cmd, Capture):
                return self.capture(cmd)
            if isinstance(cmd, Run):
                return self.run(cmd)
            if isinstance(cmd, Go):
                return self.go()
            if isinstance(cmd, Fetch):
                return self.fetch(cmd)
            if isinstance(cmd, Drop):
                return self.drop()
        except Exception as exc:  # the subject's failure, reported to the supervisor with its traceback tail
            tb = traceback.format_exc()[-2500:]
            return Reply(ok=False, error=f"{type(exc).__name__}: {exc}\n{tb}"[:4000])
        return Reply(ok=False, error=f"unknown command {type(cmd).__name__}")


def serve(
    make_inputs: Callable[..., Any],
    run: Callable[[Any, Any], Any],
    load: Callable[[str, str, str], Any],
    timer: str = "auto",
) -> int:
    """The worker's main loop (operations.driver.main with CKO_ROLE=worker)."""
    subject = os.environ["CKO_SUBJECT"]
    device = os.environ.get("CKO_DEVICE", "cpu")
    conn = _connect(os.environ["CKO_SOCKET"])
    t0 = time.monotonic()
    try:
        backend = backend_for(device, timer)
        impl = load(
            subject,
            os.environ.get("CKO_SUBJECT_PATH", "/cko/subject"),
            os.environ.get("CKO_ENTRY", "kernel.py"),
        )
    except Exception as exc:
        conn.send(Hello(subject=subject, pid=os.getpid(), error=f"{type(exc).__name__}: {exc}"[:2000]))
        return 1
    conn.send(
        Hello(subject=subject, pid=os.getpid(), gpus=_visible_gpus(), load_s=round(time.monotonic() - t0, 3))
    )
    worker = Worker(run, make_inputs, impl, backend, device)
    while True:
        try:
            line = conn.recv_line()
        except ConnectionError:
            return 0
        reply = worker.handle(COMMAND.validate_json(line))
        if reply is None:
            return 0
        conn.send(reply)
        sys.stdout.flush()
