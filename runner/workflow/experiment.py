"""`cko experiment`: declare and run one stage of a paired comparison; `decide` gives its verdict.

Everything is validated before anything runs (exit 2, nothing written): the subjects, the claim
layer, the sequential looks against `plan.min_pairs`, and the one-formal-target rule (a target stage
that decided anything is final for its (Target, candidate snapshot, reference)).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from cko_perf.operations import stats
from cko_perf.operations.protocol import DriverResult

from ..canonical import sha256_file
from ..detach import event
from ..errors import CkoError, Exit, bad_request
from ..executor import LOCAL, Executor
from ..identity import compare
from ..models import ObjectRef, Ref
from ..policy import load_policy
from ..store import Store, check_id, new_id
from .champion import read_pointer
from .common import Progress, get_target, now, put_record, require_optimization, snapshot_by_sha
from .decide import VOID_OUTCOMES, decide
from .loadin import telemetry_input
from .measure import Measured, paired_schedule, run_measurement
from .records import Experiment, RanOn, Snapshot, Target, Variant
from .requests import CLAIM_ORDER, ExperimentRequest, LoadCeiling
from .snapshot import content_key
from .verdicts import DecidePlan, Decision, Reason, Telemetry

LAYER_TEXT = {
    "kernel": "a micro-benchmark of one operation",
    "workload": "the user's test workload",
    "service": "the end-to-end metric of a running service",
}


@dataclass
class Subjects:
    ref_kind: str
    ref: Snapshot
    cand: Snapshot
    variant: Ref | None
    pointer_sha256: str | None


@dataclass
class Run:
    results: list[DriverResult] = field(default_factory=list)
    invocations: list[Ref] = field(default_factory=list)
    ran_on: list[RanOn] = field(default_factory=list)
    summaries: list[dict[str, Any] | None] = field(default_factory=list)
    mismatch: list[dict[str, Any]] = field(default_factory=list)
    failure: Reason | None = None
    done: int = 0


def _subjects(store: Store, t: Target, req: ExperimentRequest) -> Subjects:
    assert t.original
    ptr, ptr_digest = read_pointer(store, t.id)
    if req.stage == "audit":
        if ptr is None or ptr.variant is None:
            raise bad_request("stage audit: no champion variant is selected for this target", field="stage")
        cand, vref, ref_kind = snapshot_by_sha(store, t, ptr.snapshot), ptr.variant, "original"
    else:
        if not req.variant:
            raise bad_request("variant: give --variant ID or a variant field in the request", field="variant")
        check_id(req.variant, "variant")
        v, vr = store.get_record("variants", req.variant, Variant)
        if v.target.id != t.id:
            raise bad_request(f"variant {v.id} belongs to target {v.target.id}, not {t.id}", field="variant")
        cand, vref, ref_kind = v.snapshot, Ref(**vr), req.reference
    if ref_kind == "champion":
        if ptr is None:
            raise bad_request("reference: no champion is selected for this target", field="reference")
        ref = snapshot_by_sha(store, t, ptr.snapshot)
    else:
        ref = t.original
    return Subjects(ref_kind, ref, cand, vref, ptr_digest)


def stages_of(store: Store, tid: str, ref_sha: str, cand_sha: str) -> list[tuple[Experiment, Ref]]:
    """Every stage run for (Target, reference snapshot, candidate snapshot), oldest first."""
    out = []
    for eid in store.list_records("experiments"):
        e, r = store.get_record("experiments", eid, Experiment)
        if e.target.id == tid and e.reference.get("snapshot") == ref_sha and e.candidate_snapshot == cand_sha:
            out.append((e, Ref(**r)))
    return sorted(out, key=lambda x: (x[0].created_at, x[0].id))


def formal_target(stages: list[tuple[Experiment, Ref]]) -> tuple[Experiment, Ref] | None:
    """The one target stage that counts: the first that decided anything (void attempts do not)."""
    return next(((e, r) for e, r in stages if e.stage == "target" and e.outcome not in VOID_OUTCOMES), None)


def _refuse_repeat(store: Store, t: Target, s: Subjects, stage: str) -> None:
    if stage != "target":
        return
    stages = stages_of(store, t.id, s.ref.sha256, s.cand.sha256)
    for e, _ in stages:
        if e.stage == "screen" and e.outcome == "rejected":
            raise CkoError(
                f"stage target refused: screen {e.id} rejected this candidate against this reference "
                f"({e.primary_verdict}); a new sampling plan does not reopen it",
                exit_code=Exit.BAD_REQUEST,
                code="screen_rejected",
                field="stage",
                detail={"experiment": e.id, "stage_outcome": e.outcome},
            )
        if e.outcome in ("failed_accuracy", "integrity_violation") and e.stage == "screen":
            raise CkoError(
                f"stage target refused: {e.stage} {e.id} ended in {e.outcome}",
                exit_code=Exit.BAD_REQUEST,
                code="earlier_stage_failed",
                field="stage",
                detail={"experiment": e.id, "stage_outcome": e.outcome},
            )
    formal = formal_target(stages)
    if formal is not None:
        e = formal[0]
        raise CkoError(
            f"stage target refused: target stage {e.id} already decided this candidate against this "
            f"reference ({e.outcome}); one formal target stage counts per snapshot: a new snapshot is "
            "a new candidate",
            exit_code=Exit.BAD_REQUEST,
            code="target_stage_final",
            field="stage",
            detail={"experiment": e.id, "stage_outcome": e.outcome},
        )


def _looks(t: Target, req: ExperimentRequest) -> tuple[int, list[int], stats.SequentialPlan | None]:
    pairs = req.pairs or (t.plan.screen_pairs if req.stage == "screen" else t.plan.target_pairs)
    if not req.sequential:
        return pairs, [pairs], None
    if req.stage != "target":
        raise bad_request(
            f"sequential: looks apply to the target stage only, not {req.stage}", field="sequential"
        )
    lo = t.plan.min_pairs
    if lo > pairs:
        raise bad_request(
            f"plan.min_pairs: the first look ({lo} pairs) is beyond the stage's {pairs} pairs",
            field="plan.min_pairs",
        )
    looks = stats.evenly_spaced_looks(lo, pairs, 3) if pairs - lo >= 2 else [pairs]
    try:
        return pairs, looks, stats.sequential_plan(looks, confidence=t.plan.confidence)
    except stats.StatsInputError as exc:
        need = stats.min_pairs_for(1 - (1 - t.plan.confidence) / len(looks))
        raise bad_request(
            f"plan.min_pairs: {t.plan.min_pairs} is too few for sequential looks {looks} at confidence "
            f"{t.plan.confidence:g}: each look needs at least {need} pairs ({exc.message})",
            field="plan.min_pairs",
        ) from None


def claim_layer(t: Target, req: ExperimentRequest) -> str:
    layer = req.claim_layer or t.claim_layer
    if CLAIM_ORDER[layer] > CLAIM_ORDER[t.claim_layer]:
        raise bad_request(
            f"claim_layer: {layer} is wider than the Target's {t.claim_layer} "
            f"({LAYER_TEXT[t.claim_layer]}): no evidence here can support it",
            field="claim_layer",
        )
    return layer


def effective_ceiling(plan: LoadCeiling) -> tuple[LoadCeiling, str]:
    """The plan's ceiling, lowered where the ops policy sets a lower one (a policy only narrows)."""
    pol, _ = load_policy(None)
    upd: dict[str, Any] = {}
    if pol.max_foreign_cpu_share is not None and pol.max_foreign_cpu_share < plan.max_foreign_cpu_share:
        upd["max_foreign_cpu_share"] = pol.max_foreign_cpu_share
    if (
        pol.max_foreign_gpu_contexts is not None
        and pol.max_foreign_gpu_contexts < plan.max_foreign_gpu_contexts
    ):
        upd["max_foreign_gpu_contexts"] = pol.max_foreign_gpu_contexts
    return (plan.model_copy(update=upd), "policy") if upd else (plan, "plan")


def same_content(store: Store, a: Snapshot, b: Snapshot) -> bool:
    return a.sha256 == b.sha256 or content_key(store, a.sha256) == content_key(store, b.sha256)


def supports(stage: str, outcome: str, layer: str, aa: bool) -> dict[str, Any]:
    """Which claim the evidence supports: only an accepted target stage supports any, at its layer."""
    ok = stage in ("target", "audit") and outcome == "accepted" and not aa
    text = (
        f"a {layer}-level claim ({LAYER_TEXT[layer]}); no wider claim"
        if ok
        else f"no claim: stage {stage} ended {outcome}" + (" (A/A control)" if aa else "")
    )
    return {"claim_layer": layer, "claim_supported": ok, "statement": text}


def _measure(
    store: Store,
    t: Target,
    tref: Ref,
    s: Subjects,
    req: ExperimentRequest,
    plan: DecidePlan,
    looks: list[int],
    acquisition: str,
    progress: Progress,
    executor: Executor,
) -> Run:
    run = Run()
    case_ids = [c.id for c in t.cases]
    for look in looks:
        sched, _ = paired_schedule(
            case_ids, "reference", "candidate", look - run.done, req.seed + run.done, start_rep=run.done
        )
        progress(f"{req.stage}: pairs {run.done + 1}..{look} ({acquisition})")
        m = run_measurement(
            store,
            t,
            {"reference": s.ref, "candidate": s.cand},
            sched,
            mode="measure",
            seed=req.seed,
            acquisition=acquisition,
            label=f"{req.stage} {t.name}",
            parent={"target": tref.model_dump(), "variant": s.variant.model_dump() if s.variant else None},
            progress=progress,
            executor=executor,
        )
        run.invocations.append(m.invocation)
        run.summaries.append(m.telemetry)
        if m.ran_on is not None:
            run.ran_on.append(m.ran_on)
        if t.identity and m.identity:
            run.mismatch += [x for x in compare(t.identity, m.identity) if x not in run.mismatch]
        if m.failure or m.result is None:
            run.failure = _failure(m)
            break
        run.results.append(m.result)
        run.done = look
        if plan.sequential is None:
            continue
        running = decide(merge_results(run.results), plan, telemetry_input(run.summaries, None))
        look_event("look", req.stage, run.done, looks[-1], running)
        if _settled(running):
            break
    return run


def look_event(name: str, stage: str, done: int, planned: int, d: Decision) -> None:
    """A progress event with the running estimate per case (an operation's events.jsonl)."""
    event(
        name,
        stage=stage,
        pairs_done=done,
        pairs_planned=planned,
        stage_outcome=d.stage_outcome,
        cases=[
            {
                "case": c.case,
                "pairs": c.pairs,
                "effect_pct": c.primary.get("effect_pct"),
                "ci_low_pct": c.primary.get("ci_low_pct"),
                "ci_high_pct": c.primary.get("ci_high_pct"),
                "case_verdict": c.primary.get("verdict"),
            }
            for c in d.cases
        ],
    )


def falsifier_doc(store: Store, req: ExperimentRequest) -> dict[str, Any] | None:
    """The request's cheapest falsifier, with a reference to the record holding its result (exit 2 when
    that record is not in this store)."""
    f = req.cheapest_falsifier
    if f is None:
        return None
    doc = f.model_dump(exclude_none=True)
    if f.result is None:
        return doc
    check_id(f.result, "cheapest_falsifier.result")
    for kind in ("experiments", "variants", "baselines", "targets"):
        path = store.record_path(kind, f.result)
        if path.is_file():
            return doc | {"result_ref": {"kind": kind[:-1], "id": f.result, "sha256": sha256_file(path)}}
    inv = store.invocation_result(f.result)
    if inv.is_file():
        return doc | {"result_ref": {"kind": "invocation", "id": f.result, "sha256": sha256_file(inv)}}
    raise bad_request(
        f"cheapest_falsifier.result: no record {f.result} in this store", field="cheapest_falsifier.result"
    )


def announce_estimate(req: ExperimentRequest, pairs: int, progress: Progress) -> None:
    e = req.estimated_cost
    if e is None:
        progress(f"{req.stage}: {pairs} pairs; no estimated cost given (estimated_cost)")
        return
    progress(
        f"{req.stage}: {pairs} pairs; estimated cost p50 {e.p50_s:g} s, p90 {e.p90_s:g} s, {e.gpus} GPU(s)"
    )
    event("estimate", stage=req.stage, pairs=pairs, **e.model_dump())


def cost_doc(req: ExperimentRequest, t: Target, seconds: float, progress: Progress) -> dict[str, Any]:
    """The actual cost next to the estimate, and where it fell."""
    gpus = max(1, t.gpu.count) if t.gpu.required else 0
    e = req.estimated_cost
    actual = {"seconds": round(seconds, 2), "gpus": gpus}
    if e is None:
        vs = "no estimate"
    else:
        vs = "within p50" if seconds <= e.p50_s else ("within p90" if seconds <= e.p90_s else "beyond p90")
    progress(
        f"{req.stage}: took {seconds:.1f} s on {gpus} GPU(s)"
        + (f" (estimated p50 {e.p50_s:g} s, p90 {e.p90_s:g} s: {vs})" if e else "")
    )
    event("cost", stage=req.stage, actual=actual, vs_estimate=vs)
    return {"estimated": e.model_dump() if e else None, "actual": actual, "vs_estimate": vs}


def _failure(m: Measured) -> Reason:
    f = m.failure or {}
    if f.get("code") == "integrity_violation":  # the supervisor ended the stage on one (decide says so)
        return Reason(code="integrity_violation", message=f"integrity violation: {f.get('message')}")
    return Reason(
        code="measurement_failed",
        message=f"measurement failed: {f.get('code')}: {f.get('message')} (field {f.get('field')})",
    )


def _settled(d: Decision) -> bool:
    """Stop looking: the samples are voided, or every case reached a sequential decision."""
    if d.stage_outcome in ("failed_accuracy", "integrity_violation"):
        return True
    return bool(d.cases) and all(c.primary.get("sequential", {}).get("state") == "decided" for c in d.cases)


def merge_results(parts: list[Any]) -> Any:
    from cko_perf.operations.protocol import merge_results as merge

    return merge(parts)


def baseline_resolution(store: Store, target_id: str) -> dict[str, float]:
    """Per case, the A/A resolution of the Target's newest baseline (empty where it has none)."""
    from .records import Baseline

    newest: Baseline | None = None
    for bid in store.list_records("baselines"):
        b, _ = store.get_record("baselines", bid, Baseline)
        if b.target.id == target_id and (newest is None or b.created_at > newest.created_at):
            newest = b
    return {c.case: c.resolution_pct for c in newest.cases} if newest else {}


@dataclass
class _Declared:
    """One stage as declared and checked before anything runs (exit 2, nothing written)."""

    target: Target
    tref: Ref
    subjects: Subjects
    layer: str
    pairs: int
    looks: list[int]
    sequential: stats.SequentialPlan | None
    falsifier: dict[str, Any] | None
    acquisition: str
    plan: DecidePlan


@dataclass
class _Decided:
    """What the measured pairs decided, and what the decision read."""

    plan: DecidePlan  # the declared plan with the identity fields that differed from the Target's
    merged: DriverResult | None  # the looks' samples as one result; None when a look failed
    load_input: Telemetry
    decision: Decision


def experiment(
    store: Store, req: ExperimentRequest, progress: Progress, executor: Executor = LOCAL
) -> tuple[dict[str, Any], int]:
    x = _declare(store, req)
    announce_estimate(req, x.pairs, progress)
    started = time.monotonic()
    run = _measure(
        store, x.target, x.tref, x.subjects, req, x.plan, x.looks, x.acquisition, progress, executor
    )
    m = _decided(x.plan, run)
    look_event("estimate_final", req.stage, run.done, x.pairs, m.decision)
    cost = cost_doc(req, x.target, time.monotonic() - started, progress)
    rec = _record(store, x, req, run, m, cost)
    ref = put_record(store, "experiments", rec.id, rec)
    failed = ("failed_run", "failed_accuracy", "integrity_violation")
    return experiment_doc(rec, ref), int(Exit.FAILED) if m.decision.stage_outcome in failed else 0


def _declare(store: Store, req: ExperimentRequest) -> _Declared:
    """Check the request against its Target and the store, and fix the plan its verdict will follow."""
    t, tref = get_target(store, req.target)
    require_optimization(t)
    assert t.original and t.objective
    layer = claim_layer(t, req)
    pairs, looks, seq_plan = _looks(t, req)
    s = _subjects(store, t, req)
    _refuse_repeat(store, t, s, req.stage)
    falsifier = falsifier_doc(store, req)
    acquisition = req.acquisition or t.plan.acquisition
    ceiling, source = effective_ceiling(t.plan.load)
    plan = DecidePlan(
        stage=req.stage,
        objective=t.objective,
        stats=t.plan,
        seed=req.seed,
        sequential=seq_plan,
        gates=req.gates,
        ceiling=ceiling,
        ceiling_source=source,  # type: ignore[arg-type]
        aa_control=same_content(store, s.ref, s.cand),
        resolution_pct=baseline_resolution(store, t.id) if req.stage == "screen" else {},
    )
    return _Declared(t, tref, s, layer, pairs, looks, seq_plan, falsifier, acquisition, plan)


def _decided(declared: DecidePlan, run: Run) -> _Decided:
    plan = declared.model_copy(update={"identity_mismatch": [str(x.get("field")) for x in run.mismatch]})
    merged = merge_results(run.results) if run.results and run.failure is None else None
    tel = telemetry_input(run.summaries, merged)
    return _Decided(plan, merged, tel, decide(merged, plan, tel, run.failure))


def _record(
    store: Store, x: _Declared, req: ExperimentRequest, run: Run, m: _Decided, cost: dict[str, Any]
) -> Experiment:
    """The Experiment record (its samples stored first, as the object it references)."""
    s, d, merged = x.subjects, m.decision, m.merged
    samples_ref = None
    if merged is not None:
        so = store.put_json(merged)
        samples_ref = ObjectRef(sha256=so["sha256"], size=so["size"], name="driver_result.json")
    return Experiment(
        id=new_id("exp"),
        target=x.tref,
        variant=s.variant,
        stage=req.stage,
        created_at=now(),
        reference={"kind": s.ref_kind, "snapshot": s.ref.sha256, "champion_pointer_sha256": s.pointer_sha256},
        candidate_snapshot=s.cand.sha256,
        aa_control=m.plan.aa_control,
        claims=req.claims,
        gates=[g.model_dump() for g in req.gates],
        plan=_plan_doc(x, req, run, merged),
        invocation=run.invocations[-1] if run.invocations else None,
        accuracy=_accuracy(merged),
        integrity=list(merged.integrity) if merged is not None else [],
        telemetry=run.summaries[-1] if run.summaries else None,
        identity_mismatch=run.mismatch,
        cases=d.cases,
        primary_verdict=d.primary_verdict,
        constraint_verdicts=d.constraint_verdicts,
        outcome=d.stage_outcome,
        blocking_constraints=d.blocking_constraints,
        reasons=d.reasons,
        samples=samples_ref,
        ran_on=run.ran_on,
        claim_layer=x.layer,  # type: ignore[arg-type]
        decision_plan=m.plan,
        load_input=m.load_input,
        failure=run.failure,
        load=d.load,
        hypothesis=req.hypothesis,
        mechanism_key=req.mechanism_key,
        cheapest_falsifier=x.falsifier,
        cost=cost,
    )


def _plan_doc(x: _Declared, req: ExperimentRequest, run: Run, merged: DriverResult | None) -> dict[str, Any]:
    """The experiment's plan as recorded: what was declared beside what was measured."""
    assert x.target.objective
    return {
        "pairs": x.pairs,
        "pairs_measured": run.done,
        "seed": req.seed,
        "acquisition": x.acquisition,
        "looks": x.looks,
        "sequential": x.sequential.model_dump(mode="json") if x.sequential else None,
        "confidence": x.target.plan.confidence,
        "min_effect_pct": x.target.objective.min_effect_pct,
        "invocations": [i.model_dump() for i in run.invocations],
        "boundary": merged.boundary if merged is not None else None,
    }


def _accuracy(merged: DriverResult | None) -> dict[str, Any]:
    """Each subject's accuracy check per case, as measured."""
    accuracy: dict[str, Any] = {}
    for sr in merged.series if merged is not None else []:
        accuracy.setdefault(sr.subject, {})[sr.case] = sr.accuracy.model_dump(mode="json")
    return accuracy


def case_rows(rec: Experiment) -> list[dict[str, Any]]:
    """Per-case rows. `case_verdict` is one case's primary verdict; the stage's outcome is
    `stage_outcome` (a case may accept under a stage that does not: the row then says so)."""
    rows = []
    for c in rec.cases:
        v = c.primary.get("verdict")
        rows.append(
            {
                "case": c.case,
                "pairs": c.pairs,
                "excluded": c.excluded_pairs,
                "effect_pct": c.primary.get("effect_pct"),
                "ci_low_pct": c.primary.get("ci_low_pct"),
                "ci_high_pct": c.primary.get("ci_high_pct"),
                "wilcoxon_p": c.primary.get("wilcoxon_p"),
                "case_verdict": v,
                "stage_outcome": rec.outcome,
                "case_verdict_text": v if v == rec.outcome else f"{v} (stage outcome: {rec.outcome})",
                "constraints": {k.get("metric"): k.get("verdict") for k in c.constraints},
                "reference_median": c.reference_median,
                "candidate_median": c.candidate_median,
                "reference_stream_median_ns": c.reference_stream_median_ns,
                "candidate_stream_median_ns": c.candidate_stream_median_ns,
            }
        )
    return rows


def experiment_doc(rec: Experiment, ref: Ref) -> dict[str, Any]:
    outcome_text = rec.outcome + (
        f" ({', '.join(rec.blocking_constraints)})" if rec.blocking_constraints else ""
    )
    return {
        "experiment": ref.model_dump(),
        "experiment_target": rec.target.id,
        "stage": rec.stage,
        "stage_outcome": rec.outcome,
        "stage_outcome_text": outcome_text,
        "primary_verdict": rec.primary_verdict,
        "constraint_verdicts": rec.constraint_verdicts,
        "blocking_constraints": rec.blocking_constraints,
        "aa_control": rec.aa_control,
        "reasons": [r.model_dump() for r in rec.reasons],
        "reason_codes": [r.code for r in rec.reasons],
        "supports": supports(rec.stage, rec.outcome, rec.claim_layer, rec.aa_control),
        "load": [c.model_dump() for c in rec.load],
        "ran_on": [r.model_dump(mode="json") for r in rec.ran_on],
        "cases": case_rows(rec),
        "hypothesis": rec.hypothesis,
        "mechanism_key": rec.mechanism_key,
        "cheapest_falsifier": rec.cheapest_falsifier,
        "cost": rec.cost,
    }
