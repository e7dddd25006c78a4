"""Host side of a measurement: schedule, mounts, the `measure` operation, its result."""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cko_perf.operations.protocol import DriverRequest, DriverResult, ScheduleItem, Subject, WorkerSlot
from cko_perf.operations.torchprof import ENV as TORCH_PROFILE_ENV

from ..errors import CkoError, Exit
from ..executor import LOCAL, Executor
from ..invocation import Outcome, Plan
from ..models import Ref
from ..sandbox import Mount
from ..store import Store, new_id
from ..workers import WorkerLaunch
from .records import RanOn, Snapshot, Target
from .requests import DriverCommand
from .snapshot import materialize, remove_tree

SUBJECT_ROOT = "/cko/subjects"


def paired_schedule(
    case_ids: list[str], ref: str, cand: str, pairs: int, seed: int, start_rep: int = 0
) -> tuple[list[ScheduleItem], list[str]]:
    """Randomised ABBA/BAAB blocks per case (seeded); pair i = (ref rep i, cand rep i)."""
    rng = random.Random(seed)
    items: list[ScheduleItem] = []
    blocks: list[str] = []
    for case in case_ids:
        i = start_rep
        end = start_rep + pairs
        while i < end:
            order = rng.choice(("ABBA", "BAAB"))
            blocks.append(order)
            first, second = (ref, cand) if order == "ABBA" else (cand, ref)
            items += [
                ScheduleItem(subject=first, case=case, rep=i),
                ScheduleItem(subject=second, case=case, rep=i),
            ]
            if i + 1 < end:
                items += [
                    ScheduleItem(subject=second, case=case, rep=i + 1),
                    ScheduleItem(subject=first, case=case, rep=i + 1),
                ]
            i += 2
    return items, blocks


@dataclass
class Measured:
    invocation: Ref
    result: DriverResult | None
    failure: dict[str, Any] | None
    processes: list[dict[str, Any]]
    telemetry: dict[str, Any] | None
    identity: Any
    state: str
    exit_code: int
    reason: str | None
    kept: dict[str, bytes] | None = None
    ran_on: RanOn | None = None


def pick_gpus(target: Target) -> list[str]:
    if not target.gpu.required:
        return []
    env = os.environ.get("CKO_GPUS")
    if env:
        return [g for g in env.split(",") if g]
    return [str(i) for i in range(max(1, target.gpu.count))]


WORKER_UIDS = range(61000, 61064)


def _driver_request(
    target: Target,
    subjects: dict[str, Snapshot],
    schedule: list[ScheduleItem],
    mode: str,
    seed: int,
    warmup: int | None,
    trusted: bool,
) -> DriverRequest:
    assert target.objective is not None and target.accuracy is not None
    ids = list(subjects)
    workers = (
        []
        if trusted
        else [WorkerSlot(subject=sid, uid=WORKER_UIDS[i], gid=WORKER_UIDS[i]) for i, sid in enumerate(ids)]
    )
    metrics = [target.objective.primary] + [c.metric for c in target.objective.constraints]
    return DriverRequest(
        mode=mode,  # type: ignore[arg-type]
        subjects=[Subject(id=sid, path=f"{SUBJECT_ROOT}/{sid}") for sid in ids],
        cases=target.cases,
        schedule=schedule,
        warmup=target.plan.warmup if warmup is None else warmup,
        metrics=metrics,
        accuracy=target.accuracy,
        seed=seed,
        device=target.device,  # type: ignore[arg-type]
        result_path="/tmp/unused",
        entry=target.entry,
        workers=workers,
        command_timeout_s=target.process_timeout_s,
        timing_mode=target.plan.timing.mode,
        runs_per_sample=target.plan.timing.runs_per_block or 1,
    )


def _mounts(
    store: Store,
    target: Target,
    subjects: dict[str, Snapshot],
    scratch: Path,
    req: DriverRequest,
    keep: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
) -> tuple[list[Mount], list[WorkerLaunch]]:
    """The supervisor's mounts and the workers' launches (`keep`, `extra_env`: a collection run's).

    Workers: the harness (the original without the files a variant may change) and their own
    subject. Harness-trusted: every subject mounted into the one container, as before."""
    assert target.original is not None and target.driver is not None
    trusted = not req.workers
    harness = materialize(
        store, target.original, scratch / "harness", leave_out=None if trusted else target.allowed_paths
    )
    mounts = [Mount(str(harness), "/cko/harness", read_only=True)]
    by_snap: dict[str, Path] = {}
    for sid, snap in subjects.items():
        if snap.sha256 not in by_snap:
            by_snap[snap.sha256] = materialize(store, snap, scratch / f"s-{snap.sha256[:16]}")
        if trusted:
            mounts.append(Mount(str(by_snap[snap.sha256]), f"{SUBJECT_ROOT}/{sid}", read_only=True))
    launches = []
    for w in req.workers:
        # a profiler's switch comes from the collector (`collect`), never from the Target's own env
        env = (
            {k: v for k, v in target.driver.env.items() if k != TORCH_PROFILE_ENV}
            | (extra_env or {})
            | {
                "CKO_ROLE": "worker",
                "CKO_SUBJECT": w.subject,
                "CKO_SUBJECT_PATH": "/cko/subject",
                "CKO_SOCKET": f"{req.ipc_dir}/sup.sock",
                "CKO_ENTRY": target.entry,
                "CKO_DEVICE": target.device,
                # the worker's uid has no passwd entry in the image (its root is read-only):
                # getpass.getuser(), which Inductor's and Triton's cache paths call, reads these first
                "USER": f"cko-worker-{w.uid}",
                "LOGNAME": f"cko-worker-{w.uid}",
            }
        )
        launches.append(
            WorkerLaunch(
                subject=w.subject,
                uid=w.uid,
                command=list(target.driver.command),
                env=env,
                keep=keep,
                mounts=[
                    Mount(str(harness), "/cko/harness", read_only=True),
                    Mount(str(by_snap[subjects[w.subject].sha256]), "/cko/subject", read_only=True),
                ],
            )
        )
    return mounts, launches


MEASURE_COMMAND = (
    "/opt/cko/bin/python",
    "-I",
    "-m",
    "operations",
    "measure",
    "--plan",
    "/cko/request/plan.json",
    "--out",
    "/cko/out",
)


def run_measurement(
    store: Store,
    target: Target,
    subjects: dict[str, Snapshot],
    schedule: list[ScheduleItem],
    *,
    mode: Literal["smoke", "measure"],
    seed: int,
    acquisition: str,
    label: str,
    parent: dict[str, Any],
    warmup: int | None = None,
    progress: Any = None,
    telemetry: bool = True,
    counters: bool = False,
    policy_path: str | None = None,
    keep: tuple[str, ...] = (),
    worker_env: dict[str, str] | None = None,
    executor: Executor = LOCAL,
) -> Measured:
    """One `measure` invocation: the supervisor's container plus one worker container per subject.

    The whole schedule (every pair) is one invocation, so one executor call: on a fleet too, the
    pairs are measured on one device. `acquisition` is accepted for old callers; every value means
    one worker per subject. A hand-written driver (driver.kind harness_trusted) runs as before,
    every subject in its process, and the result says so.
    """
    trusted = _measurable_driver(target).kind == "harness_trusted"
    scratch = store.scratch(new_id("mea"))
    try:
        req = _driver_request(target, subjects, schedule, mode, seed, warmup, trusted)
        mounts, launches = _mounts(store, target, subjects, scratch, req, keep, worker_env or {})
        mounts.append(_plan_mount(scratch, target, req, trusted))
        scratch.chmod(0o755)
        inv = Plan(
            op="measure",
            image=target.image,
            gpus=pick_gpus(target),
            gpu_mode=target.gpu.mode,
            command=list(MEASURE_COMMAND),
            mounts=mounts,
            timeout_s=target.timeout_s,
            memory=target.memory,
            label=label,
            workdir="/cko/harness",
            parent=parent,
            telemetry=telemetry,
            counters=counters,
            policy_path=policy_path,
            env={"CKO_KEEP_OUTPUTS": ",".join(keep)} if keep else {},
            workers=launches,
        )
        outcome = executor(store, inv, progress=progress, keep_outputs=True)
        try:
            return _read_back(store, outcome, keep)
        finally:
            outcome.close()
    finally:
        remove_tree(scratch)


def _measurable_driver(target: Target) -> DriverCommand:
    """The Target's driver; a diagnostic Target (no original, driver, accuracy or objective) has
    nothing to measure."""
    if (
        target.original is None
        or target.driver is None
        or target.accuracy is None
        or target.objective is None
    ):
        raise CkoError(
            "a diagnostic target cannot be measured",
            exit_code=Exit.BAD_REQUEST,
            code="diagnostic_target",
            field="target",
        )
    return target.driver


def _plan_mount(scratch: Path, target: Target, req: DriverRequest, trusted: bool) -> Mount:
    """The supervisor's plan (driver, boundary, request, process timeout), written read-only in
    scratch and mounted where `operations measure --plan` reads it."""
    assert target.driver is not None
    plan_doc = {
        "driver": {"command": target.driver.command, "cwd": "/cko/harness", "env": target.driver.env},
        "boundary": "harness_trusted" if trusted else "workers",
        "request": req.model_dump(mode="json"),
        "process_timeout_s": target.timeout_s if not trusted else target.process_timeout_s,
    }
    plan_dir = scratch / "plan"
    plan_dir.mkdir()
    (plan_dir / "plan.json").write_text(json.dumps(plan_doc))
    (plan_dir / "plan.json").chmod(0o444)
    plan_dir.chmod(0o555)
    return Mount(str(plan_dir / "plan.json"), "/cko/request/plan.json", read_only=True)


def _read_back(store: Store, outcome: Outcome, keep: tuple[str, ...]) -> Measured:
    doc = outcome.read_json("result.json") or {}
    res = outcome.result
    dr = None
    if isinstance(doc.get("driver_result"), dict):
        dr = DriverResult.model_validate(doc["driver_result"])
    failure = doc.get("failure")
    if failure is None and res.state != "succeeded":
        tail = (res.stderr_tail or "").strip()[-600:]
        failure = {
            "code": "invocation_" + res.state,
            "field": "invocation",
            "message": (res.reason or res.state) + (f"; stderr: {tail}" if tail else ""),
        }
    kept = {}
    for name in keep:
        path = outcome.output_path(name)
        if path is not None:
            kept[name] = path.read_bytes()
    ref = Ref(id=outcome.id, sha256=_result_sha(store, outcome.id))
    return Measured(
        invocation=ref,
        result=dr,
        failure=failure,
        processes=list(doc.get("processes") or []),
        telemetry=res.telemetry_summary,
        identity=res.identity,
        state=res.state,
        exit_code=res.exit_code,
        reason=res.reason,
        kept=kept,
        ran_on=ran_on(ref, outcome),
    )


def ran_on(ref: Ref, outcome: Outcome) -> RanOn:
    ident = outcome.result.identity
    where = outcome.where or {}
    return RanOn(
        invocation=ref,
        backend="fleet" if outcome.where else "local",
        host_id=ident.host.host_id if ident else None,
        fleet=where.get("fleet"),
        node_id=where.get("node_id"),
        hostname=where.get("hostname"),
        devices=[d.uuid for d in ident.devices] if ident else [],
    )


def _result_sha(store: Store, inv_id: str) -> str:
    from ..canonical import sha256_file

    return sha256_file(store.invocation_result(inv_id))
