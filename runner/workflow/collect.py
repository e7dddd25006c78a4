"""`cko profile ncu --collect`: run the Target's driver under Nsight Compute in the sandbox.

The driver runs exactly as in a measurement (same harness, same subject snapshot, same protocol),
wrapped by `ncu --csv --page raw --clock-control none --target-processes all`; the CSV, the ncu
version and the log come back as objects and the CSV is parsed by the `profile-ncu` operation.
ncu runs as the container's non-root user with no capability. Where the host keeps counters to
admins (RmProfilingAdminOnly: 1, checked before anything starts; or ncu's ERR_NVGPUCTRPERM) the
collection is refused with code profiler_counters_restricted and the host-side fix, never zeros.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from operations.protocol import ScheduleItem

from ..errors import bad_request, failed
from ..models import Closed
from ..store import Store, check_id
from . import ops
from .measure import run_measurement
from .records import Variant


class CollectRequest(Closed):
    target: str | None = None
    subject: str = "original"  # "original" or a variant id
    case: str | None = None
    reps: int = 2
    ncu_args: list[str] = []
    timeout_s: float = 900.0


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
    "/cko/out/ncu-raw.csv",
]


def collect_ncu(
    store: Store,
    req: CollectRequest,
    progress: ops.Progress,
    policy_path: str | None = None,
    parse_memory: str = "4g",
) -> tuple[dict[str, Any], int]:
    """Profile one subject under ncu, then parse its report (the parse in a container of `parse_memory`)."""
    t, tref = ops.get_target(store, req.target)
    ops._require_optimization(t)
    assert t.original and t.driver
    if t.image != "cuda":
        raise bad_request("target: ncu collection needs a Target on the cuda image", field="target")
    if req.subject == "original":
        snap = t.original
    else:
        check_id(req.subject, "subject")
        v, _ = store.get_record("variants", req.subject, Variant)
        snap = v.snapshot
    case = req.case or t.cases[0].id
    if case not in {c.id for c in t.cases}:
        raise bad_request(f"case: {case!r} is not a case of {t.id}", field="case")
    for a in req.ncu_args:
        if a.startswith("--log-file") or a in ("-o", "--export"):
            raise bad_request(f"ncu_args: {a} is set by cko", field="ncu_args")
    wrapped = t.driver.model_copy(update={"command": [*NCU_BASE, *req.ncu_args, *t.driver.command]})
    target = t.model_copy(
        update={"driver": wrapped, "timeout_s": req.timeout_s, "process_timeout_s": req.timeout_s}
    )
    items = [ScheduleItem(subject="profiled", case=case, rep=i) for i in range(req.reps)]
    progress(f"ncu: {req.subject} case {case}, {req.reps} repetition(s)")
    m = run_measurement(
        store,
        target,
        {"profiled": snap},
        items,
        mode="smoke",
        seed=0,
        acquisition="isolated",
        label=f"ncu {t.name}",
        parent={"target": tref.model_dump()},
        warmup=0,
        progress=progress,
        telemetry=False,
        counters=True,
        policy_path=policy_path,
        keep=("ncu-raw.csv",),
    )
    csv = (m.kept or {}).get("ncu-raw.csv")
    doc: dict[str, Any] = {"collection": m.invocation.model_dump(), "state": m.state}
    if csv is None:
        if m.failure:
            doc["failure"] = m.failure
        raise failed(
            f"ncu wrote no report ({(m.failure or {}).get('message') or m.reason})", code="no_report"
        )
    tmp = Path(tempfile.mkdtemp(prefix="cko-ncu-"))
    try:
        (tmp / "report.csv").write_bytes(csv)
        text = csv.decode("utf-8", "replace")
        if "ERR_NVGPUCTRPERM" in text:
            from ..policy import counters_refusal

            err = counters_refusal("ncu reported ERR_NVGPUCTRPERM")
            err.detail = {"collection": m.invocation.model_dump()}
            raise err
        from ..operation import run_operation

        tools = (m.identity.tools if m.identity else {}) or {}
        args = ["--report", "/cko/in/report.csv"]
        if tools.get("ncu"):
            args += ["--tool-version", tools["ncu"]]
        res = run_operation(
            store=store,
            op="profile-ncu",
            args=args,
            inputs={"report.csv": tmp / "report.csv"},
            image="cpu",
            label=f"parse ncu {t.name}",
            parent={"collection": m.invocation.model_dump()},
            memory=parse_memory,
            policy_path=policy_path,
        )
        doc["parse"] = {"invocation": res.invocation_id, "exit_code": res.exit_code}
        doc["facts"] = res.doc
        return doc, 0 if res.exit_code == 0 else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load(path: Path) -> tuple[CollectRequest, Path]:
    return ops.load_request(path, CollectRequest)


__all__ = ["CollectRequest", "collect_ncu", "json"]
