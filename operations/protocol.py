"""The workload-driver protocol, version `cko/driver-v1` (DESIGN.md, Workload driver protocol).

cko writes a DriverRequest; the user's driver (usually through `operations.driver`) writes one
DriverResult. `validate_result` checks the result against the request and returns contract
errors, each with a code and the field that differs.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

PROTOCOL = "cko/driver-v1"
UNITS = ("ns", "us", "ms", "s", "bytes/s", "GB/s", "TFLOP/s", "GFLOP/s", "items/s", "bytes", "count", "ratio")
UNIT_SCALE_TO_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


class Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Metric(Closed):
    name: str = Field(pattern=r"^[a-z][a-z0-9_.]{0,63}$")
    unit: str
    direction: Literal["lower", "higher"] = "lower"

    @model_validator(mode="after")
    def _unit(self) -> Metric:
        if self.unit not in UNITS:
            raise ValueError(f"unit {self.unit!r} is not one of {', '.join(UNITS)}")
        return self


class Case(Closed):
    id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    params: dict[str, Any] = Field(default_factory=dict)


class Subject(Closed):
    id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    path: str  # where the subject's snapshot is mounted (read-only)


class ScheduleItem(Closed):
    subject: str
    case: str
    rep: int = Field(ge=0)


class AccuracyRule(Closed):
    """Accuracy gate: relative L2 error and max absolute error against the harness's reference."""

    rel_l2: float = Field(gt=0, le=1.0)
    max_abs: float | None = Field(default=None, gt=0)
    check_fraction: float = Field(default=0.25, gt=0, le=1.0)


class WorkerSlot(Closed):
    """One subject's worker: its own container and uid (DESIGN.md, Trust boundary)."""

    subject: str
    uid: int = Field(ge=1000, le=65533)
    gid: int = Field(ge=1000, le=65533)


class DriverRequest(Closed):
    protocol: str = PROTOCOL
    mode: Literal["smoke", "measure"]
    subjects: list[Subject] = Field(min_length=1)
    cases: list[Case] = Field(min_length=1)
    schedule: list[ScheduleItem] = Field(min_length=1)
    warmup: int = Field(default=1, ge=0, le=1000)
    metrics: list[Metric] = Field(min_length=1)
    accuracy: AccuracyRule
    seed: int = Field(ge=0)
    device: Literal["cpu", "cuda"] = "cpu"
    result_path: str
    entry: str = Field(default="kernel.py", description="module file in each subject snapshot to load")
    # The measuring boundary. Empty: the harness-trusted path (one process loads every subject).
    workers: list[WorkerSlot] = Field(default_factory=list)
    ipc_dir: str = "/dev/shm/cko"
    ctl_socket: str = "/cko/ctl/ctl.sock"
    runs_per_sample: int = Field(
        default=1, ge=1, le=1_000_000, description="back-to-back runs in one timed block"
    )
    timing_mode: Literal["cold", "hot", "graph"] = "cold"
    command_timeout_s: float = Field(default=300.0, gt=0, description="one worker command (a block, a fetch)")

    @model_validator(mode="after")
    def _refs(self) -> DriverRequest:
        if self.protocol != PROTOCOL:
            raise ValueError(f"unknown protocol version {self.protocol!r}; this is {PROTOCOL}")
        subjects = {s.id for s in self.subjects}
        cases = {c.id for c in self.cases}
        seen = set()
        for i, it in enumerate(self.schedule):
            if it.subject not in subjects:
                raise ValueError(f"schedule[{i}].subject {it.subject!r} is not a subject")
            if it.case not in cases:
                raise ValueError(f"schedule[{i}].case {it.case!r} is not a case")
            key = (it.subject, it.case, it.rep)
            if key in seen:
                raise ValueError(f"schedule[{i}] repeats {key}")
            seen.add(key)
        if self.timing_mode == "graph" and (self.device != "cuda" or not self.workers):
            raise ValueError("timing_mode graph needs device cuda and the worker boundary (workers)")
        if self.workers:
            slots = {w.subject for w in self.workers}
            if slots != subjects or len(slots) != len(self.workers):
                raise ValueError("workers must name each subject exactly once")
            if len({w.uid for w in self.workers}) != len(self.workers):
                raise ValueError("each worker needs its own uid")
        return self


class Accuracy(Closed):
    passed: bool
    checks: int = Field(ge=0)
    checked_reps: list[int] = Field(default_factory=list)
    worst_rel_l2: float | None = None
    worst_max_abs: float | None = None
    tolerance: dict[str, float | None] = Field(default_factory=dict)
    detail: str = ""
    input_seeds: list[int] = Field(default_factory=list)


class Series(Closed):
    subject: str
    case: str
    reps: list[int]
    samples: dict[str, list[float]]  # metric name -> one value per rep, in `reps` order
    wall_ns: list[int] = Field(default_factory=list)  # independent wall clock of the same windows
    # Device clocks only: from the window's start to an event recorded on the launching stream as the
    # run returned, before the whole-device synchronise. Not a sample: the window (samples) is what
    # counts; this shows what the synchronise's round trip adds to it (tests/gpu/README.md).
    stream_ns: list[int] = Field(default_factory=list)
    sm_mhz: list[list[int | None]] = Field(default_factory=list)  # [start, end] per rep, where known
    accuracy: Accuracy
    # The boundary's evidence, per rep (empty on the harness-trusted path):
    bracket_ns: list[int] = Field(default_factory=list)  # the supervisor's clock around the whole command
    stage_ns: list[int] = Field(default_factory=list)  # the worker's input staging, inside the bracket
    # the worker's claimed window per rep, whole block (all `runs`), before the per-run division;
    # held against bracket_ns by the verdict's clock rule (runner/workflow/clockcheck.py)
    window_ns: list[int] = Field(default_factory=list)
    idle_cpu_ns: list[int] = Field(default_factory=list)  # CPU time of the other (frozen) workers meanwhile
    post_cpu_ns: list[int] = Field(
        default_factory=list
    )  # this worker's CPU in the fetch/release after the block
    # Foreign load per block, read by the supervisor around the bracket (runner/workflow/loadin.py):
    foreign_cpu_cores: list[float] = Field(default_factory=list)  # host busy cores not this stage's
    foreign_gpu_contexts: list[int | None] = Field(default_factory=list)  # contexts not this stage's
    throttle: list[list[str] | None] = Field(default_factory=list)  # throttle reasons at the block's end
    void: list[str] = Field(default_factory=list)  # "" or why this rep's sample is void (its pair is dropped)
    runs: int = 1  # back-to-back runs per sample; samples are per run
    timing_mode: str = "cold"
    # graph mode: per rep, the worker's capture of the block's graph (the subject's CPU launch cost,
    # untimed by design: it is what graph replay takes out of a us-scale subject's time)
    capture_ns: list[int] = Field(default_factory=list)
    # who evicted the L2 before each cold window on a GPU: "supervisor" (from its own context, the
    # worker holding its staged block), "worker" (the worker's clock code: no supervisor probe),
    # "none" (hot and graph blocks, CPU stages), "" (records made before it was kept)
    l2_flush: Literal["supervisor", "worker", "none", ""] = ""


class DriverResult(Closed):
    protocol: str
    mode: Literal["smoke", "measure"]
    series: list[Series]
    environment: dict[str, str] = Field(default_factory=dict)
    units: dict[str, str] = Field(default_factory=dict)  # metric name -> unit, as the driver measured it
    integrity: list[str] = Field(default_factory=list)  # violations the helper detected
    timing: str = "unknown"  # how samples were timed: cuda_events+device_sync | perf_counter_ns
    # "workers": each subject in its own process, container and uid, frozen outside its windows, every
    # block bounded by the supervisor's clock. "harness_trusted": the subjects shared the harness's
    # process (a hand-written driver); nothing stops a candidate from steering that verdict.
    boundary: Literal["workers", "harness_trusted"] = "harness_trusted"
    workers: list[dict[str, Any]] = Field(default_factory=list)  # per subject: load time, GPUs seen, pid
    calibration: dict[str, Any] = Field(default_factory=dict)  # the supervisor's round-trip and probe figures


class ContractError(Closed):
    code: str
    field: str
    message: str


def validate_result(
    req: DriverRequest, res: DriverResult, subjects: list[str] | None = None
) -> list[ContractError]:
    """Every way `res` fails to answer `req` (empty = the contract holds)."""
    errs: list[ContractError] = []

    def e(code: str, field: str, msg: str) -> None:
        errs.append(ContractError(code=code, field=field, message=msg))

    if res.protocol != PROTOCOL:
        e("unknown_protocol", "protocol", f"result protocol {res.protocol!r}, expected {PROTOCOL}")
        return errs
    if res.mode != req.mode:
        e("wrong_mode", "mode", f"result mode {res.mode!r}, request {req.mode!r}")
    errs.extend(unit_check(req.metrics, res.units))
    for m in req.metrics:
        if m.name not in res.units:
            e("missing_unit", f"units.{m.name}", f"the driver did not say which unit {m.name!r} is in")
    want: dict[tuple[str, str], list[int]] = {}
    for it in req.schedule:
        if subjects is None or it.subject in subjects:
            want.setdefault((it.subject, it.case), []).append(it.rep)
    got = {(s.subject, s.case): s for s in res.series}
    metric_units = {m.name: m.unit for m in req.metrics}
    for key, reps in want.items():
        s = got.get(key)
        where = f"series[{key[0]}/{key[1]}]"
        if s is None:
            e("missing_subject", where, f"no samples for subject {key[0]!r} case {key[1]!r}")
            continue
        if sorted(s.reps) != sorted(reps):
            e("wrong_sample_count", f"{where}.reps", f"{len(s.reps)} repetitions, expected {len(reps)}")
        for name in metric_units:
            if name not in s.samples:
                e("missing_metric", f"{where}.samples.{name}", f"metric {name!r} missing")
                continue
            vals = s.samples[name]
            if len(vals) != len(reps):
                e(
                    "wrong_sample_count",
                    f"{where}.samples.{name}",
                    f"{len(vals)} samples, expected {len(reps)}",
                )
            bad = [v for v in vals if not isinstance(v, int | float) or not math.isfinite(v)]
            if bad:
                e("non_finite", f"{where}.samples.{name}", f"{len(bad)} non-finite sample(s)")
            elif any(v <= 0 for v in vals) and metric_units[name] in UNIT_SCALE_TO_NS:
                e("non_positive", f"{where}.samples.{name}", "a time sample is zero or negative")
        if s.stream_ns and len(s.stream_ns) != len(s.reps):
            e(
                "wrong_sample_count",
                f"{where}.stream_ns",
                f"{len(s.stream_ns)} stream times, expected {len(s.reps)}",
            )
        extra = set(s.samples) - set(metric_units)
        for name in sorted(extra):
            e("unknown_metric", f"{where}.samples.{name}", f"metric {name!r} was not declared")
    for key in set(got) - set(want):
        e("unexpected_series", f"series[{key[0]}/{key[1]}]", "series for a subject/case not in the schedule")
    return errs


def unit_check(declared: list[Metric], reported_units: dict[str, str]) -> list[ContractError]:
    out = []
    for m in declared:
        u = reported_units.get(m.name)
        if u is not None and u != m.unit:
            out.append(
                ContractError(
                    code="wrong_unit",
                    field=f"metrics.{m.name}.unit",
                    message=f"driver reports {u!r}, Target declares {m.unit!r}",
                )
            )
    return out


_SERIES_LISTS = (
    "reps",
    "wall_ns",
    "stream_ns",
    "sm_mhz",
    "bracket_ns",
    "stage_ns",
    "window_ns",
    "idle_cpu_ns",
    "post_cpu_ns",
    "foreign_cpu_cores",
    "foreign_gpu_contexts",
    "throttle",
    "void",
)


def merge_results(parts: list[DriverResult]) -> DriverResult:
    """Results of consecutive looks of one stage as one result (series concatenated per subject/case)."""
    if len(parts) == 1:
        return parts[0]
    by: dict[tuple[str, str], list[Series]] = {}
    for p in parts:
        for s in p.series:
            by.setdefault((s.subject, s.case), []).append(s)
    merged = []
    for ss in by.values():
        first = ss[0]
        acc = first.accuracy.model_copy(
            update={
                "passed": all(s.accuracy.passed for s in ss),
                "checks": sum(s.accuracy.checks for s in ss),
                "checked_reps": [r for s in ss for r in s.accuracy.checked_reps],
                "input_seeds": [r for s in ss for r in s.accuracy.input_seeds],
                "worst_rel_l2": max(
                    (s.accuracy.worst_rel_l2 for s in ss if s.accuracy.worst_rel_l2 is not None), default=None
                ),
                "worst_max_abs": max(
                    (s.accuracy.worst_max_abs for s in ss if s.accuracy.worst_max_abs is not None),
                    default=None,
                ),
                "detail": "; ".join(s.accuracy.detail for s in ss if s.accuracy.detail)[:1000],
            }
        )
        lists: dict[str, Any] = {k: [v for s in ss for v in getattr(s, k)] for k in _SERIES_LISTS}
        samples = {k: [v for s in ss for v in s.samples.get(k, [])] for k in first.samples}
        merged.append(first.model_copy(update=lists | {"samples": samples, "accuracy": acc}))
    first_p = parts[0]
    return first_p.model_copy(update={"series": merged, "integrity": [i for p in parts for i in p.integrity]})
