"""The workflow operations behind `cko readiness|baseline|variant|experiment|champion|audit`.

Each validates everything first (exit 2, nothing written), runs its invocation(s), and commits
one derived record that names, by reference, every record and object it rests on.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from cko_perf.operations import stats
from cko_perf.operations.protocol import DriverResult, Series

from .. import gpu as gpumod
from ..errors import Exit, bad_request, failed
from ..executor import LOCAL, Executor
from ..identity import EnvironmentIdentity, compare, host_identity
from ..models import ObjectRef, Ref
from ..policy import parse_size
from ..records import InvocationResult
from ..store import Store, check_id, new_id
from . import analysis
from .common import (
    Progress,
    get_target,
    load_request,
    now,
    put_record,
    require_optimization,
    snapshot_by_sha,
    with_ids,
)
from .decide import under_load
from .loadin import window_load
from .measure import Measured, paired_schedule, run_measurement
from .records import Baseline, CaseBaseline, Snapshot, Target, Variant
from .requests import BaselineRequest, ReadinessRequest, StatsPlan, VariantRequest, max_runs, runs_for
from .snapshot import commit, load_manifest, manifest_of, scan, take

_put_record = put_record
_require_optimization = require_optimization


def _rel_inside(base: Path, rel: str, field: str) -> Path:
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts:
        raise bad_request(f"{field}: {rel!r} must be a relative path inside the workload", field=field)
    return base / p


# -- readiness ------------------------------------------------------------------------------


def readiness(
    store: Store, req: ReadinessRequest, base: Path, progress: Progress, executor: Executor = LOCAL
) -> tuple[dict[str, Any], int]:
    workload = (base / req.workload).resolve()
    if not workload.is_dir():
        raise bad_request(f"workload: {workload} is not a directory", field="workload")
    if req.mode == "diagnostic":
        return _diagnostic(store, req, base, workload)
    assert req.driver and req.objective and req.accuracy
    blockers = _workload_blockers(req, workload, executor)
    if blockers:
        return {"ready": False, "blockers": blockers}, int(Exit.FAILED)
    snap = take(store, workload, req.exclude)
    target = _new_target(store, req, snap)
    m = _smoke(store, target, req, progress, executor)
    blockers = _smoke_blockers(m, req.image)
    if blockers:
        return {"ready": False, "blockers": blockers, "smoke": m.invocation.model_dump()}, int(Exit.FAILED)
    target = target.model_copy(update={"identity": m.identity, "smoke": m.invocation, "ran_on": m.ran_on})
    cap = _run_cap(m, req)
    target = target.model_copy(update={"plan": _sized(store, target, req, progress, executor, cap)})
    ref = _put_record(store, "targets", target.id, target)
    return {
        "ready": True,
        "target": ref.model_dump(),
        "snapshot": snap.sha256,
        "smoke": m.invocation.model_dump(),
        "identity": m.identity.model_dump(mode="json") if m.identity else None,
        "ran_on": _ran_on_doc(m),
    }, int(Exit.DONE)


def _blocker(what: str, reason: str, step: str) -> dict[str, str]:
    return {"what": what, "reason": reason, "next_step": step}


def _workload_blockers(req: ReadinessRequest, workload: Path, executor: Executor) -> list[dict[str, str]]:
    """What keeps the workload from running at all: missing files, an image or GPU the executor lacks.
    A path that leaves the workload is a bad request, not a blocker."""
    assert req.driver
    _rel_inside(workload, req.entry, "entry")
    for i, p in enumerate(req.allowed_paths):
        _rel_inside(workload, p, f"allowed_paths[{i}]")
    blockers: list[dict[str, str]] = []
    if not (workload / req.entry).is_file():
        blockers.append(
            _blocker("entry", f"{req.entry} not found in {workload}", f"create {req.entry} or set entry")
        )
    for p in req.allowed_paths:
        if not (workload / p).is_file():
            blockers.append(
                _blocker("allowed_paths", f"{p} not found in {workload}", "list only files the original has")
            )
    script = next((c for c in req.driver.command[1:] if c.endswith(".py")), None)
    if script and not (workload / script).is_file():
        blockers.append(
            _blocker(
                "driver",
                f"driver script {script} not found in {workload}",
                "put the driver in the workload directory",
            )
        )
    return blockers + executor.preflight(req.image, max(1, req.gpu.count) if req.gpu.required else 0)


def _new_target(store: Store, req: ReadinessRequest, snap: Snapshot) -> Target:
    """The optimization Target the request describes, its request stored beside it (not yet recorded)."""
    request_obj = store.put_json(req)
    return Target(
        id=new_id("tgt"),
        name=req.name,
        mode="optimization",
        claim_layer=req.claim_layer,
        created_at=now(),
        original=snap,
        entry=req.entry,
        allowed_paths=req.allowed_paths,
        driver=req.driver,
        image=req.image,
        device=req.device,
        gpu=req.gpu,
        cases=req.cases,
        objective=req.objective,
        accuracy=req.accuracy,
        plan=req.plan,
        timeout_s=req.timeout_s,
        process_timeout_s=req.process_timeout_s,
        memory=req.memory,
        request=ObjectRef(sha256=request_obj["sha256"], size=request_obj["size"], name="readiness.json"),
    )


def _smoke(
    store: Store, target: Target, req: ReadinessRequest, progress: Progress, executor: Executor
) -> Measured:
    """Two samples of the original per case, to show it runs and passes its own checks."""
    assert target.original
    items = [it for c in req.cases for it in _reps("original", c.id, 2)]
    progress("readiness: two-sample smoke of the original")
    return run_measurement(
        store,
        target,
        {"original": target.original},
        items,
        mode="smoke",
        seed=0,
        acquisition=req.plan.acquisition,
        label=f"readiness {req.name}",
        parent={"readiness": req.name},
        warmup=min(1, req.plan.warmup),
        progress=progress,
        telemetry=False,
        executor=executor,
    )


def _smoke_blockers(m: Measured, image: str) -> list[dict[str, str]]:
    """What the smoke showed: a failed run, the original failing its accuracy rule, an integrity trip."""
    if m.failure:
        f = m.failure
        return [
            _blocker(
                "smoke",
                f"{f.get('code')}: {f.get('message')} (field {f.get('field')})",
                _smoke_step(f, image),
            )
        ]
    if m.result is None:
        return []
    blockers = [
        _blocker(
            "accuracy",
            f"original fails its own accuracy rule on case {s.case}: {s.accuracy.detail}",
            "fix the reference or loosen the tolerance",
        )
        for s in m.result.series
        if not s.accuracy.passed
    ]
    return blockers + [
        _blocker("integrity", v, "the original must not trip the driver's integrity checks")
        for v in m.result.integrity
    ]


SIZING_RUNS = 64  # a sizing block's runs: the window's fixed cost spread 64 ways


def _run_cap(m: Measured, req: ReadinessRequest) -> int:
    """The most runs a block may hold, from the smoke's largest case (one run's inputs and output)."""
    per_case = (m.result.calibration.get("run_bytes") if m.result else None) or {}
    largest = max((int(v) for v in per_case.values()), default=0)
    return max_runs(largest, req.device, parse_size(req.memory, "memory"))


def _sized(
    store: Store,
    target: Target,
    req: ReadinessRequest,
    progress: Progress,
    executor: Executor,
    cap: int = 1_000_000,
) -> StatsPlan:
    """The plan with hot blocks sized and frozen: a second smoke times SIZING_RUNS back-to-back runs
    per block (a one-run block carries the window's fixed cost, ~100-150 us on the H200, and would
    size a us-scale subject's blocks far too short), then runs = min_block_ms / the fastest case's
    per-run time, at most `cap` (each run holds its own inputs and output)."""
    plan = req.plan
    if plan.timing.mode == "cold" or plan.timing.runs_per_block is not None or target.original is None:
        return plan
    sizing = min(SIZING_RUNS, cap)
    probe = plan.model_copy(update={"timing": plan.timing.model_copy(update={"runs_per_block": sizing})})
    progress(f"readiness: sizing {plan.timing.mode} blocks ({sizing} runs per block)")
    m = run_measurement(
        store,
        target.model_copy(update={"plan": probe}),
        {"original": target.original},
        [it for c in req.cases for it in _reps("original", c.id, 2)],
        mode="smoke",
        seed=0,
        acquisition=plan.acquisition,
        label=f"readiness sizing {req.name}",
        parent={"readiness": req.name},
        warmup=0,
        progress=progress,
        telemetry=False,
        executor=executor,
    )
    walls = [w for s in (m.result.series if m.result else []) for w in s.wall_ns if w > 0]
    if m.failure or not walls:
        raise failed(
            f"readiness: the hot-block sizing smoke failed ({_measure_failure(m)})", code="sizing_failed"
        )
    runs = runs_for(plan.timing, min(walls) / sizing / 1e6, cap)
    if runs == cap and cap < 1_000_000:
        progress(
            f"readiness: {runs} runs per block, as many as a block's memory holds (each run has its own inputs)"
        )
    return plan.model_copy(update={"timing": plan.timing.model_copy(update={"runs_per_block": runs})})


def _smoke_step(f: dict[str, Any], image: str) -> str:
    """The cheapest next step: a module missing inside the container is the image's doing, not the driver's."""
    text = f"{f.get('message')} {f.get('detail') or ''}"
    mod = re.search(r"No module named '([A-Za-z0-9_.]+)'", text)
    if mod:
        top = mod.group(1).split(".")[0]
        if top == "torch" and image != "torch-cpu":
            return (
                f'image {image} has no torch: on CPU use "image": "torch-cpu" (cko images build torch-cpu), '
                "on a GPU the cuda image"
            )
        return (
            f"image {image} has no {top}: add it to a recipe (cko-images/NAME.yaml: base: cpu, packages: [{top}]), "
            "`cko images build NAME`, and name that image in the request"
        )
    return "fix the driver so it returns exactly the declared metrics, units and sample counts"


def _ran_on_doc(m: Measured) -> list[dict[str, Any]]:
    """Where it ran, as a list like an experiment's (one entry per measurement invocation)."""
    return [m.ran_on.model_dump(mode="json")] if m.ran_on else []


def _reps(subject: str, case: str, n: int, start: int = 0) -> list[Any]:
    from cko_perf.operations.protocol import ScheduleItem

    return [ScheduleItem(subject=subject, case=case, rep=i) for i in range(start, start + n)]


COLLECTED_NAMES = ("torch-trace.json", "ncu-raw.csv", "nsys-report.sqlite")


def collected_reports(store: Store, collections: list[str]) -> list[ObjectRef]:
    """The profiler reports kept by earlier collection invocations (already objects of the store)."""
    out: list[ObjectRef] = []
    for i, inv_id in enumerate(collections):
        field = f"collections[{i}]"
        check_id(inv_id, field)
        path = store.invocation_result(inv_id)
        if not path.is_file():
            raise bad_request(f"{field}: no invocation {inv_id} in this store", field=field)
        res = InvocationResult.model_validate_json(path.read_bytes())
        found = [o for o in res.outputs if o.name in COLLECTED_NAMES]
        if not found:
            raise bad_request(
                f"{field}: {inv_id} kept no profiler report (not a --collect run?)", field=field
            )
        out += found
    return out


def _diagnostic(
    store: Store, req: ReadinessRequest, base: Path, workload: Path
) -> tuple[dict[str, Any], int]:
    reports = []
    for i, r in enumerate(req.reports):
        p = base / r
        if not p.is_file():
            raise bad_request(f"reports[{i}]: {p} is not a file", field=f"reports[{i}]")
        ref = store.put_file(p)
        reports.append(ObjectRef(sha256=ref["sha256"], size=ref["size"], name=Path(r).name))
    reports += collected_reports(store, req.collections)
    hg = gpumod.host_gpus()
    identity = EnvironmentIdentity(
        host=host_identity(),
        driver_version=hg.driver_version,
        cuda_driver_version=hg.cuda_driver_version,
        devices=hg.devices,
    )
    request_obj = store.put_json(req)
    tid = new_id("tgt")
    target = Target(
        id=tid,
        name=req.name,
        mode="diagnostic",
        created_at=now(),
        image=req.image,
        device=req.device,
        gpu=req.gpu,
        plan=req.plan,
        timeout_s=req.timeout_s,
        process_timeout_s=req.process_timeout_s,
        memory=req.memory,
        identity=identity,
        reports=reports,
        request=ObjectRef(sha256=request_obj["sha256"], size=request_obj["size"], name="readiness.json"),
    )
    tref = _put_record(store, "targets", tid, target)
    return {
        "ready": True,
        "target": tref.model_dump(),
        "mode": "diagnostic",
        "note": "a diagnostic target binds reports only and can never carry a performance claim",
    }, 0


def _measure_failure(m: Measured) -> str:
    f = m.failure or {}
    return f"{f.get('code')}: {f.get('message')} (field {f.get('field')})"


# -- baseline -------------------------------------------------------------------------------


def baseline(
    store: Store, req: BaselineRequest, progress: Progress, executor: Executor = LOCAL
) -> tuple[dict[str, Any], int]:
    t, tref = get_target(store, req.target)
    _require_optimization(t)
    assert t.objective and t.original
    n = req.samples_per_case or t.plan.baseline_samples
    m_pairs = req.aa_pairs or t.plan.aa_pairs
    progress(f"baseline: {n} samples per case and {m_pairs} A/A pairs")
    m, result = _measure_baseline(
        store, t, tref, req, _baseline_schedule(t, n, m_pairs, req.seed), progress, executor
    )
    sm = analysis.series_map(result)
    cases = [_case_baseline(t, c.id, sm, req.seed) for c in t.cases]
    worst = max(cb.resolution_pct for cb in cases)
    ok = t.objective.min_effect_pct > worst
    note = _resolution_note(t, worst, ok)
    mismatch = compare(t.identity, m.identity) if t.identity and m.identity else []
    load = window_load(m.telemetry)
    loaded = under_load(load)
    if loaded is not None:
        note += f". {loaded.message}"
    rec = Baseline(
        id=new_id("bas"),
        target=tref,
        created_at=now(),
        invocation=m.invocation,
        seed=req.seed,
        samples_per_case=n,
        aa_pairs=m_pairs,
        cases=cases,
        resolution_pct=worst,
        min_effect_pct=t.objective.min_effect_pct,
        min_effect_resolvable=ok,
        note=note,
        identity_mismatch=mismatch,
        telemetry=m.telemetry,
        ran_on=m.ran_on,
        load=load,
        measured_under_load=loaded is not None,
        warnings=[loaded] if loaded else [],
    )
    ref = _put_record(store, "baselines", rec.id, rec)
    return _baseline_doc(ref, rec, m), 0


def _baseline_schedule(t: Target, n: int, m_pairs: int, seed: int) -> list[Any]:
    """Per case: n samples of the original, then m_pairs A/A pairs of the original against itself."""
    items = []
    for c in t.cases:
        items += _reps("original", c.id, n)
        sched, _ = paired_schedule([c.id], "aa-ref", "aa-cand", m_pairs, seed)
        items += sched
    return items


def _measure_baseline(
    store: Store,
    t: Target,
    tref: Ref,
    req: BaselineRequest,
    items: list[Any],
    progress: Progress,
    executor: Executor,
) -> tuple[Measured, DriverResult]:
    """Run the schedule; a failed measurement is an error (nothing is recorded)."""
    assert t.original
    m = run_measurement(
        store,
        t,
        {"original": t.original, "aa-ref": t.original, "aa-cand": t.original},
        items,
        mode="measure",
        seed=req.seed,
        acquisition=t.plan.acquisition,
        label=f"baseline {t.name}",
        parent={"target": tref.model_dump()},
        progress=progress,
        executor=executor,
    )
    if m.failure or m.result is None:
        raise failed(
            f"baseline measurement failed: {_measure_failure(m)} (invocation {m.invocation.id})",
            code="measurement_failed",
        )
    return m, m.result


def _case_baseline(t: Target, case: str, sm: dict[tuple[str, str], Series], seed: int) -> CaseBaseline:
    """One case's samples of the original, and the resolution its A/A pairs give at the target pairs."""
    assert t.objective
    prim = t.objective.primary
    aa_ref, aa_cand = sm[("aa-ref", case)], sm[("aa-cand", case)]
    kept, _ = analysis.kept_pairs(aa_ref, aa_cand, exclude_ramping=False)
    a, b = analysis.pairs_for(aa_ref, aa_cand, prim.name, kept)
    res = stats.resolution(
        a,
        b,
        direction=prim.direction,
        confidence=t.plan.confidence,
        seed=seed,
        resamples=t.plan.bootstrap_resamples,
        keep_pairs=True,
        metric=prim.name,
    )
    samples = sm[("original", case)].samples[prim.name]
    return CaseBaseline(
        case=case,
        samples=samples,
        unit=prim.unit,
        median=float(sorted(samples)[len(samples) // 2]),
        aa=res.model_dump(mode="json"),
        resolution_pct=res.resolution_pct_at(t.plan.target_pairs),
    )


def _resolution_note(t: Target, worst: float, ok: bool) -> str:
    """Whether the minimum effect stands above the worst case's A/A resolution, in words."""
    assert t.objective
    if ok:
        return (
            f"minimum effect {t.objective.min_effect_pct:g}% is above the A/A resolution {worst:.2f}% "
            f"at {t.plan.target_pairs} pairs"
        )
    return (
        f"minimum effect {t.objective.min_effect_pct:g}% is at or below the A/A resolution {worst:.2f}% at "
        f"{t.plan.target_pairs} pairs: this environment cannot confirm it (raise the minimum or the pairs)"
    )


def _baseline_doc(ref: Ref, rec: Baseline, m: Measured) -> dict[str, Any]:
    return {
        "baseline": ref.model_dump(),
        "resolution_pct": rec.resolution_pct,
        "min_effect_resolvable": rec.min_effect_resolvable,
        "note": rec.note,
        "measured_under_load": rec.measured_under_load,
        "warnings": [w.model_dump() for w in rec.warnings],
        "ran_on": _ran_on_doc(m),
        "cases": [
            {"case": cb.case, "median": cb.median, "unit": cb.unit, "resolution_pct": cb.resolution_pct}
            for cb in rec.cases
        ],
    }


# -- variant --------------------------------------------------------------------------------


def variant(store: Store, req: VariantRequest, base: Path) -> tuple[dict[str, Any], int]:
    t, tref = get_target(store, req.target)
    _require_optimization(t)
    assert t.original
    parent_sel = None
    if req.parent == "champion":
        from .champion import read_pointer

        ptr, _ = read_pointer(store, t.id)
        if ptr is None:
            raise bad_request("parent: no champion is selected for this target", field="parent")
        parent_snap = snapshot_by_sha(store, t, ptr.snapshot)
        parent_sel = ptr.selection
    else:
        parent_snap = t.original
    overlay = (base / req.path).resolve()
    files = scan(overlay, [], field="path")
    outside = [rel for rel, _, _ in files if rel not in t.allowed_paths]
    if outside:
        raise bad_request(
            f"path: the variant changes {', '.join(outside)}, outside allowed_paths "
            f"[{', '.join(t.allowed_paths)}]",
            field="path",
            code="outside_allowed_paths",
        )
    if not files:
        raise bad_request(f"path: {overlay} holds none of the allowed paths", field="path")
    parent_manifest = load_manifest(store, parent_snap)
    new = manifest_of(store, files)
    by_path = {f["path"]: f for f in parent_manifest["files"]}
    changed = [f["path"] for f in new["files"] if by_path.get(f["path"], {}).get("sha256") != f["sha256"]]
    for f in new["files"]:
        by_path[f["path"]] = f
    snap = commit(store, {"kind": "cko/snapshot-v1", "files": [by_path[k] for k in sorted(by_path)]})
    vid = new_id("var")
    rec = Variant(
        id=vid,
        target=tref,
        created_at=now(),
        parent=req.parent,
        parent_snapshot=parent_snap.sha256,
        parent_selection=parent_sel,
        snapshot=snap,
        changed=changed,
        claim=req.claim,
        identical_to_parent=not changed,
    )
    ref = _put_record(store, "variants", vid, rec)
    doc = {
        "variant": ref.model_dump(),
        "snapshot": snap.sha256,
        "changed": changed,
        "identical_to_parent": not changed,
    }
    if not changed:
        doc["note"] = "identical to its parent: experiments on it are A/A controls"
    return doc, 0


__all__ = [
    "Progress",
    "baseline",
    "get_target",
    "load_request",
    "now",
    "readiness",
    "snapshot_by_sha",
    "variant",
    "with_ids",
]
