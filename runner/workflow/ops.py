"""The workflow operations behind `cko readiness|baseline|variant|experiment|champion|audit`.

Each validates everything first (exit 2, nothing written), runs its invocation(s), and commits
one derived record that names, by reference, every record and object it rests on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from operations import stats

from .. import gpu as gpumod
from ..canonical import canonical_bytes, sha256_bytes, sha256_file
from ..errors import CkoError, Exit, bad_request, failed, pydantic_error
from ..executor import LOCAL, Executor
from ..identity import EnvironmentIdentity, compare, host_identity
from ..models import ObjectRef, Ref
from ..store import Store, check_id, new_id
from . import analysis
from .measure import Measured, paired_schedule, run_measurement
from .records import (
    Baseline,
    CaseBaseline,
    ChampionPointer,
    Experiment,
    RanOn,
    Selection,
    Snapshot,
    Target,
    Variant,
)
from .requests import BaselineRequest, ExperimentRequest, ReadinessRequest, VariantRequest
from .snapshot import commit, load_manifest, manifest_of, scan, take

R = TypeVar("R", bound=BaseModel)
Progress = Callable[[str], None]


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def load_request(path: Path, cls: type[R]) -> tuple[R, Path]:
    from ..cliutil import load_json_file

    doc = load_json_file(path, "request")
    if not isinstance(doc, dict):
        raise bad_request("request: must be a JSON object", field="request")
    try:
        return cls.model_validate(doc), Path(path).absolute().parent
    except ValidationError as exc:
        raise pydantic_error(exc, f"request {path}") from None


def with_ids(req: R, **ids: str | None) -> R:
    """Fill ids given on the command line (--target, --variant) into a request."""
    update = {k: v for k, v in ids.items() if v is not None}
    for k, v in update.items():
        check_id(v, k)  # type: ignore[arg-type]
    return req.model_copy(update=update) if update else req


def get_target(store: Store, target_id: str | None) -> tuple[Target, Ref]:
    if not target_id:
        raise bad_request("target: give --target ID or a target field in the request", field="target")
    check_id(target_id, "target")
    t, ref = store.get_record("targets", target_id, Target)
    return t, Ref(**ref)


def _put_record(store: Store, kind: str, rid: str, model: BaseModel) -> Ref:
    with store.writer():
        return Ref(**store.put_record(kind, rid, model))


def _rel_inside(base: Path, rel: str, field: str) -> Path:
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts:
        raise bad_request(f"{field}: {rel!r} must be a relative path inside the workload", field=field)
    return base / p


# -- readiness ------------------------------------------------------------------------------

def readiness(store: Store, req: ReadinessRequest, base: Path, progress: Progress,
              executor: Executor = LOCAL) -> tuple[dict[str, Any], int]:
    workload = (base / req.workload).resolve()
    if not workload.is_dir():
        raise bad_request(f"workload: {workload} is not a directory", field="workload")
    if req.mode == "diagnostic":
        return _diagnostic(store, req, base, workload)
    assert req.driver and req.objective and req.accuracy
    _rel_inside(workload, req.entry, "entry")
    for i, p in enumerate(req.allowed_paths):
        _rel_inside(workload, p, f"allowed_paths[{i}]")
    blockers: list[dict[str, str]] = []

    def block(what: str, reason: str, step: str) -> None:
        blockers.append({"what": what, "reason": reason, "next_step": step})

    if not (workload / req.entry).is_file():
        block("entry", f"{req.entry} not found in {workload}", f"create {req.entry} or set entry")
    for p in req.allowed_paths:
        if not (workload / p).is_file():
            block("allowed_paths", f"{p} not found in {workload}", "list only files the original has")
    script = next((c for c in req.driver.command[1:] if c.endswith(".py")), None)
    if script and not (workload / script).is_file():
        block("driver", f"driver script {script} not found in {workload}", "put the driver in the workload directory")
    blockers += executor.preflight(req.image, max(1, req.gpu.count) if req.gpu.required else 0)
    if blockers:
        return {"ready": False, "blockers": blockers}, int(Exit.FAILED)
    snap = take(store, workload, req.exclude)
    request_obj = store.put_json(req)
    tid = new_id("tgt")
    target = Target(id=tid, name=req.name, mode="optimization", created_at=now(), original=snap, entry=req.entry,
                    allowed_paths=req.allowed_paths, driver=req.driver, image=req.image, device=req.device,
                    gpu=req.gpu, cases=req.cases, objective=req.objective, accuracy=req.accuracy, plan=req.plan,
                    timeout_s=req.timeout_s, process_timeout_s=req.process_timeout_s, memory=req.memory,
                    request=ObjectRef(sha256=request_obj["sha256"], size=request_obj["size"], name="readiness.json"))
    items = [it for c in req.cases for it in _reps("original", c.id, 2)]
    progress("readiness: two-sample smoke of the original")
    m = run_measurement(store, target, {"original": snap}, items, mode="smoke", seed=0,
                        acquisition=req.plan.acquisition, label=f"readiness {req.name}",
                        parent={"readiness": req.name}, warmup=min(1, req.plan.warmup), progress=progress,
                        telemetry=False, executor=executor)
    if m.failure:
        f = m.failure
        block("smoke", f"{f.get('code')}: {f.get('message')} (field {f.get('field')})",
              "fix the driver so it returns exactly the declared metrics, units and sample counts")
    elif m.result is not None:
        for s in m.result.series:
            if not s.accuracy.passed:
                block("accuracy", f"original fails its own accuracy rule on case {s.case}: {s.accuracy.detail}",
                      "fix the reference or loosen the tolerance")
        for v in m.result.integrity:
            block("integrity", v, "the original must not trip the driver's integrity checks")
    if blockers:
        return {"ready": False, "blockers": blockers, "smoke": m.invocation.model_dump()}, int(Exit.FAILED)
    target = target.model_copy(update={"identity": m.identity, "smoke": m.invocation, "ran_on": m.ran_on})
    ref = _put_record(store, "targets", tid, target)
    return {"ready": True, "target": ref.model_dump(), "snapshot": snap.sha256, "smoke": m.invocation.model_dump(),
            "identity": m.identity.model_dump(mode="json") if m.identity else None,
            "ran_on": _ran_on_doc(m)}, int(Exit.DONE)


def _ran_on_doc(m: Measured) -> dict[str, Any] | None:
    return m.ran_on.model_dump(mode="json") if m.ran_on else None


def _reps(subject: str, case: str, n: int, start: int = 0) -> list[Any]:
    from operations.protocol import ScheduleItem

    return [ScheduleItem(subject=subject, case=case, rep=i) for i in range(start, start + n)]


def _diagnostic(store: Store, req: ReadinessRequest, base: Path, workload: Path) -> tuple[dict[str, Any], int]:
    reports = []
    for i, r in enumerate(req.reports):
        p = base / r
        if not p.is_file():
            raise bad_request(f"reports[{i}]: {p} is not a file", field=f"reports[{i}]")
        ref = store.put_file(p)
        reports.append(ObjectRef(sha256=ref["sha256"], size=ref["size"], name=Path(r).name))
    hg = gpumod.host_gpus()
    identity = EnvironmentIdentity(host=host_identity(), driver_version=hg.driver_version,
                                   cuda_driver_version=hg.cuda_driver_version, devices=hg.devices)
    request_obj = store.put_json(req)
    tid = new_id("tgt")
    target = Target(id=tid, name=req.name, mode="diagnostic", created_at=now(), image=req.image, device=req.device,
                    gpu=req.gpu, plan=req.plan, timeout_s=req.timeout_s, process_timeout_s=req.process_timeout_s,
                    memory=req.memory, identity=identity, reports=reports,
                    request=ObjectRef(sha256=request_obj["sha256"], size=request_obj["size"], name="readiness.json"))
    tref = _put_record(store, "targets", tid, target)
    return {"ready": True, "target": tref.model_dump(), "mode": "diagnostic",
            "note": "a diagnostic target binds reports only and can never carry a performance claim"}, 0


def _require_optimization(t: Target) -> None:
    if t.mode != "optimization":
        raise CkoError(f"target {t.id} is diagnostic: it binds reports only and can carry no performance claim",
                       exit_code=Exit.BAD_REQUEST, code="diagnostic_target", field="target")


def _measure_failure(m: Measured) -> str:
    f = m.failure or {}
    return f"{f.get('code')}: {f.get('message')} (field {f.get('field')})"


# -- baseline -------------------------------------------------------------------------------

def baseline(store: Store, req: BaselineRequest, progress: Progress,
             executor: Executor = LOCAL) -> tuple[dict[str, Any], int]:
    t, tref = get_target(store, req.target)
    _require_optimization(t)
    assert t.objective and t.original
    n = req.samples_per_case or t.plan.baseline_samples
    m_pairs = req.aa_pairs or t.plan.aa_pairs
    items = []
    for c in t.cases:
        items += _reps("original", c.id, n)
        sched, _ = paired_schedule([c.id], "aa-ref", "aa-cand", m_pairs, req.seed)
        items += sched
    progress(f"baseline: {n} samples per case and {m_pairs} A/A pairs")
    m = run_measurement(store, t, {"original": t.original, "aa-ref": t.original, "aa-cand": t.original}, items,
                        mode="measure", seed=req.seed, acquisition=t.plan.acquisition, label=f"baseline {t.name}",
                        parent={"target": tref.model_dump()}, progress=progress, executor=executor)
    if m.failure or m.result is None:
        raise failed(f"baseline measurement failed: {_measure_failure(m)} (invocation {m.invocation.id})",
                     code="measurement_failed")
    sm = analysis.series_map(m.result)
    prim = t.objective.primary
    cases = []
    for c in t.cases:
        s = sm[("original", c.id)]
        aa_ref, aa_cand = sm[("aa-ref", c.id)], sm[("aa-cand", c.id)]
        kept, _ = analysis.kept_pairs(aa_ref, aa_cand, exclude_ramping=False)
        a, b = analysis.pairs_for(aa_ref, aa_cand, prim.name, kept)
        res = stats.resolution(a, b, direction=prim.direction, confidence=t.plan.confidence, seed=req.seed,
                               resamples=t.plan.bootstrap_resamples, keep_pairs=True, metric=prim.name)
        r_at = res.resolution_pct_at(t.plan.target_pairs)
        samples = s.samples[prim.name]
        cases.append(CaseBaseline(case=c.id, samples=samples, unit=prim.unit, median=float(sorted(samples)[len(samples) // 2]),
                                  aa=res.model_dump(mode="json"), resolution_pct=r_at))
    worst = max(cb.resolution_pct for cb in cases)
    ok = t.objective.min_effect_pct > worst
    note = (f"minimum effect {t.objective.min_effect_pct:g}% is above the A/A resolution {worst:.2f}% "
            f"at {t.plan.target_pairs} pairs" if ok else
            f"minimum effect {t.objective.min_effect_pct:g}% is at or below the A/A resolution {worst:.2f}% at "
            f"{t.plan.target_pairs} pairs: this environment cannot confirm it (raise the minimum or the pairs)")
    mismatch = compare(t.identity, m.identity) if t.identity and m.identity else []
    bid = new_id("bas")
    rec = Baseline(id=bid, target=tref, created_at=now(), invocation=m.invocation, seed=req.seed, samples_per_case=n,
                   aa_pairs=m_pairs, cases=cases, resolution_pct=worst, min_effect_pct=t.objective.min_effect_pct,
                   min_effect_resolvable=ok, note=note, identity_mismatch=mismatch, telemetry=m.telemetry,
                   ran_on=m.ran_on)
    ref = _put_record(store, "baselines", bid, rec)
    return {"baseline": ref.model_dump(), "resolution_pct": worst, "min_effect_resolvable": ok, "note": note,
            "ran_on": _ran_on_doc(m),
            "cases": [{"case": cb.case, "median": cb.median, "unit": cb.unit, "resolution_pct": cb.resolution_pct}
                      for cb in cases]}, 0


# -- variant --------------------------------------------------------------------------------

def champion_state(store: Store, t: Target) -> tuple[ChampionPointer | None, str | None]:
    p = store.champion_path
    if not p.is_file():
        return None, None
    ptr = ChampionPointer.model_validate_json(p.read_bytes())
    if ptr.target.id != t.id:
        return None, sha256_file(p)
    return ptr, sha256_file(p)


def snapshot_by_sha(store: Store, t: Target, sha: str) -> Snapshot:
    assert t.original
    if sha == t.original.sha256:
        return t.original
    for vid in store.list_records("variants"):
        v, _ = store.get_record("variants", vid, Variant)
        if v.snapshot.sha256 == sha:
            return v.snapshot
    raise failed(f"snapshot {sha[:16]} is not in the store", code="missing_snapshot")


def variant(store: Store, req: VariantRequest, base: Path) -> tuple[dict[str, Any], int]:
    t, tref = get_target(store, req.target)
    _require_optimization(t)
    assert t.original
    parent_sel = None
    if req.parent == "champion":
        ptr, _ = champion_state(store, t)
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
        raise bad_request(f"path: the variant changes {', '.join(outside)}, outside allowed_paths "
                          f"[{', '.join(t.allowed_paths)}]", field="path", code="outside_allowed_paths")
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
    rec = Variant(id=vid, target=tref, created_at=now(), parent=req.parent, parent_snapshot=parent_snap.sha256,
                  parent_selection=parent_sel, snapshot=snap, changed=changed, claim=req.claim,
                  identical_to_parent=not changed)
    ref = _put_record(store, "variants", vid, rec)
    doc = {"variant": ref.model_dump(), "snapshot": snap.sha256, "changed": changed, "identical_to_parent": not changed}
    if not changed:
        doc["note"] = "identical to its parent: experiments on it are A/A controls"
    return doc, 0


# -- experiment -----------------------------------------------------------------------------

def _prior_stages(store: Store, tid: str, ref_sha: str, cand_sha: str) -> list[Experiment]:
    out = []
    for eid in store.list_records("experiments"):
        e, _ = store.get_record("experiments", eid, Experiment)
        if e.target.id == tid and e.reference.get("snapshot") == ref_sha and e.candidate_snapshot == cand_sha:
            out.append(e)
    return out


def experiment(store: Store, req: ExperimentRequest, progress: Progress,
               executor: Executor = LOCAL) -> tuple[dict[str, Any], int]:
    t, tref = get_target(store, req.target)
    _require_optimization(t)
    assert t.original and t.objective
    ptr, ptr_digest = champion_state(store, t)
    vref: Ref | None = None
    if req.stage == "audit":
        if ptr is None:
            raise bad_request("stage audit: no champion is selected for this target", field="stage")
        cand_snap = snapshot_by_sha(store, t, ptr.snapshot)
        vref = ptr.variant
        ref_kind = "original"
    else:
        if not req.variant:
            raise bad_request("variant: give --variant ID or a variant field in the request", field="variant")
        check_id(req.variant, "variant")
        v, vr = store.get_record("variants", req.variant, Variant)
        if v.target.id != t.id:
            raise bad_request(f"variant {v.id} belongs to target {v.target.id}, not {t.id}", field="variant")
        vref = Ref(**vr)
        cand_snap = v.snapshot
        ref_kind = req.reference
    if ref_kind == "champion":
        if ptr is None:
            raise bad_request("reference: no champion is selected for this target", field="reference")
        ref_snap = snapshot_by_sha(store, t, ptr.snapshot)
    else:
        ref_snap = t.original
    if req.stage == "target":
        for e in _prior_stages(store, t.id, ref_snap.sha256, cand_snap.sha256):
            if e.stage == "screen" and e.outcome == "rejected":
                raise CkoError(f"stage target refused: screen {e.id} rejected this candidate against this reference "
                               f"({e.primary_verdict}); a new sampling plan does not reopen it",
                               exit_code=Exit.BAD_REQUEST, code="screen_rejected", field="stage")
            if e.outcome in ("failed_accuracy", "integrity_violation"):
                raise CkoError(f"stage target refused: {e.stage} {e.id} ended in {e.outcome}",
                               exit_code=Exit.BAD_REQUEST, code="earlier_stage_failed", field="stage")
    pairs = req.pairs or (t.plan.screen_pairs if req.stage == "screen" else t.plan.target_pairs)
    acquisition = req.acquisition or t.plan.acquisition
    seq_plan = None
    looks = [pairs]
    if req.sequential and req.stage == "target":
        lo = min(t.plan.min_pairs, pairs)
        looks = stats.evenly_spaced_looks(lo, pairs, 3) if pairs - lo >= 2 else [pairs]
        seq_plan = stats.sequential_plan(looks, confidence=t.plan.confidence)
    aa = cand_snap.sha256 == ref_snap.sha256
    subjects = {"reference": ref_snap, "candidate": cand_snap}
    results = []
    last: Measured | None = None
    case_ids = [c.id for c in t.cases]
    done = 0
    analyses: list[Any] = []
    invocations = []
    ran_on: list[RanOn] = []
    for look in looks:
        sched, blocks = paired_schedule(case_ids, "reference", "candidate", look - done, req.seed + done, start_rep=done)
        progress(f"{req.stage}: pairs {done + 1}..{look} ({acquisition})")
        last = run_measurement(store, t, subjects, sched, mode="measure", seed=req.seed, acquisition=acquisition,
                               label=f"{req.stage} {t.name}", parent={"target": tref.model_dump(),
                                                                       "variant": vref.model_dump() if vref else None},
                               progress=progress, executor=executor)
        invocations.append(last.invocation)
        if last.ran_on is not None:
            ran_on.append(last.ran_on)
        if last.failure or last.result is None:
            break
        results.append(last.result)
        done = look
        merged = _merge_results(results)
        analyses = [analysis.analyse_case(t, merged, c, "reference", "candidate", req.seed, seq_plan) for c in case_ids]
        if seq_plan is not None and all(a.primary.get("sequential", {}).get("state") == "decided" for a in analyses):
            break
    assert last is not None
    reasons: list[str] = []
    accuracy: dict[str, Any] = {}
    integrity: list[str] = []
    primary = "void"
    outcome = "failed_run"
    cases: list[Any] = []
    constraint_verdicts: dict[str, str] = {}
    mismatch = compare(t.identity, last.identity) if t.identity and last.identity else []
    samples_ref = None
    if last.failure or not results:
        reasons.append(f"measurement failed: {_measure_failure(last)}")
    else:
        merged = _merge_results(results)
        so = store.put_json(merged)
        samples_ref = ObjectRef(sha256=so["sha256"], size=so["size"], name="driver_result.json")
        for s in merged.series:
            accuracy.setdefault(s.subject, {})[s.case] = s.accuracy.model_dump(mode="json")
        gate_fail = []
        for s in merged.series:
            if s.subject != "candidate":
                continue
            for g in req.gates:
                worst = s.accuracy.worst_rel_l2
                if worst is None or worst > g.rel_l2 or (g.max_abs is not None and (s.accuracy.worst_max_abs is None
                                                                                     or s.accuracy.worst_max_abs > g.max_abs)):
                    gate_fail.append(f"gate {g.name} on case {s.case}: rel_l2 {worst} > {g.rel_l2}")
        acc_fail = [f"{s.subject} case {s.case}: {s.accuracy.detail or 'accuracy failed'}"
                    for s in merged.series if not s.accuracy.passed] + gate_fail
        integrity = list(merged.integrity)
        if acc_fail:
            reasons += ["accuracy gate failed (performance samples voided): " + "; ".join(acc_fail)]
            outcome = "failed_accuracy"
        elif integrity:
            reasons += ["integrity violation (performance samples voided): " + "; ".join(integrity[:5])]
            outcome = "integrity_violation"
        else:
            cases = analyses
            primary = analysis.combine([c.primary["verdict"] for c in cases])
            constraint_verdicts = analysis.combine_constraints(cases)
            if last.telemetry and last.telemetry.get("contaminated"):
                reasons.append("telemetry contaminated: " + "; ".join(last.telemetry.get("reasons", [])))
                primary = "inconclusive"
            if mismatch:
                reasons.append("environment differs from the Target's: " + ", ".join(x["field"] for x in mismatch))
                primary = "inconclusive"
            excluded = sum(c.excluded_pairs for c in cases)
            if excluded:
                reasons.append(f"{excluded} pair(s) excluded by the pre-declared clock rule")
            if aa:
                reasons.append("candidate snapshot is identical to the reference: measured as an A/A control")
            if req.stage == "screen":
                outcome = {"accepted": "promising", "regressed": "rejected", "below_minimum": "rejected"}.get(primary,
                                                                                                          "open")
                if primary == "accepted":
                    reasons.append("a screen never accepts: run the target stage for a formal verdict")
            else:
                outcome = primary
    eid = new_id("exp")
    rec = Experiment(
        id=eid, target=tref, variant=vref, stage=req.stage, created_at=now(),
        reference={"kind": ref_kind, "snapshot": ref_snap.sha256, "champion_pointer_sha256": ptr_digest},
        candidate_snapshot=cand_snap.sha256, aa_control=aa, claims=req.claims,
        gates=[g.model_dump() for g in req.gates],
        plan={"pairs": pairs, "pairs_measured": done, "seed": req.seed, "acquisition": acquisition,
              "looks": looks, "sequential": seq_plan.model_dump(mode="json") if seq_plan else None,
              "confidence": t.plan.confidence, "min_effect_pct": t.objective.min_effect_pct,
              "invocations": [i.model_dump() for i in invocations]},
        invocation=last.invocation, accuracy=accuracy, integrity=integrity, telemetry=last.telemetry,
        identity_mismatch=mismatch, cases=cases, primary_verdict=primary,  # type: ignore[arg-type]
        constraint_verdicts=constraint_verdicts, outcome=outcome, reasons=reasons, samples=samples_ref,
        ran_on=ran_on)
    ref = _put_record(store, "experiments", eid, rec)
    code = int(Exit.FAILED) if outcome in ("failed_run", "failed_accuracy", "integrity_violation") else 0
    return experiment_doc(rec, ref), code


def experiment_doc(rec: Experiment, ref: Ref) -> dict[str, Any]:
    return {"experiment": ref.model_dump(), "stage": rec.stage, "outcome": rec.outcome,
            "primary_verdict": rec.primary_verdict, "aa_control": rec.aa_control, "reasons": rec.reasons,
            "constraints": rec.constraint_verdicts, "ran_on": [r.model_dump(mode="json") for r in rec.ran_on],
            "cases": [{"case": c.case, "pairs": c.pairs, "excluded": c.excluded_pairs,
                       "effect_pct": c.primary.get("effect_pct"), "ci_low_pct": c.primary.get("ci_low_pct"),
                       "ci_high_pct": c.primary.get("ci_high_pct"), "wilcoxon_p": c.primary.get("wilcoxon_p"),
                       "verdict": c.primary.get("verdict"), "reference_median": c.reference_median,
                       "candidate_median": c.candidate_median,
                       "reference_stream_median_ns": c.reference_stream_median_ns,
                       "candidate_stream_median_ns": c.candidate_stream_median_ns} for c in rec.cases]}


def _merge_results(parts: list[Any]) -> Any:
    from operations.protocol import merge_results

    return merge_results(parts)


# -- champion -------------------------------------------------------------------------------

def select(store: Store, experiment_id: str, reason: str) -> tuple[dict[str, Any], int]:
    check_id(experiment_id, "experiment")
    e, eref_d = store.get_record("experiments", experiment_id, Experiment)
    eref = Ref(**eref_d)
    t, tref = store.get_record("targets", e.target.id, Target, sha256=e.target.sha256)
    missing = []
    if e.stage != "target":
        missing.append(f"experiment {e.id} is a {e.stage} stage; only a target stage can be chosen")
    if e.primary_verdict != "accepted":
        missing.append(f"its primary verdict is {e.primary_verdict}, not accepted")
    if e.outcome != "accepted":
        missing.append(f"its outcome is {e.outcome}")
    if any(not a.get("passed") for subj in e.accuracy.values() for a in subj.values()) or not e.accuracy:
        missing.append("its accuracy gate did not pass for every subject and case")
    if e.identity_mismatch:
        missing.append("its environment does not match the Target's: " + ", ".join(x["field"] for x in e.identity_mismatch))
    if e.aa_control:
        missing.append("it is an A/A control (the candidate is identical to its reference)")
    if e.variant is None:
        missing.append("it names no variant")
    with store.writer():
        current = store.champion_digest()
        if e.reference.get("champion_pointer_sha256") != current and e.reference.get("kind") == "champion":
            missing.append("the champion changed since this experiment measured against it (re-measure)")
        if e.reference.get("kind") == "original" and current is not None:
            ptr = ChampionPointer.model_validate_json(store.champion_path.read_bytes())
            if ptr.target.id == t.id and ptr.snapshot != (t.original.sha256 if t.original else None):
                missing.append("a champion is already selected: the new candidate must beat it "
                               "(run the experiment with reference champion)")
        if missing:
            raise CkoError("cannot select: " + "; ".join(missing), exit_code=Exit.FAILED, code="missing_evidence",
                           field="experiment", detail={"missing": missing})
        assert e.variant is not None
        v, vref = store.get_record("variants", e.variant.id, Variant, sha256=e.variant.sha256)
        sid = new_id("sel")
        sel = Selection(id=sid, target=Ref(**tref), action="select", experiment=eref, variant=Ref(**vref),
                        snapshot=v.snapshot.sha256, previous_pointer_sha256=current, created_at=now(), reason=reason)
        data = canonical_bytes(sel)
        store.commit_file(store.root / "champion" / "selections" / f"{sid}.json", data)
        ptr_new = ChampionPointer(target=Ref(**tref), selection=Ref(id=sid, sha256=sha256_bytes(data)),
                                  variant=Ref(**vref), snapshot=v.snapshot.sha256)
        store.swap_champion(current, canonical_bytes(ptr_new))
    return {"selection": {"id": sid, "sha256": sha256_bytes(data)}, "champion": ptr_new.model_dump(mode="json")}, 0


def restore(store: Store, target_id: str | None, reason: str) -> tuple[dict[str, Any], int]:
    t, tref = get_target(store, target_id)
    assert t.original
    with store.writer():
        current = store.champion_digest()
        sid = new_id("sel")
        sel = Selection(id=sid, target=tref, action="restore", snapshot=t.original.sha256,
                        previous_pointer_sha256=current, created_at=now(), reason=reason)
        data = canonical_bytes(sel)
        store.commit_file(store.root / "champion" / "selections" / f"{sid}.json", data)
        ptr_new = ChampionPointer(target=tref, selection=Ref(id=sid, sha256=sha256_bytes(data)), variant=None,
                                  snapshot=t.original.sha256)
        store.swap_champion(current, canonical_bytes(ptr_new))
    return {"selection": {"id": sid, "sha256": sha256_bytes(data)}, "champion": ptr_new.model_dump(mode="json")}, 0


def show(store: Store) -> dict[str, Any]:
    p = store.champion_path
    current = json.loads(p.read_bytes()) if p.is_file() else None
    history = []
    for f in sorted((store.root / "champion" / "selections").glob("*.json")):
        s = Selection.model_validate_json(f.read_bytes())
        history.append({"id": s.id, "action": s.action, "created_at": s.created_at, "experiment": s.experiment.id
                        if s.experiment else None, "variant": s.variant.id if s.variant else None,
                        "snapshot": s.snapshot, "reason": s.reason})
    return {"champion": current, "pointer_sha256": store.champion_digest(), "history": history}
