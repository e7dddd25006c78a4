"""The verdict of one experiment stage, as a pure function of its samples and its frozen plan.

`decide(samples, plan, telemetry, failure)` reads nothing and writes nothing: the experiment calls it
on the samples it measured, and `champion select` and `cko verify` call it again on the stored
samples and refuse a record that disagrees. Every reason has a stable `code`; the report, select,
audit and the tests read codes, never the English message.

Rules, in order (README, "Verdicts"):
1. the run failed -> `failed_run`; an accuracy gate failed -> `failed_accuracy`; the driver's
   integrity checks tripped -> `integrity_violation` (performance samples voided);
2. the environment differs from the Target's, or foreign load is unbalanced between the arms or
   above the plan's ceiling, or the candidate's checked blocks are voided more often than the
   reference's (its checks do not vouch for its counted blocks: vouch.py), or the supervisor's own
   clock does not confirm an accepted case's saving or sees it moved outside the windows
   (clockcheck.py) -> `void` (a void stage may be repeated; the attempt stays on record);
3. otherwise the primary verdict over cases (every case must accept; any regression regresses) and
   the constraints: the outcome is `accepted` only when the primary is accepted and every
   constraint is `ok`; a violated constraint makes `constraint_violated`, an undecided one (with
   an accepted primary) `constraint_inconclusive`, each naming its metrics.
A screen maps that onto `promising` / `rejected` / `open`: a screen never accepts.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Literal

import numpy as np

from cko_perf.operations.protocol import DriverResult
from cko_perf.operations.stats import scipy_stats

from . import analysis, clockcheck
from .requests import LoadCeiling
from .verdicts import CaseAnalysis, DecidePlan, Decision, LoadCheck, Reason, SampleLoad, Telemetry, WindowLoad
from .vouch import unvouched

REF, CAND = "reference", "candidate"
# Outcomes of a target or audit stage that decide nothing and may be repeated (each attempt recorded).
VOID_OUTCOMES = frozenset({"failed_run", "integrity_violation", "void"})
# Every other target-stage outcome is final for (Target, candidate snapshot, reference).
UNDER_LOAD_CORES = 0.25  # a baseline is "measured under load" above this median foreign CPU load


def decide(
    samples: DriverResult | None, plan: DecidePlan, telemetry: Telemetry, failure: Reason | None = None
) -> Decision:
    """The stage outcome, the primary and constraint verdicts and the coded reasons (module docstring)."""
    if failure is not None and failure.code == "integrity_violation":
        # the supervisor stopped the stage on a violation it confirmed (work outliving its windows)
        return Decision(stage_outcome="integrity_violation", primary_verdict="void", reasons=[failure])
    if failure is not None or samples is None:
        failed = failure or Reason(code="measurement_failed", message="the measurement returned no samples")
        return Decision(stage_outcome="failed_run", primary_verdict="void", reasons=[failed])
    gate = _gates(samples, plan)
    if gate:
        return Decision(stage_outcome="failed_accuracy", primary_verdict="void", reasons=gate)
    if samples.integrity:
        return Decision(
            stage_outcome="integrity_violation",
            primary_verdict="void",
            reasons=[
                Reason(
                    code="integrity_violation",
                    message="integrity violation (performance samples voided): "
                    + "; ".join(samples.integrity[:5]),
                )
            ],
        )
    case_ids = sorted({s.case for s in samples.series if s.subject == REF})
    cases = [
        analysis.analyse_case(plan.objective, plan.stats, samples, c, REF, CAND, plan.seed, plan.sequential)
        for c in case_ids
    ]
    cases, unresolved = below_resolution(cases, plan)
    load, load_reasons = check_load(telemetry, plan.ceiling)
    voids = load_reasons + [
        Reason(
            code="environment_mismatch",
            message="environment differs from the Target's: " + ", ".join(plan.identity_mismatch),
        )
    ] * bool(plan.identity_mismatch)
    voids += unconfirmed(samples) + clock_reasons(samples, cases, plan)
    notes = _notes(cases, plan)
    if voids:
        return Decision(
            stage_outcome="void", primary_verdict="void", cases=cases, reasons=voids + notes, load=load
        )
    primary = analysis.combine([c.primary["verdict"] for c in cases])
    cons = analysis.combine_constraints(cases)
    outcome, blocking, why = _outcome(plan.stage, primary, cons)
    return Decision(
        stage_outcome=outcome,
        primary_verdict=primary,  # type: ignore[arg-type]
        constraint_verdicts=cons,
        blocking_constraints=blocking,
        cases=cases,
        reasons=why + unresolved + notes,
        load=load,
    )


def unconfirmed(samples: DriverResult) -> list[Reason]:
    """`accuracy_unconfirmed` per case where the candidate's checks do not vouch (vouch.py)."""
    by_key = analysis.series_map(samples)
    return [
        Reason(code="accuracy_unconfirmed", message=why)
        for why in (unvouched(s, by_key.get((REF, s.case))) for s in samples.series if s.subject == CAND)
        if why
    ]


def clock_reasons(samples: DriverResult, cases: list[CaseAnalysis], plan: DecidePlan) -> list[Reason]:
    """`clock_unconfirmed` per accepted case whose saving the supervisor's clock does not show, and
    `clock_hidden_time` per case whose claimed saving reappears outside the windows (clockcheck.py)."""
    by_key = analysis.series_map(samples)
    out = []
    for c in cases:
        ref, cand = by_key.get((REF, c.case)), by_key.get((CAND, c.case))
        arr = clockcheck.clock_arrays(ref, cand, plan.stats.exclude_ramping) if ref and cand else None
        if arr is None:
            continue
        if c.primary.get("verdict") == "accepted":
            why = clockcheck.unconfirmed(arr, plan.objective.min_effect_pct, plan.stats.confidence)
            out += [Reason(code="clock_unconfirmed", message=f"case {c.case}: {why}")] * bool(why)
        why = clockcheck.hidden(arr, plan.stats.confidence)
        out += [Reason(code="clock_hidden_time", message=f"case {c.case}: {why}")] * bool(why)
    return out


def below_resolution(cases: list[CaseAnalysis], plan: DecidePlan) -> tuple[list[CaseAnalysis], list[Reason]]:
    """A screen's `below_minimum` on a case whose baseline A/A resolution is coarser than the minimum
    effect is `inconclusive`: the screen could not have seen the minimum, so it must not reject
    (a screen rejection is final) and the target stage stays open."""
    if plan.stage != "screen":
        return cases, []
    floor = plan.objective.min_effect_pct
    out, reasons = [], []
    for c in cases:
        res = plan.resolution_pct.get(c.case)
        if c.primary.get("verdict") == "below_minimum" and res is not None and res > floor:
            c = c.model_copy(update={"primary": c.primary | {"verdict": "inconclusive"}})
            reasons.append(
                Reason(
                    code="below_resolution",
                    message=f"case {c.case}: below the minimum effect ({floor:g}%), but the baseline resolves "
                    f"only {res:.3g}%: inconclusive, the target stage stays open",
                )
            )
        out.append(c)
    return out, reasons


def _outcome(stage: str, primary: str, cons: dict[str, str]) -> tuple[str, list[str], list[Reason]]:
    violated = sorted(m for m, v in cons.items() if v == "violated")
    undecided = sorted(m for m, v in cons.items() if v == "inconclusive")
    why = [
        Reason(
            code="constraint_violated",
            message=f"constraint {m} violated: it regresses by more than its maximum over the whole interval",
        )
        for m in violated
    ]
    why += [
        Reason(
            code="constraint_inconclusive",
            message=f"constraint {m} inconclusive: the interval does not "
            "show it within its maximum regression",
        )
        for m in undecided
    ]
    if stage == "screen":
        if primary in ("regressed", "below_minimum") or violated:
            return "rejected", violated, why
        if primary == "accepted":
            why.append(
                Reason(code="screen_never_accepts", message="a screen never accepts: run the target stage")
            )
            return "promising", [], why
        return "open", [], why
    if primary == "regressed":
        return "regressed", [], why
    if violated:
        return "constraint_violated", violated, why
    if primary != "accepted":
        return primary, [], why
    if undecided:
        return "constraint_inconclusive", undecided, why
    return "accepted", [], why


def _gates(samples: DriverResult, plan: DecidePlan) -> list[Reason]:
    out = [
        Reason(
            code="accuracy_failed",
            message=f"{s.subject} case {s.case}: {s.accuracy.detail or 'accuracy failed'}",
        )
        for s in samples.series
        if not s.accuracy.passed
    ]
    for s in samples.series:
        if s.subject != CAND:
            continue
        worst, worst_abs = s.accuracy.worst_rel_l2, s.accuracy.worst_max_abs
        for g in plan.gates:
            if (
                worst is None
                or worst > g.rel_l2
                or (g.max_abs is not None and (worst_abs is None or worst_abs > g.max_abs))
            ):
                out.append(
                    Reason(
                        code="gate_failed",
                        message=f"gate {g.name} on case {s.case}: rel_l2 {worst} > {g.rel_l2}",
                    )
                )
    return out


def _notes(cases: list[CaseAnalysis], plan: DecidePlan) -> list[Reason]:
    out = []
    excluded = sum(c.excluded_pairs for c in cases)
    if excluded:
        out.append(
            Reason(
                code="pairs_excluded",
                message=f"{excluded} pair(s) excluded by the pre-declared rules (clock, the supervisor's bracket and idle checks)",
            )
        )
    if plan.aa_control:
        out.append(
            Reason(
                code="aa_control",
                message="candidate snapshot is identical to the reference by content: "
                "measured as an A/A control",
            )
        )
    return out


# -- foreign load -------------------------------------------------------------------------------


def check_load(tel: Telemetry, ceiling: LoadCeiling) -> tuple[list[LoadCheck], list[Reason]]:
    """Ceilings and the arm-balance test for CPU load, GPU contexts and throttling."""
    cpus = tel.host_cpus or next((w.host_cpus for w in tel.windows if w.host_cpus), None)
    checks = [
        _check(
            "cpu",
            tel,
            lambda s: s.foreign_cpu_cores,
            [w.foreign_cpu_cores_median for w in tel.windows],
            ceiling.max_foreign_cpu_share,
            ceiling,
            scale=cpus or None,
            need_scale=True,
        ),
        _check(
            "gpu_contexts",
            tel,
            lambda s: None if s.foreign_gpu_contexts is None else float(s.foreign_gpu_contexts),
            [None if w.foreign_gpu_contexts is None else float(w.foreign_gpu_contexts) for w in tel.windows],
            float(ceiling.max_foreign_gpu_contexts),
            ceiling,
            use_max=True,
        ),
        _check(
            "throttle",
            tel,
            lambda s: None if s.throttle is None else float(bool(s.throttle)),
            [w.throttled_share for w in tel.windows],
            ceiling.max_throttled_share,
            ceiling,
            mean=True,
        ),
    ]
    reasons = []
    for c in checks:
        if c.level is not None and c.ceiling is not None and c.level > c.ceiling:
            reasons.append(
                Reason(
                    code=f"load_above_ceiling:{c.kind}",
                    message=f"foreign {c.kind} load {c.level:.3g} "
                    f"({c.basis}) is above the plan's ceiling {c.ceiling:g}",
                )
            )
        if c.imbalance_p is not None and c.imbalance_p < ceiling.imbalance_alpha:
            reasons.append(
                Reason(
                    code=f"load_unbalanced:{c.kind}",
                    message=f"foreign {c.kind} load differs between "
                    f"the arms: median per-pair difference {c.imbalance_median:+.3g} (candidate - "
                    f"reference), Wilcoxon p = {c.imbalance_p:.2g} < {ceiling.imbalance_alpha:g}",
                )
            )
    return checks, reasons


def _check(
    kind: str,
    tel: Telemetry,
    get: Callable[[SampleLoad], float | None],
    windows: list[float | None],
    limit: float,
    ceiling: LoadCeiling,
    scale: int | None = None,
    use_max: bool = False,
    mean: bool = False,
    need_scale: bool = False,
) -> LoadCheck:
    if kind == "cpu" and (pooled := pooled_cpu(tel.samples)) is not None:
        return _pooled_check(pooled, limit, ceiling, scale)
    by_key = {(s.subject, s.case, s.rep): get(s) for s in tel.samples}
    vals = [v for v in by_key.values() if v is not None]
    basis: Literal["per_sample", "window", "none"] = "per_sample" if vals else "window"
    if not vals:
        vals = [v for v in windows if v is not None]
        basis = "window" if vals else "none"
    level = None
    if vals:
        level = max(vals) if use_max else (sum(vals) / len(vals) if mean else statistics.median(vals))
        if need_scale:  # a share of the host's cores; unknown cores: no ceiling can be applied
            level = level / scale if scale else None
    diffs = [
        c - r
        for (subj, case, rep), c in by_key.items()
        if subj == CAND and c is not None and (r := by_key.get((REF, case, rep))) is not None
    ]
    p, med = _imbalance(diffs, ceiling.imbalance_min_cores if kind == "cpu" else 0.0)
    return LoadCheck(
        kind=kind,
        basis=basis,
        level=level,
        ceiling=limit if basis != "none" else None,
        imbalance_p=p,
        imbalance_median=med,
        pairs_tested=len(diffs),
    )


# /proc/stat counts CPU time in USER_HZ ticks (10 ms, fixed by the kernel's ABI). A block of a few ms
# reads zero or a whole tick, so one block's foreign-load figure is noise whose spread depends on the
# block's length: compared per pair, a short arm against a long one reads "unbalanced" on a host that
# is not. Blocks are therefore pooled, time-weighted, until each arm spans this much wall.
POOL_WALL_NS = 25 * 10_000_000


def pooled_cpu(samples: list[SampleLoad]) -> tuple[float, list[float]] | None:
    """(time-weighted foreign cores over every block, per-group candidate-minus-reference differences).

    Groups are consecutive pairs of one case, in rep order, closed once both arms span POOL_WALL_NS;
    a trailing group that never gets there joins the one before. None where blocks carry no wall time
    (the figures are then per sample, as recorded)."""
    timed = [s for s in samples if s.foreign_cpu_cores is not None and s.wall_ns]
    if not timed:
        return None
    total_wall = sum(s.wall_ns or 0 for s in timed)
    level = max(
        0.0,
        sum(s.foreign_cpu_cores * (s.wall_ns or 0) for s in timed if s.foreign_cpu_cores is not None)
        / total_wall,
    )
    arms = {(s.subject, s.case, s.rep): s for s in timed}
    diffs: list[float] = []
    for case in sorted({s.case for s in timed}):
        reps = sorted(r for (subj, c, r) in arms if subj == CAND and c == case and (REF, c, r) in arms)
        groups: list[list[int]] = []
        current: list[int] = []
        for rep in reps:
            current.append(rep)
            if (
                min(sum(arms[(a, case, r)].wall_ns or 0 for r in current) for a in (REF, CAND))
                >= POOL_WALL_NS
            ):
                groups.append(current)
                current = []
        if current and groups:
            groups[-1].extend(current)
        diffs += [_weighted(arms, case, g, CAND) - _weighted(arms, case, g, REF) for g in groups]
    return level, diffs


def _pooled_check(
    pooled: tuple[float, list[float]], limit: float, ceiling: LoadCeiling, scale: int | None
) -> LoadCheck:
    cores, diffs = pooled
    p, med = _imbalance(diffs, ceiling.imbalance_min_cores)
    return LoadCheck(
        kind="cpu",
        basis="pooled",
        level=cores / scale if scale else None,
        ceiling=limit,
        imbalance_p=p,
        imbalance_median=med,
        pairs_tested=len(diffs),
    )


def _weighted(
    arms: dict[tuple[str, str, int], SampleLoad], case: str, reps: list[int], subject: str
) -> float:
    blocks = [arms[(subject, case, r)] for r in reps]
    wall = sum(b.wall_ns or 0 for b in blocks)
    return sum((b.foreign_cpu_cores or 0.0) * (b.wall_ns or 0) for b in blocks) / wall


def _imbalance(diffs: list[float], min_effect: float) -> tuple[float | None, float | None]:
    """Two-sided Wilcoxon signed-rank p-value of per-pair load differences (None: too few to test).

    A difference smaller than `min_effect` in the median is reported but never voids (p forced to 1):
    with many pairs a trivial, immaterial difference can still be significant."""
    if len(diffs) < 6:
        return None, None
    d = np.asarray(diffs, dtype=float)
    med = float(np.median(d))
    if not np.any(d != 0):
        return 1.0, med
    p = float(scipy_stats().wilcoxon(d, zero_method="zsplit").pvalue)
    if abs(med) < min_effect and abs(float(np.mean(d))) < min_effect:
        p = 1.0
    return p, med


def under_load(window: WindowLoad) -> Reason | None:
    """Whether a baseline's resolution was measured with other work on the machine (it then says so)."""
    parts = []
    if window.foreign_cpu_cores_median is not None and window.foreign_cpu_cores_median > UNDER_LOAD_CORES:
        parts.append(
            f"other processes used a median of {window.foreign_cpu_cores_median:.2f} of "
            f"{window.host_cpus or '?'} CPU cores"
        )
    if window.foreign_gpu_contexts:
        parts.append(f"{window.foreign_gpu_contexts} other GPU context(s) ran")
    if window.throttled_share:
        parts.append(f"the GPU throttled in {window.throttled_share:.0%} of samples")
    if not parts:
        return None
    return Reason(
        code="measured_under_load",
        message="resolution measured under load: "
        + "; ".join(parts)
        + " — it includes that noise and may differ on a quiet machine",
    )
