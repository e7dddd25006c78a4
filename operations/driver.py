"""The workload-driver helper: a user writes three functions, `main()` does the rest.

    from operations.driver import main

    def make_inputs(case, rng, device):      # harness-owned: fresh inputs for one repetition
        ...
    def run(impl, inputs):                    # the timed call into the subject's code
        return impl.softmax(inputs["x"])
    def reference(case, inputs):              # harness-owned reference, in high precision
        ...

    if __name__ == "__main__":
        main(make_inputs=make_inputs, run=run, reference=reference)

What `main` does, so a candidate cannot game the numbers (README, threat model):
- fresh inputs for every repetition, seeded per (case, repetition) and recorded, identical for the
  subjects of one pair; an `out` buffer in the inputs is poisoned with NaN before every run;
- warm-up runs excluded; timing by CUDA events with a whole-device synchronise inside the window
  (work on other streams or left asynchronous is inside it), or perf_counter_ns on the CPU; an
  independent wall clock of the same window must agree with the event time; an event on the
  launching stream as the run returns records the stream's own time too (`stream_ns`, for the
  record only: the synchronise's round trip costs ~90 us a sample on the lent H200);
- the outputs of timed runs are checked: the first of each subject/case and a random share chosen
  only after the run returned; NaN/Inf never passes; relative L2 and max-abs error vs the reference;
- the timers and synchronisation functions are captured before subject code loads and checked
  after every run; threads or child processes left running by a run are violations;
- SM clock at the start and end of every timed block, where NVML is visible.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.util
import json
import os
import sys
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .checktally import CheckTally
from .compare import compare, poison, to_numpy  # noqa: F401  (re-exported for drivers)
from .protocol import (
    UNIT_SCALE_TO_NS,
    DriverRequest,
    DriverResult,
    ScheduleItem,
    Series,
)
from .timing import TIMERS, SmClock, choose  # noqa: F401  (TIMERS: part of the helper's surface)

_perf_ns = time.perf_counter_ns  # captured before any subject code is imported


def load_subject(subject_id: str, path: str, entry: str) -> types.ModuleType:
    """Import the subject's entry module under a package private to this subject.

    Two subjects with the same file names never share modules; sibling imports inside a
    subject must be relative (`from . import util`).
    """
    root = Path(path)
    target = root / entry
    if not target.is_file():
        raise FileNotFoundError(f"subject {subject_id}: {entry} not found in {path}")
    pkg_name = "cko_subject_" + "".join(c if c.isalnum() else "_" for c in subject_id)
    pkg = types.ModuleType(pkg_name)
    pkg.__path__ = [str(root)]
    sys.modules[pkg_name] = pkg
    mod_name = f"{pkg_name}.{target.stem}"
    spec = importlib.util.spec_from_file_location(mod_name, target)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {target}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    spec.loader.exec_module(module)
    return module


class _Backend:
    name = "perf_counter_ns"

    def sync(self) -> None:
        return None

    def time(self, fn: Callable[[], Any]) -> tuple[Any, int, int, int | None]:
        """(the run's result, the window's time, the wall clock of the window, the launching
        stream's time where the clock has one) in ns."""
        gc.collect()
        gc.disable()
        try:
            w0 = _perf_ns()
            out = fn()
            w1 = _perf_ns()
        finally:
            gc.enable()
        return out, w1 - w0, w1 - w0, None

    def guarded(self) -> dict[str, Any]:
        """The timing functions as the modules hold them now (compared with a copy taken at start)."""
        return {
            "time.perf_counter_ns": time.perf_counter_ns,
            "time.perf_counter": time.perf_counter,
            "time.monotonic_ns": time.monotonic_ns,
            "time.time_ns": time.time_ns,
        }


class _DeviceEvents(_Backend):
    """A GPU clock: events around the run, with a whole-device synchronise inside the window.

    Subclasses bind, before any subject code loads, `synchronize` (the whole device), `new_event`,
    `record(event)` and `elapsed_ms(start, end)` from their library.
    """

    synchronize: Callable[[], Any]
    new_event: Callable[[], Any]
    record: Callable[[Any], Any]
    elapsed_ms: Callable[[Any, Any], float]

    def sync(self) -> None:
        self.synchronize()

    def time(self, fn: Callable[[], Any]) -> tuple[Any, int, int, int | None]:
        start, returned, end = self.new_event(), self.new_event(), self.new_event()
        gc.collect()
        gc.disable()
        try:
            self.synchronize()
            w0 = _perf_ns()
            self.record(start)
            out = fn()
            # On the launching stream only: the run's own time, for the record (it misses other streams)
            self.record(returned)
            # Whole device: kernels on other streams or left in flight land inside the window.
            self.synchronize()
            self.record(end)
            end.synchronize()
            w1 = _perf_ns()
        finally:
            gc.enable()
        return (
            out,
            int(self.elapsed_ms(start, end) * 1e6),
            w1 - w0,
            int(self.elapsed_ms(start, returned) * 1e6),
        )


class _TorchCuda(_DeviceEvents):
    name = "cuda_events+device_sync"

    def __init__(self) -> None:
        import torch

        self.torch = torch
        event = torch.cuda.Event
        self.new_event = functools.partial(event, enable_timing=True)
        self.synchronize = torch.cuda.synchronize
        self.elapsed_ms = torch.cuda.Event.elapsed_time
        self.record = torch.cuda.Event.record

    def guarded(self) -> dict[str, Any]:
        torch = self.torch
        return super().guarded() | {
            "torch.cuda.synchronize": torch.cuda.synchronize,
            "torch.cuda.Event": torch.cuda.Event,
            "torch.cuda.Event.elapsed_time": torch.cuda.Event.elapsed_time,
            "torch.cuda.Event.record": torch.cuda.Event.record,
        }


class _CupyCuda(_DeviceEvents):
    """The same window with CuPy's events, for drivers that use CuPy and not torch."""

    name = "cupy_events+device_sync"

    def __init__(self) -> None:
        import cupy

        self.cupy = cupy
        self.new_event = cupy.cuda.Event  # timing is on by default
        self.synchronize = cupy.cuda.runtime.deviceSynchronize
        self.elapsed_ms = cupy.cuda.get_elapsed_time
        self.record = cupy.cuda.Event.record

    def guarded(self) -> dict[str, Any]:
        cupy = self.cupy
        return super().guarded() | {
            "cupy.cuda.runtime.deviceSynchronize": cupy.cuda.runtime.deviceSynchronize,
            "cupy.cuda.Event": cupy.cuda.Event,
            "cupy.cuda.Event.record": cupy.cuda.Event.record,
            "cupy.cuda.get_elapsed_time": cupy.cuda.get_elapsed_time,
        }


def _backend(device: str, timer: str = "auto") -> _Backend:
    """The worker's rule (operations/timing.py), with this helper's guarded clocks."""
    return choose(device, timer, (_Backend, _TorchCuda, _CupyCuda))


# Modules whose functions the harness, the timing and the accuracy check rely on: a subject that
# replaces any of their attributes (to fake a timer, a sync, or the reference's arithmetic) is caught.
GUARDED_MODULES = (
    "builtins",
    "time",
    "gc",
    "threading",
    "numpy",
    "numpy.linalg",
    "numpy.random",
    "math",
    "torch",
    "torch.cuda",
    "torch.linalg",
    "cupy",
    "operations.driver",
    "operations.protocol",
    "operations.timing",
)
# Classes whose methods the reference and the comparison call (`x.double()`, `t.cpu().numpy()`): a
# module's snapshot holds the class object, which stays the same when one of its methods is swapped.
GUARDED_CLASSES = (
    ("torch", "Tensor"),
    ("torch.cuda", "Event"),
    ("torch.cuda", "Stream"),
    ("cupy", "ndarray"),
)


def _guarded_classes() -> list[type]:
    out: list[type] = []
    for mod_name, cls_name in GUARDED_CLASSES:
        cls = getattr(sys.modules.get(mod_name), cls_name, None)
        if isinstance(cls, type):
            out += [c for c in cls.__mro__ if c is not object and c not in out]
    return out


def module_snapshot() -> dict[str, dict[str, Any]]:
    """The callables of the guarded modules and every attribute of the guarded classes (and their bases).

    The objects themselves are kept, not their ids: a replaced function that was freed could hand its
    id to the replacement.
    """
    snap: dict[str, dict[str, Any]] = {}
    for name in GUARDED_MODULES:
        mod = sys.modules.get(name)
        if mod is None:
            continue
        snap[name] = {k: v for k, v in list(vars(mod).items()) if callable(v)}
    for cls in _guarded_classes():
        snap[f"{cls.__module__}.{cls.__qualname__}"] = dict(vars(cls))
    return snap


def snapshot_changes(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> list[str]:
    """Names bound in `before` that are gone or bound to another object in `after`, and names added to a class."""
    out = []
    class_names = {k for owner, names in before.items() if owner not in GUARDED_MODULES for k in names}
    for owner, names in before.items():
        now = after.get(owner, {})
        for k, obj in names.items():
            if k not in now or now[k] is not obj:
                out.append(f"{owner}.{k}")
        if owner not in GUARDED_MODULES:  # a class: a name added to it may shadow a base class's method
            out += [f"{owner}.{k}" for k in now.keys() - names.keys() if k in class_names]
    return out


def _children() -> set[int]:
    kids: set[int] = set()
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as f:
                kids.update(int(p) for p in f.read().split())
    except OSError:
        pass
    return kids


def input_seed(base: int, case_index: int, rep: int, warm: bool = False) -> int:
    """Seed of one repetition's inputs: same for every subject of a pair, different per rep."""
    return int(np.random.SeedSequence([base, case_index, rep, 1 if warm else 0]).generate_state(1)[0])


def environment() -> dict[str, str]:
    env = {"python": sys.version.split()[0], "numpy": np.__version__}
    for name in ("torch", "triton", "cupy"):
        mod = sys.modules.get(name)
        if mod is not None and hasattr(mod, "__version__"):
            env[name] = str(mod.__version__)
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                env["cuda_runtime"] = str(torch.version.cuda)
                env["gpu"] = torch.cuda.get_device_name(0)
        except Exception:
            pass
    return env


@dataclass
class _Tally:
    """One subject's samples and checks on one case, in the harness-trusted path."""

    samples: dict[str, list[float]]
    reps: list[int] = field(default_factory=list)
    wall: list[int] = field(default_factory=list)
    sm: list[list[int | None]] = field(default_factory=list)
    stream: list[int] = field(default_factory=list)
    check: CheckTally = field(default_factory=CheckTally)


class _Watch:
    """What the subjects may not change in this process: the backend's guarded functions, the
    harness's modules, the thread and child counts. Each change is reported once."""

    def __init__(self, backend: _Backend) -> None:
        self.backend = backend
        self.guarded = backend.guarded()
        self.threads0 = threading.active_count()
        self.kids0 = _children()
        self.modules0 = module_snapshot()
        self.reported: set[str] = set()
        self.integrity: list[str] = []

    def _once(self, name: str, message: str) -> None:
        if name not in self.reported:
            self.reported.add(name)
            self.integrity.append(message)

    def check(self, where: str) -> None:
        now = self.backend.guarded()
        for name, fn in self.guarded.items():
            if now.get(name) is not fn:
                self._once(name, f"{where}: {name} was replaced during the run")
        for name in snapshot_changes(self.modules0, module_snapshot()):
            self._once(
                name, f"{where}: {name} was replaced (the harness's functions are not the subject's to patch)"
            )
        if threading.active_count() > self.threads0:
            self.integrity.append(
                f"{where}: {threading.active_count() - self.threads0} thread(s) left running after the run"
            )
        if _children() - self.kids0:
            self.integrity.append(f"{where}: child process(es) left running after the run")


class _InProcess:
    """The harness-trusted path: every subject loaded into this process, timed in schedule order."""

    def __init__(
        self,
        req: DriverRequest,
        make_inputs: Callable[..., Any],
        run: Callable[[Any, Any], Any],
        reference: Callable[[Any, Any], Any],
        load: Callable[[str, str, str], Any],
        extra: dict[str, tuple[str, Callable[[dict[str, Any], int], float]]],
        timer: str,
    ) -> None:
        self.req, self.make_inputs, self.run, self.reference = req, make_inputs, run, reference
        self.load, self.extra = load, extra
        self.units = _units(req, extra)
        self.backend = _backend(req.device, timer)
        self.clocks = SmClock(req.device)
        self.watch = _Watch(self.backend)
        self.cases = {c.id: c for c in req.cases}
        self.case_index = {c.id: i for i, c in enumerate(req.cases)}
        self.subjects = {s.id: s for s in req.subjects}
        self.impls: dict[str, Any] = {}
        self.per: dict[tuple[str, str], _Tally] = {}

    def inputs(self, case: str, rep: int, warm: bool = False) -> tuple[Any, int]:
        seed = input_seed(self.req.seed, self.case_index[case], rep, warm)
        value = self.make_inputs(self.cases[case].params, np.random.default_rng(seed), self.req.device)
        poison(value)
        return value, seed

    def impl(self, subject: str) -> Any:
        if subject not in self.impls:
            s = self.subjects[subject]
            self.impls[subject] = self.load(s.id, s.path, self.req.entry)
            self.watch.check(f"load {s.id}")
        return self.impls[subject]

    def tally(self, item: ScheduleItem, impl: Any) -> _Tally:
        """The subject's tally on this case; its warm-up runs (untimed) when it is first made."""
        key = (item.subject, item.case)
        if key not in self.per:
            self.per[key] = _Tally(samples={m.name: [] for m in self.req.metrics})
            for w in range(self.req.warmup):
                self.run(impl, self.inputs(item.case, w, warm=True)[0])
                self.backend.sync()
        return self.per[key]

    def timed(self, item: ScheduleItem) -> None:
        impl = self.impl(item.subject)
        st = self.tally(item, impl)
        inputs, seed = self.inputs(item.case, item.rep)
        self.backend.sync()
        sm0 = self.clocks.sm()
        out, t_ns, wall_ns, stream_ns = self.backend.time(functools.partial(self.run, impl, inputs))
        sm1 = self.clocks.sm()
        where = f"{item.subject}/{item.case}/rep {item.rep}"
        self.watch.check(where)
        if t_ns > wall_ns * 1.05 + 20_000 or (wall_ns > 1_000_000 and t_ns < 0.5 * wall_ns - 200_000):
            self.watch.integrity.append(
                f"{where}: event time {t_ns} ns and wall clock {wall_ns} ns of the same window disagree"
            )
        st.reps.append(item.rep)
        st.wall.append(int(wall_ns))
        if stream_ns is not None:
            st.stream.append(stream_ns)
        st.sm.append([sm0, sm1])
        params = self.cases[item.case].params
        for m in self.req.metrics:
            if m.name in self.extra:
                st.samples[m.name].append(float(self.extra[m.name][1](params, max(t_ns, 1))))
            else:
                st.samples[m.name].append(max(t_ns, 1) / UNIT_SCALE_TO_NS[m.unit])
        self.maybe_check(st, item, out, inputs, seed)

    def maybe_check(self, st: _Tally, item: ScheduleItem, out: Any, inputs: Any, seed: int) -> None:
        rule = self.req.accuracy
        if st.check.due(rule, self.req.mode == "smoke"):
            rel, mx, detail = compare(out, self.reference(self.cases[item.case].params, inputs))
            st.check.add(rule, item.rep, seed, rel, mx, detail)

    def result(self) -> DriverResult:
        series = [
            Series(
                subject=subject,
                case=case_id,
                reps=st.reps,
                samples=st.samples,
                wall_ns=st.wall,
                sm_mhz=st.sm,
                stream_ns=st.stream,
                accuracy=st.check.record(self.req.accuracy),
            )
            for (subject, case_id), st in self.per.items()
        ]
        return DriverResult(
            protocol=self.req.protocol,
            mode=self.req.mode,
            series=series,
            environment=environment(),
            units=self.units,
            integrity=self.watch.integrity,
            timing=self.backend.name,
        )


def drive(
    req: DriverRequest,
    make_inputs: Callable[..., Any],
    run: Callable[[Any, Any], Any],
    reference: Callable[[Any, Any], Any],
    load: Callable[[str, str, str], Any] | None = None,
    extra_metrics: dict[str, tuple[str, Callable[[dict[str, Any], int], float]]] | None = None,
    timer: str = "auto",
) -> DriverResult:
    """Follow the request's schedule and return the result (no I/O: `main` does that)."""
    path = _InProcess(req, make_inputs, run, reference, load or load_subject, extra_metrics or {}, timer)
    for item in req.schedule:
        path.timed(item)
    return path.result()


def _units(
    req: DriverRequest, extra: dict[str, tuple[str, Callable[[dict[str, Any], int], float]]]
) -> dict[str, str]:
    units: dict[str, str] = {}
    for m in req.metrics:
        if m.name in extra:
            units[m.name] = extra[m.name][0]
        elif m.unit in UNIT_SCALE_TO_NS:
            units[m.name] = m.unit
        else:
            raise ValueError(
                f"metric {m.name!r} ({m.unit}) is not a time metric and no extra_metrics function gives it"
            )
    return units


def main(
    make_inputs: Callable[..., Any],
    run: Callable[[Any, Any], Any],
    reference: Callable[[Any, Any], Any],
    load: Callable[[str, str, str], Any] | None = None,
    extra_metrics: dict[str, tuple[str, Callable[[dict[str, Any], int], float]]] | None = None,
    argv: list[str] | None = None,
    timer: str = "auto",
) -> int:
    """The driver's entry point; what it does depends on the role cko started this process in.

    - CKO_ROLE=worker: serve one subject to the supervisor (operations.worker); `run`, `load` and
      `make_inputs` (to regenerate GPU inputs from their seed) are used, `reference` never is.
    - CKO_ROLE=supervisor: own the inputs, reference and check, time every subject's worker
      (operations.supervisor); no subject code is ever imported here.
    - otherwise (a request with no workers): the harness-trusted path, every subject in this
      process (`drive`); records say so.
    `timer` picks the GPU clock: "torch" or "cupy" events, or "auto" (torch when it sees a GPU, else CuPy).
    """
    role = os.environ.get("CKO_ROLE", "")
    if role == "worker":
        from .worker import serve

        return serve(make_inputs, run, load or load_subject, timer)
    ap = argparse.ArgumentParser(description="cko workload driver (protocol cko/driver-v1)")
    ap.add_argument("request", nargs="?", default=os.environ.get("CKO_DRIVER_REQUEST"))
    args = ap.parse_args(argv)
    if not args.request:
        print("driver: no request (give a path or set CKO_DRIVER_REQUEST)", file=sys.stderr)
        return 2
    req = DriverRequest.model_validate_json(Path(args.request).read_bytes())
    extra = extra_metrics or {}
    if req.workers:
        if role != "supervisor":
            print(
                "driver: this request names workers; only cko's supervisor role may run it", file=sys.stderr
            )
            return 2
        from .supervisor import SupervisorError, supervise

        try:
            res = supervise(
                req,
                make_inputs,
                reference,
                extra,
                input_seed,
                _units(req, extra),
                environment,
                "cuda_events+device_sync" if req.device == "cuda" else "perf_counter_ns",
            )
        except SupervisorError as exc:  # a coded failure the measure operation reports as it is
            with open(req.result_path + ".failure", "w") as f:
                json.dump({"code": exc.code, "field": "subject", "message": str(exc)[:4000]}, f)
            print(f"cko supervisor: {exc.code}: {exc}", file=sys.stderr)
            return 1
    else:
        res = drive(req, make_inputs, run, reference, load=load, extra_metrics=extra_metrics, timer=timer)
    tmp = req.result_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res.model_dump(mode="json"), f)
    os.replace(tmp, req.result_path)
    return 0
