"""`cko profile ncu|torch --collect`: run one subject of the Target's driver under a profiler in the sandbox.

The driver runs as in a measurement (same harness, same subject snapshot, same worker boundary: the
subject in its own worker container). For ncu the worker's command is wrapped by `ncu --csv --page
raw --clock-control none --target-processes all`; for torch the worker profiles its first timed
block with torch.profiler (operations/torchprof.py). The profiler writes under the worker's own
bounded /cko/out; only the named report comes back (runner/workers.py `keep`), stored as an object
of the collection invocation, and is parsed by the `profile-ncu` / `profile-torch` operation.
ncu runs as the container's non-root user with no capability. Where the host keeps counters to
admins (RmProfilingAdminOnly: 1, checked before anything starts; or ncu's ERR_NVGPUCTRPERM) the
collection is refused with code profiler_counters_restricted and the host-side fix, never zeros.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cko_perf.operations.protocol import ScheduleItem
from cko_perf.operations.torchprof import ENV as TORCH_PROFILE_ENV

from ..canonical import sha256_bytes
from ..errors import CkoError, Exit, bad_request, failed
from ..executor import LOCAL, Executor
from ..models import Closed, Ref
from ..operation import OperationRequest, run_operation
from ..store import Store, check_id
from . import ops
from .measure import Measured, run_measurement
from .records import Snapshot, Target, Variant
from .requests import DriverCommand


class CollectRequest(Closed):
    target: str | None = None
    subject: str = "original"  # "original" or a variant id
    case: str | None = None
    reps: int = 2
    ncu_args: list[str] = []
    timeout_s: float = 900.0


@dataclass(frozen=True)
class CollectOptions:
    """How a collection runs: its policy, the parse's memory limit, and where both invocations run
    (the collection and the parse go to the same executor: on a fleet, both on its nodes)."""

    policy_path: str | None = None
    parse_memory: str = "4g"
    executor: Executor = LOCAL


@dataclass(frozen=True)
class CollectRun:
    """How one tool wraps a collection run: the driver it runs, the report it keeps, the env it sets."""

    tool: str
    driver: DriverCommand
    report: str
    op: str  # the operation that parses the report
    env: dict[str, str] = field(default_factory=dict)
    counters: bool = False
    warmup: int = 0


NCU_REPORT = "ncu-raw.csv"
TORCH_REPORT = "torch-trace.json"
NSYS_REPORT = "nsys-report.sqlite"
NSYS_BASE = [
    "nsys",
    "profile",
    "--output",
    "/cko/out/nsys-report",
    "--force-overwrite",
    "true",
    "--export",
    "sqlite",
    "--trace",
    "cuda,nvtx,osrt",
    "--sample",
    "none",
]
NCU_BASE = [
    "ncu",
    "--csv",
    "--page",
    "raw",
    "--clock-control",
    "none",
    "--target-processes",
    "all",
    "--log-file",
    f"/cko/out/{NCU_REPORT}",
]


def _target(store: Store, req: CollectRequest, ncu: bool = False) -> tuple[Target, Ref]:
    """The Target to collect on: an optimisation Target (it has a driver and an original)."""
    t, tref = ops.get_target(store, req.target)
    ops._require_optimization(t)
    if req.ncu_args and not ncu:
        raise bad_request("ncu_args: only for ncu collection", field="ncu_args")
    return t, tref


def _subject(store: Store, t: Target, req: CollectRequest) -> tuple[Snapshot, str]:
    """The snapshot to profile and the case, both checked against the Target."""
    assert t.original is not None
    if req.subject == "original":
        snap = t.original
    else:
        check_id(req.subject, "subject")
        v, _ = store.get_record("variants", req.subject, Variant)
        if v.target.id != t.id:
            raise bad_request(
                f"subject: variant {req.subject} belongs to {v.target}, not {t.id}", field="subject"
            )
        snap = v.snapshot
    case = req.case or t.cases[0].id
    if case not in {c.id for c in t.cases}:
        raise bad_request(f"case: {case!r} is not a case of {t.id}", field="case")
    return snap, case


def _collect(
    store: Store,
    t: Target,
    tref: Ref,
    req: CollectRequest,
    run: CollectRun,
    progress: ops.Progress,
    opts: CollectOptions,
) -> tuple[Measured, Snapshot, bytes]:
    """Run one subject for `req.reps` blocks with `run` applied; the report it kept, or a coded failure."""
    snap, case = _subject(store, t, req)
    target = t.model_copy(
        update={"driver": run.driver, "timeout_s": req.timeout_s, "process_timeout_s": req.timeout_s}
    )
    items = [ScheduleItem(subject="profiled", case=case, rep=i) for i in range(req.reps)]
    progress(f"{run.tool}: {req.subject} case {case}, {req.reps} repetition(s)")
    m = run_measurement(
        store,
        target,
        {"profiled": snap},
        items,
        mode="smoke",
        seed=0,
        acquisition="isolated",
        label=f"{run.tool} {t.name}",
        parent={"target": tref.model_dump()},
        warmup=run.warmup,
        progress=progress,
        telemetry=False,
        counters=run.counters,
        policy_path=opts.policy_path,
        keep=(run.report,),
        worker_env=run.env,
        executor=opts.executor,
    )
    data = (m.kept or {}).get(run.report)
    if data is None:
        why = (m.failure or {}).get("message") or m.reason
        err = failed(f"{run.tool} wrote no report ({why})", code="no_report")
        err.detail = {"collection": m.invocation.model_dump(), "failure": m.failure}
        raise err
    return m, snap, data


def _parse(
    store: Store,
    t: Target,
    m: Measured,
    subject: tuple[str, Snapshot],
    run: CollectRun,
    data: bytes,
    tool_version: str | None,
    opts: CollectOptions,
) -> tuple[dict[str, Any], int]:
    """The kept report parsed by `run.op` in the cpu image, bound to the Target."""
    tmp = Path(tempfile.mkdtemp(prefix="cko-collect-"))
    try:
        (tmp / "report").write_bytes(data)
        args = ["--report", "/cko/in/report", *binding_args(store, t.id)]
        args += ["--bind-subject", subject[0], "--bind-snapshot", subject[1].sha256]
        if tool_version:
            args += ["--tool-version", tool_version]
        req = OperationRequest(
            op=run.op,
            args=args,
            inputs={"report": tmp / "report"},
            image="cpu",
            label=f"parse {run.op} {t.name}",
            parent={"collection": m.invocation.model_dump()},
            memory=opts.parse_memory,
            policy_path=opts.policy_path,
        )
        res = run_operation(store, req, opts.executor)
        return {"parse": {"invocation": res.invocation_id, "exit_code": res.exit_code}, "facts": res.doc}, (
            0 if res.exit_code == 0 else 1
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _bound(m: Measured, req: CollectRequest, snap: Snapshot, name: str, data: bytes) -> dict[str, Any]:
    """What the report is bound to: the collection, the Target's subject snapshot, the environment."""
    return {
        "collection": m.invocation.model_dump(),
        "state": m.state,
        "subject": {"id": req.subject, "snapshot_sha256": snap.sha256},
        "report": {"name": name, "sha256": sha256_bytes(data), "size": len(data)},
        "identity": m.identity.model_dump(mode="json") if m.identity else None,
    }


def _parsed_and_bound(
    store: Store,
    t: Target,
    m: Measured,
    req: CollectRequest,
    snap: Snapshot,
    run: CollectRun,
    data: bytes,
    tool_version: str | None,
    opts: CollectOptions,
) -> tuple[dict[str, Any], int]:
    """The answer of every collector: the report's binding and its facts, parsed by `run.op`."""
    parsed, code = _parse(store, t, m, (req.subject, snap), run, data, tool_version, opts)
    return _bound(m, req, snap, run.report, data) | parsed, code


def collect_ncu(
    store: Store,
    req: CollectRequest,
    progress: ops.Progress,
    opts: CollectOptions = CollectOptions(),
) -> tuple[dict[str, Any], int]:
    """Profile one subject under ncu, then parse its report (the parse in a container of `parse_memory`)."""
    t, tref = _target(store, req, ncu=True)
    assert t.driver is not None
    if t.image != "cuda":
        raise bad_request("target: ncu collection needs a Target on the cuda image", field="target")
    for a in req.ncu_args:
        if a.startswith("--log-file") or a in ("-o", "--export"):
            raise bad_request(f"ncu_args: {a} is set by cko", field="ncu_args")
    wrapped = t.driver.model_copy(update={"command": [*NCU_BASE, *req.ncu_args, *t.driver.command]})
    run = CollectRun(tool="ncu", driver=wrapped, report=NCU_REPORT, op="profile-ncu", counters=True, warmup=0)
    m, snap, data = _collect(store, t, tref, req, run, progress, opts)
    if b"ERR_NVGPUCTRPERM" in data:
        from ..policy import counters_refusal

        err = counters_refusal("ncu reported ERR_NVGPUCTRPERM")
        err.detail = {"collection": m.invocation.model_dump()}
        raise err
    tools = (m.identity.tools if m.identity else {}) or {}
    return _parsed_and_bound(store, t, m, req, snap, run, data, tools.get("ncu"), opts)


def collect_torch(
    store: Store,
    req: CollectRequest,
    progress: ops.Progress,
    opts: CollectOptions = CollectOptions(),
) -> tuple[dict[str, Any], int]:
    """One block of one subject under torch.profiler in its worker (operations/torchprof.py), the
    Chrome trace kept as an object of the collection, then parsed by `profile-torch`."""
    t, tref = _target(store, req)
    assert t.driver is not None
    run = CollectRun(
        tool="torch.profiler",
        driver=t.driver,
        report=TORCH_REPORT,
        op="profile-torch",
        env={TORCH_PROFILE_ENV: f"/cko/out/{TORCH_REPORT}"},
        warmup=1,  # compilation and caches settle before the profiled block
    )
    m, snap, data = _collect(store, t, tref, req, run, progress, opts)
    return _parsed_and_bound(store, t, m, req, snap, run, data, None, opts)


def collect_nsys(
    store: Store,
    req: CollectRequest,
    progress: ops.Progress,
    opts: CollectOptions = CollectOptions(),
) -> tuple[dict[str, Any], int]:
    """One subject's worker under `nsys profile`, its SQLite export kept and parsed by `profile-nsys`.

    Refused before anything runs (code nsys_unavailable) where the Target's frozen identity shows no
    nsys in its image: the cuda image leaves Nsight Systems out, and on the lent H200 nsys cannot
    finish a report at all (tests/fixtures/nsys/README.md)."""
    t, tref = _target(store, req)
    assert t.driver is not None
    tools = (t.identity.tools if t.identity else {}) or {}
    if not tools.get("nsys"):
        raise CkoError(
            f"target: the {t.image} image of {t.id} has no Nsight Systems (nsys not found when the Target "
            "was frozen); collect where nsys can finish a report and pass its export with "
            "`cko profile nsys --report F.sqlite`",
            exit_code=Exit.REFUSED,
            code="nsys_unavailable",
            field="target",
        )
    wrapped = t.driver.model_copy(update={"command": [*NSYS_BASE, *t.driver.command]})
    run = CollectRun(tool="nsys", driver=wrapped, report=NSYS_REPORT, op="profile-nsys", warmup=1)
    m, snap, data = _collect(store, t, tref, req, run, progress, opts)
    return _parsed_and_bound(store, t, m, req, snap, run, data, tools.get("nsys"), opts)


def binding_args(store: Store, target_id: str | None) -> list[str]:
    """--bind-* arguments for a parse operation from a Target's frozen identity."""
    if not target_id:
        return []
    t, _ref = ops.get_target(store, target_id)
    args = ["--bind-target", target_id]
    ident = t.identity
    if ident is None:
        return args
    dev = next((d for d in ident.devices if t.device in (d.uuid, str(d.index))), None)
    if dev is None and ident.devices:
        dev = ident.devices[0]
    if dev is not None:
        args += ["--bind-gpu-name", dev.name, "--bind-compute-capability", dev.compute_capability]
    if ident.driver_version:
        args += ["--bind-driver", ident.driver_version]
    return args


def load(path: Path) -> tuple[CollectRequest, Path]:
    return ops.load_request(path, CollectRequest)


__all__ = [
    "CollectOptions",
    "CollectRequest",
    "binding_args",
    "collect_ncu",
    "collect_nsys",
    "collect_torch",
    "json",
]
