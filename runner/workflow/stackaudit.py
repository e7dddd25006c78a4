"""`cko audit --stack`: a stack-upgrade audit of two Targets that differ in one declared component.

Refused (exit 2, nothing run or written) unless the two Targets are the same workload and their
frozen identities differ in the declared component only (runner/workflow/stackdiff.py). Then both
originals are measured, each in its own Target's exact image, in interleaved invocations (seeded
ABBA/BAAB blocks over pairs of rounds), each a short measurement of every case, so drift and other
work on the host hit both sides. An invocation's median per case is the unit the comparison counts: samples
inside one container share its warm state and moment, so counting them as independent would make
the interval too narrow. Per case, `operations/twosample.py` gives the relative difference of the
medians, its interval and a verdict (faster / slower / no_difference / inconclusive). The record
is written once, in the ledger; cko returns the facts and promotes nothing.
"""

from __future__ import annotations

import random
import statistics
from typing import Any

from pydantic import Field, ValidationError

from cko_perf.operations.protocol import DriverResult, ScheduleItem
from cko_perf.operations.twosample import compare_two

from ..errors import CkoError, Exit, failed, pydantic_error
from ..executor import LOCAL, Executor
from ..identity import compare
from ..models import Closed, ObjectRef, Ref
from ..store import Store, check_id, new_id
from . import analysis
from .audit import _targets_image
from .common import Progress, get_target, now, put_record, require_optimization
from .decide import under_load
from .loadin import window_load
from .measure import Measured, run_measurement
from .records import Baseline, Target
from .requests import LoadCeiling
from .stackdiff import StackDiff, check_declared, stack_diff
from .stackrecord import Side, StackAudit, StackCase, StackInvocation
from .verdicts import Reason


class StackAuditRequest(Closed):
    from_target: str = Field(alias="from", description="the Target on the current stack (tgt-...)")
    to_target: str = Field(alias="to", description="the Target on the upgraded stack (tgt-...)")
    component: str = Field(
        min_length=1, description="the one component declared to differ: image, torch, ..."
    )
    rounds: int = Field(default=6, ge=2, le=50, description="invocations per side (4+4 is the least at 95%)")
    samples_per_case: int = Field(default=3, ge=1, le=100, description="samples per case per invocation")
    seed: int = Field(default=0, ge=0)


def parse_request(doc: dict[str, Any]) -> StackAuditRequest:
    try:
        req = StackAuditRequest.model_validate(doc)
    except ValidationError as exc:
        raise pydantic_error(exc, "audit --stack") from None
    check_id(req.from_target, "from")
    check_id(req.to_target, "to")
    return req


def plan(store: Store, req: StackAuditRequest) -> tuple[dict[Side, tuple[Target, Ref]], StackDiff]:
    """Both Targets and their component diff; refuses (exit 2 or 5, nothing written) before measuring."""
    sides: dict[Side, tuple[Target, Ref]] = {
        "from": get_target(store, req.from_target),
        "to": get_target(store, req.to_target),
    }
    for t, _ in sides.values():
        require_optimization(t)
    diff = stack_diff(sides["from"][0], sides["to"][0])
    check_declared(diff, req.component)
    return sides, diff


def run_order(rounds: int, seed: int) -> list[tuple[int, Side]]:
    """Seeded ABBA/BAAB blocks over pairs of rounds (as `paired_schedule` orders pairs): a linear
    drift hits both sides alike within a block, and which side runs first is chance, not a rule that
    a periodic load could line up with, so under equal stacks the two sides' values are exchangeable."""
    rng = random.Random(seed)
    out: list[tuple[int, Side]] = []
    for r in range(0, rounds, 2):
        first: tuple[Side, Side] = (
            ("from", "to") if rng.choice(("ABBA", "BAAB")) == "ABBA" else ("to", "from")
        )
        out += [(r, first[0]), (r, first[1])]
        if r + 1 < rounds:
            out += [(r + 1, first[1]), (r + 1, first[0])]
    return out


def _measure(
    store: Store,
    t: Target,
    tref: Ref,
    where: tuple[int, Side],
    req: StackAuditRequest,
    progress: Progress,
    executor: Executor,
) -> tuple[StackInvocation, DriverResult]:
    assert t.original is not None and t.objective is not None
    rnd, side = where
    items = [
        ScheduleItem(subject="original", case=c.id, rep=i)
        for c in t.cases
        for i in range(req.samples_per_case)
    ]
    with _targets_image(store, t, executor, progress):
        m = run_measurement(
            store,
            t,
            {"original": t.original},
            items,
            mode="measure",
            seed=req.seed + 2 * rnd + (side == "to"),
            acquisition=t.plan.acquisition,
            label=f"stack audit {side} {t.name} round {rnd + 1}",
            parent={"stack_audit": {"side": side, "round": rnd, "target": tref.model_dump()}},
            progress=progress,
            executor=executor,
        )
    if m.failure or m.result is None:
        f = m.failure or {}
        raise failed(
            f"stack audit: the {side} original's measurement failed: {f.get('code')}: {f.get('message')} "
            f"(invocation {m.invocation.id})",
            code="measurement_failed",
        )
    inv = _invocation(t, where, m, m.result)
    progress(
        f"stack audit: {side} round {rnd + 1}: "
        + ", ".join(f"{c} {v:.4g}" for c, v in inv.medians.items())
        + f" {t.objective.primary.unit}"
    )
    return inv, m.result


def _invocation(t: Target, where: tuple[int, Side], m: Measured, res: DriverResult) -> StackInvocation:
    """What one invocation measured: the primary's kept samples per case (the supervisor's void reps
    left out), their median, and whether it ran on its Target's frozen stack."""
    assert t.objective is not None
    prim = t.objective.primary.name
    samples: dict[str, list[float]] = {}
    for s in res.series:
        void = analysis.void_reps(s)
        samples[s.case] = [v for rep, v in zip(s.reps, s.samples[prim], strict=True) if rep not in void]
    return StackInvocation(
        round=where[0],
        side=where[1],
        invocation=m.invocation,
        image_id=m.identity.image.id if m.identity and m.identity.image else None,
        ran_on=m.ran_on,
        identity_mismatch=compare(t.identity, m.identity) if t.identity and m.identity else [],
        load=window_load(m.telemetry),
        accuracy_failed=[s.case for s in res.series if not s.accuracy.passed],
        integrity=list(res.integrity),
        samples=samples,
        medians={c: statistics.median(v) for c, v in samples.items() if v},
    )


def newest_baseline(store: Store, target_id: str) -> tuple[Baseline | None, Ref | None]:
    best: tuple[Baseline | None, Ref | None] = (None, None)
    for bid in store.list_records("baselines"):
        b, ref = store.get_record("baselines", bid, Baseline)
        if b.target.id == target_id and (best[0] is None or b.created_at >= best[0].created_at):
            best = (b, Ref(**ref))
    return best


def case_result(
    t: Target,
    case: str,
    invs: list[StackInvocation],
    seed: int,
    resolution: dict[str, float | None],
) -> StackCase:
    """One case: the "from" invocations' medians against the "to" ones (a pure function of the record)."""
    assert t.objective is not None
    prim = t.objective.primary
    a = [i.medians[case] for i in invs if i.side == "from" and case in i.medians]
    b = [i.medians[case] for i in invs if i.side == "to" and case in i.medians]
    failed_on = sorted({i.side for i in invs if case in i.accuracy_failed})
    base: dict[str, Any] = {
        "case": case,
        "unit": prim.unit,
        "from_medians": a,
        "to_medians": b,
        "aa_resolution_pct": resolution,
    }
    if failed_on:
        void = f"the {' and '.join(failed_on)} original failed its accuracy gate: its samples are void"
        return StackCase(**base, verdict="failed_accuracy", note=void)
    if len(a) < 2 or len(b) < 2:
        return StackCase(**base, verdict="inconclusive", note=f"{len(a)} and {len(b)} usable invocations")
    cmp = compare_two(
        a,
        b,
        direction=prim.direction,
        min_effect_pct=t.objective.min_effect_pct,
        confidence=t.plan.confidence,
        seed=seed,
        resamples=t.plan.bootstrap_resamples,
        metric=prim.name,
    )
    floor = max((r for r in resolution.values() if r is not None), default=None)
    note: str | None = None
    if not cmp.calibrated:
        note = f"{len(a)} and {len(b)} invocations are too few for an interval at {cmp.confidence:.0%}"
    elif floor is not None and t.objective.min_effect_pct <= floor:
        note = f"the minimum effect {t.objective.min_effect_pct:g}% is at or below the A/A resolution {floor:.2f}%"
    return StackCase(**base, comparison=cmp, verdict=cmp.verdict, note=note)


def _ceiling(invs: list[StackInvocation], ceiling: LoadCeiling) -> list[Reason]:
    """The Target's declared load ceiling, over the invocations' windows (basis: window): above it the
    measurement says more about the other work than about either stack."""
    shares = [
        i.load.foreign_cpu_cores_median / i.load.host_cpus
        for i in invs
        if i.load.foreign_cpu_cores_median is not None and i.load.host_cpus
    ]
    out = []
    if shares and statistics.median(shares) > ceiling.max_foreign_cpu_share:
        out.append(
            Reason(
                code="load_above_ceiling",
                message=f"other processes used a median {statistics.median(shares):.0%} of the host's CPUs, "
                f"above the plan's ceiling {ceiling.max_foreign_cpu_share:.0%}",
            )
        )
    gpu = max((i.load.foreign_gpu_contexts or 0 for i in invs), default=0)
    if gpu > ceiling.max_foreign_gpu_contexts:
        out.append(
            Reason(
                code="load_above_ceiling",
                message=f"{gpu} other GPU context(s) ran, above the plan's ceiling "
                f"{ceiling.max_foreign_gpu_contexts}",
            )
        )
    return out


def _reasons(invs: list[StackInvocation], ceiling: LoadCeiling) -> tuple[list[Reason], bool]:
    reasons = _ceiling(invs, ceiling)
    for i in invs:
        if i.identity_mismatch:
            fields = ", ".join(str(x.get("field")) for x in i.identity_mismatch)
            reasons.append(
                Reason(
                    code="environment_mismatch",
                    message=f"{i.side} round {i.round + 1} ({i.invocation.id}) did not run on its Target's "
                    f"frozen stack: {fields}",
                )
            )
        for v in i.integrity:
            reasons.append(Reason(code="integrity_violation", message=f"{i.side} round {i.round + 1}: {v}"))
    loaded = [r for r in (under_load(i.load) for i in invs) if r is not None]
    if loaded:
        reasons.append(
            Reason(
                code="measured_under_load",
                message=f"{len(loaded)} of {len(invs)} invocations ran with other work on the machine "
                f"({loaded[0].message.split(': ', 1)[-1].split(' — ')[0]}, in the first); interleaving "
                "spreads it over both sides: it widens the intervals rather than favouring one",
            )
        )
    return reasons, bool(loaded)


def stack_audit(
    store: Store, req: StackAuditRequest, progress: Progress, executor: Executor = LOCAL
) -> tuple[dict[str, Any], int]:
    sides, diff = plan(store, req)
    ta = sides["from"][0]
    assert ta.objective is not None
    progress(
        f"stack audit: {req.component} {ta.id} -> {sides['to'][0].id}, {req.rounds} rounds of "
        f"{req.samples_per_case} samples per case per side"
    )
    invs: list[StackInvocation] = []
    results: list[dict[str, Any]] = []
    for where in run_order(req.rounds, req.seed):
        t, tref = sides[where[1]]
        inv, res = _measure(store, t, tref, where, req, progress, executor)
        invs.append(inv)
        results.append({"invocation": inv.invocation.id, "driver_result": res.model_dump(mode="json")})
    bases = {side: newest_baseline(store, sides[side][0].id) for side in ("from", "to")}
    cases = [
        case_result(ta, c.id, invs, req.seed, {s: _resolution(b, c.id) for s, (b, _) in bases.items()})
        for c in ta.cases
    ]
    return _commit(store, req, sides, diff, invs, cases, {s: r for s, (_, r) in bases.items()}, results)


def _resolution(b: Baseline | None, case: str) -> float | None:
    return next((cb.resolution_pct for cb in b.cases if cb.case == case), None) if b else None


def _commit(
    store: Store,
    req: StackAuditRequest,
    sides: dict[Side, tuple[Target, Ref]],
    diff: StackDiff,
    invs: list[StackInvocation],
    cases: list[StackCase],
    baselines: dict[str, Ref | None],
    results: list[dict[str, Any]],
) -> tuple[dict[str, Any], int]:
    ta = sides["from"][0]
    assert ta.objective is not None
    reasons, loaded = _reasons(invs, ta.plan.load)
    blocking = any(
        r.code in ("environment_mismatch", "integrity_violation", "load_above_ceiling") for r in reasons
    )
    blob = store.put_json(results)
    rec = StackAudit(
        id=new_id("sta"),
        created_at=now(),
        from_target=sides["from"][1],
        to_target=sides["to"][1],
        component=req.component,
        diff=diff,
        unchecked=[c.name for c in diff.components if c.status == "could_not_check"],
        images={s: {"name": t.image, "id": _image_id(t)} for s, (t, _) in sides.items()},
        rounds=req.rounds,
        samples_per_case=req.samples_per_case,
        warmup=ta.plan.warmup,
        seed=req.seed,
        order=[side for _, side in run_order(req.rounds, req.seed)],
        metric=ta.objective.primary.name,
        direction=ta.objective.primary.direction,
        min_effect_pct=ta.objective.min_effect_pct,
        confidence=ta.plan.confidence,
        resamples=ta.plan.bootstrap_resamples,
        baselines=baselines,
        invocations=invs,
        cases=cases,
        answer="could_not_check" if blocking else "measured",
        reasons=reasons,
        measured_under_load=loaded,
        results=ObjectRef(sha256=blob["sha256"], size=blob["size"], name="stack-audit-results.json"),
    )
    ref = put_record(store, "stackaudits", rec.id, rec)
    return to_doc(rec, ref), int(Exit.UNAVAILABLE if blocking else Exit.DONE)


def _image_id(t: Target) -> str | None:
    return t.identity.image.id if t.identity and t.identity.image else None


def to_doc(rec: StackAudit, ref: Ref) -> dict[str, Any]:
    """The command's JSON document: the record's reference, the answer and one row per case."""
    return {
        "stack_audit": ref.model_dump(),
        "answer": rec.answer,
        "component": rec.component,
        "from": rec.from_target.model_dump(),
        "to": rec.to_target.model_dump(),
        "images": rec.images,
        "differs": [c.name for c in rec.diff.components if c.status == "differs"],
        "unchecked": rec.unchecked,
        "reasons": [r.model_dump() for r in rec.reasons],
        "reason_codes": [r.code for r in rec.reasons],
        "measured_under_load": rec.measured_under_load,
        "invocations": [i.invocation.id for i in rec.invocations],
        "cases": [_case_row(c) for c in rec.cases],
    }


def _case_row(c: StackCase) -> dict[str, Any]:
    cmp = c.comparison
    return {
        "case": c.case,
        "unit": c.unit,
        "from_median": statistics.median(c.from_medians) if c.from_medians else None,
        "to_median": statistics.median(c.to_medians) if c.to_medians else None,
        "effect_pct": cmp.effect_pct if cmp else None,
        "ci_low_pct": cmp.ci_low_pct if cmp else None,
        "ci_high_pct": cmp.ci_high_pct if cmp else None,
        "calibrated": cmp.calibrated if cmp else None,
        "verdict": c.verdict,
        "aa_resolution_pct": c.aa_resolution_pct,
        "note": c.note,
    }


def recheck(store: Store, rec: StackAudit) -> list[str]:
    """verify's semantic pass for one stack audit: every invocation's medians from its samples, and
    every case's comparison and verdict from those medians and the "from" Target's objective and plan."""
    try:
        t, _ = store.get_record("targets", rec.from_target.id, Target, sha256=rec.from_target.sha256)
    except CkoError as exc:
        return [f"its from Target cannot be read: {exc.message}"]
    out = [
        f"{i.side} round {i.round + 1}: recorded medians do not match its samples"
        for i in rec.invocations
        if i.medians != {c: statistics.median(v) for c, v in i.samples.items() if v}
    ]
    for c in rec.cases:
        again = case_result(t, c.case, rec.invocations, rec.seed, c.aa_resolution_pct)
        if (again.verdict, again.comparison) != (c.verdict, c.comparison):
            out.append(f"case {c.case}: recorded {c.verdict}, the stored medians give {again.verdict}")
    return out
