"""From a DriverResult to paired statistics: pairing, the pre-declared clock rule, verdicts."""

from __future__ import annotations

import statistics
from typing import Any

from cko_perf.operations import stats
from cko_perf.operations.protocol import DriverResult, Series

from .requests import Constraint, Objective, StatsPlan
from .verdicts import CaseAnalysis

RAMP_FRACTION = 0.9
RAMP_RULE = (
    f"pre-declared: a pair is excluded when either side's timed block started below "
    f"{RAMP_FRACTION:.0%} of that series' median end-of-block SM clock (clocks still ramping)"
)


def series_map(res: DriverResult) -> dict[tuple[str, str], Series]:
    return {(s.subject, s.case): s for s in res.series}


def ramping_reps(s: Series) -> set[int]:
    ends = [c[1] for c in s.sm_mhz if len(c) == 2 and c[1]]
    if len(ends) < 3:
        return set()
    settled = statistics.median(ends)
    return {
        rep for rep, c in zip(s.reps, s.sm_mhz, strict=False) if c and c[0] and c[0] < RAMP_FRACTION * settled
    }


def void_reps(s: Series) -> set[int]:
    """Reps whose sample the supervisor voided (the device busy before the window, staging out of line)."""
    return {rep for rep, why in zip(s.reps, s.void, strict=False) if why}


def kept_pairs(ref: Series, cand: Series, exclude_ramping: bool) -> tuple[list[int], int]:
    """(the reps both subjects ran that the clock rule and the supervisor keep, how many were excluded)."""
    bad = (ramping_reps(ref) | ramping_reps(cand)) if exclude_ramping else set()
    bad |= void_reps(ref) | void_reps(cand)
    common = sorted(set(ref.reps) & set(cand.reps))
    kept = [i for i in common if i not in bad]
    return kept, len(common) - len(kept)


def pairs_for(ref: Series, cand: Series, metric: str, kept: list[int]) -> tuple[list[float], list[float]]:
    """The two subjects' samples of `metric` at the kept reps, in pair order."""
    r = dict(zip(ref.reps, ref.samples[metric], strict=True))
    c = dict(zip(cand.reps, cand.samples[metric], strict=True))
    return [r[i] for i in kept], [c[i] for i in kept]


def stream_median(s: Series, kept: list[int]) -> float | None:
    """Median over the kept reps of the launching stream's own time (ns), where the clock records it."""
    if not kept or len(s.stream_ns) != len(s.reps):
        return None
    t = dict(zip(s.reps, s.stream_ns, strict=True))
    return statistics.median(t[i] for i in kept)


def analyse_case(
    objective: Objective,
    plan: StatsPlan,
    res: DriverResult,
    case: str,
    ref_id: str,
    cand_id: str,
    seed: int,
    sequential: stats.SequentialPlan | None = None,
) -> CaseAnalysis:
    sm = series_map(res)
    ref, cand = sm[(ref_id, case)], sm[(cand_id, case)]
    kept, excluded = kept_pairs(ref, cand, plan.exclude_ramping)
    a, b = pairs_for(ref, cand, objective.primary.name, kept)
    return CaseAnalysis(
        case=case,
        pairs=len(a),
        excluded_pairs=excluded,
        exclusion_rule=RAMP_RULE if plan.exclude_ramping else "none",
        primary=_primary(objective, plan, a, b, seed, sequential),
        constraints=[_constraint(c, plan, ref, cand, kept, seed) for c in objective.constraints],
        reference_median=statistics.median(a) if a else None,
        candidate_median=statistics.median(b) if b else None,
        reference_stream_median_ns=stream_median(ref, kept),
        candidate_stream_median_ns=stream_median(cand, kept),
    )


def _primary(
    objective: Objective,
    plan: StatsPlan,
    a: list[float],
    b: list[float],
    seed: int,
    sequential: stats.SequentialPlan | None,
) -> dict[str, Any]:
    """The primary metric's verdict on the kept pairs: sequential looks when the plan has them, one
    fixed-sample comparison otherwise; inconclusive with too few pairs for either."""
    prim = objective.primary
    if len(a) < 2:
        return {
            "verdict": "inconclusive",
            "reason": f"only {len(a)} usable pair(s) after exclusions",
            "n_pairs": len(a),
        }
    if sequential is not None and len(a) < sequential.looks[0]:
        return {
            "verdict": "inconclusive",
            "n_pairs": len(a),
            "reason": f"only {len(a)} usable pair(s), fewer than the first look at {sequential.looks[0]}",
        }
    if sequential is not None:
        seq = stats.sequential_compare(
            a,
            b,
            plan=sequential,
            direction=prim.direction,
            min_effect_pct=objective.min_effect_pct,
            seed=seed,
            resamples=plan.bootstrap_resamples,
            keep_pairs=True,
            metric=prim.name,
        )
        return seq.looks[-1].model_dump(mode="json") | {
            "verdict": seq.verdict,
            "sequential": {
                "state": seq.state,
                "stopped_at_pairs": seq.stopped_at_pairs,
                "looks": seq.plan.looks,
                "look_confidences": seq.plan.look_confidences,
            },
        }
    return stats.compare(
        a,
        b,
        direction=prim.direction,
        min_effect_pct=objective.min_effect_pct,
        confidence=plan.confidence,
        seed=seed,
        resamples=plan.bootstrap_resamples,
        keep_pairs=True,
        metric=prim.name,
    ).model_dump(mode="json")


def _constraint(
    c: Constraint, plan: StatsPlan, ref: Series, cand: Series, kept: list[int], seed: int
) -> dict[str, Any]:
    """One constraint metric's check on the kept pairs (inconclusive with fewer than two)."""
    ca, cb = pairs_for(ref, cand, c.metric.name, kept)
    if len(ca) < 2:
        return {"metric": c.metric.name, "verdict": "inconclusive", "reason": "too few pairs"}
    return stats.constraint_check(
        ca,
        cb,
        direction=c.metric.direction,
        max_regression_pct=c.max_regression_pct,
        confidence=plan.confidence,
        seed=seed,
        resamples=plan.bootstrap_resamples,
        metric=c.metric.name,
    ).model_dump(mode="json")


def combine(verdicts: list[str]) -> str:
    """One verdict over cases: every case must be accepted to accept; any regression is a regression."""
    if not verdicts:
        return "inconclusive"
    if any(v == "regressed" for v in verdicts):
        return "regressed"
    if all(v == "accepted" for v in verdicts):
        return "accepted"
    if all(v in ("below_minimum", "accepted") for v in verdicts) and "below_minimum" in verdicts:
        return "below_minimum"
    return "inconclusive"


def combine_constraints(cases: list[CaseAnalysis]) -> dict[str, str]:
    out: dict[str, str] = {}
    for ca in cases:
        for c in ca.constraints:
            name = c.get("metric") or "?"
            v = c["verdict"]
            prev = out.get(name)
            if prev == "violated" or v == "violated":
                out[name] = "violated"
            elif prev == "inconclusive" or v == "inconclusive":
                out[name] = "inconclusive"
            else:
                out[name] = "ok"
    return out
