"""Paired statistics for cko (DESIGN.md, "Measurement and statistics").

Everything here runs on the host and inside the container, so it imports numpy, scipy and
pydantic only (never `runner`).

The measurement model
---------------------
Pair ``i`` measures the reference and the candidate close in time. Its effect is the log ratio
oriented so that a positive value is better in the metric's direction::

    direction "lower"  (time: lower is better):        d_i = log(reference_i / candidate_i)
    direction "higher" (throughput: higher is better): d_i = log(candidate_i / reference_i)

The estimate is the median of the ``d_i``; effects are reported in percent as
``100 * (exp(d) - 1)``: +5 % means the candidate is 5 % better (for time: reference/candidate =
1.05). What is estimated is the population median of the pair log ratios. When the two
measurements of a pair carry exchangeable noise (same distribution, any shape, plus any factor
common to the pair such as drift), ``d_i`` is symmetric about the true log effect, so that median
is the true effect.

The confidence interval (and why this method)
---------------------------------------------
The interval is the hull (the smallest interval containing both) of

1. the percentile bootstrap interval of the median over pairs (``scipy.stats.bootstrap``,
   ``method="percentile"``, seeded), and
2. the distribution-free order-statistic interval for the median: ``[d_(k), d_(n+1-k)]`` with the
   largest ``k`` such that ``2 * P(Binomial(n, 1/2) <= k - 1) <= 1 - confidence``; its coverage is
   at least the confidence level for any continuous distribution of independent pairs (it is the
   interval the sign test inverts).

The percentile bootstrap alone is the textbook choice (BCa needs an acceleration estimated by the
jackknife, which is degenerate for a median with ties, and the "basic" interval badly undercovers
for medians), but measured on lognormal pairs it *undercovers* for the median well past small n:
nominal 95 %: 0.934 at n=10, 0.945 at n=20, 0.942 at n=30, 0.943 at n=50 (3000 trials each,
Monte-Carlo s.e. about 0.004); nominal 99 %: 0.973 / 0.983 / 0.985 / 0.987 at n=10/20/30/50, i.e.
1.5-2.7 times the error rate claimed -- which matters most for the high per-look levels of a
sequential plan. The order-statistic bound restores the guarantee; the hull keeps the recorded,
seeded bootstrap as the design asks while never reporting a narrower interval than the
distribution-free one. It is mildly conservative (the attainable levels are discrete: at 95 %
the exact coverage is 0.979 at n=10, 0.959 at n=20, 0.957 at n=30, 0.967 at n=50). It exists once
``2 * 0.5**n <= 1 - confidence`` (n >= 6 at 95 %, n >= 8 at 99 %; see `min_pairs_for`); with fewer
pairs no interval from the data can reach the requested level, so the result says
``calibrated: false`` and every verdict is ``inconclusive``.

A Wilcoxon signed-rank p-value (``scipy.stats.wilcoxon``, effect 0 as the null) is reported as a
second opinion; verdicts never use it.

Verdicts (exact rules, on the reported interval ``[L, U]`` in percent, min effect ``m >= 0``)
------------------------------------------------------------------------------------------
Primary, evaluated in this order, so the four outcomes partition every interval:

- ``regressed``      if ``U < 0``            (the whole interval is worse than zero)
- ``accepted``       if ``L >= m``           (the whole interval is at or beyond the minimum)
- ``below_minimum``  if ``0 <= U < m``       (the whole interval is short of the minimum, and not
  wholly worse than zero; it may still contain zero or small regressions: the candidate is not
  shown to reach the minimum, nor shown to regress)
- ``inconclusive``   otherwise, i.e. ``L < m <= U``.

With ``m = 0``, ``accepted`` means "not worse, at this confidence" and ``below_minimum`` cannot occur.

Constraint with a maximum regression ``r`` (``0 <= r < 100``, in percent on the same effect scale):

- ``ok``            if ``L >= -r``  (no part of the interval regresses by more than ``r``)
- ``violated``      if ``U < -r``   (the whole interval regresses by more than ``r``)
- ``inconclusive``  otherwise.

Both rules compare the reported percentages exactly, so anyone holding a result can re-check its
verdict from its own fields (`primary_verdict`, `constraint_verdict`).

Resolution (A/A)
----------------
Original-vs-original pairs give the noise floor: the interval of the A/A median at the plan's
confidence. The resolution is ``|median| + half-width`` of that interval (in log space, reported
in percent): the largest effect an A/A comparison of that many pairs shows inside its interval.
For another number of pairs ``n`` the half-width is scaled by ``sqrt(n_aa / n)`` (the median's
standard error goes as ``1/sqrt(n)``); the ``|median|`` part, a possible bias of the environment,
is kept whole. A minimum effect at or below the resolution cannot be confirmed: a true effect of
exactly the minimum would leave zero inside the interval.

Sequential looks (early stopping)
---------------------------------
A plan fixes, before any data, the pair counts at which the comparison may be looked at and splits
the error rate over the looks by a (weighted) Bonferroni split: look ``j`` uses confidence
``1 - w_j * (1 - confidence)`` with ``sum(w_j) = 1``. The event "some look's interval misses the
true effect" then has probability at most ``sum_j w_j * (1 - confidence) = 1 - confidence`` by
the union bound, whatever the dependence between looks, so every verdict reached at any look
keeps the plan's error rate. The comparison stops at the first look whose verdict is not
``inconclusive``. Each look uses the first ``looks[j]`` pairs (a prefix: pairs are measured in
order).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

Direction = Literal["lower", "higher"]
Verdict = Literal["accepted", "below_minimum", "regressed", "inconclusive"]
ConstraintVerdict = Literal["ok", "violated", "inconclusive"]
SequentialState = Literal["decided", "continue", "exhausted"]

DIRECTIONS: tuple[str, ...] = ("lower", "higher")
DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 4000
MIN_RESAMPLES = 100
METHOD = "median-log-ratio; hull(percentile bootstrap over pairs, order-statistic interval)"


@functools.cache
def scipy_stats() -> Any:
    """scipy.stats, imported on first use: the import costs ~1.2 s of every CLI start, and most
    commands (every one that only reads or writes records) never compute a statistic."""
    import scipy.stats

    return scipy.stats


@functools.cache
def _seed_kw() -> str:
    """scipy >= 1.15 seeds resampling through `rng`; older versions through `random_state`."""
    return "rng" if "rng" in inspect.signature(scipy_stats().bootstrap).parameters else "random_state"


# Bound the bootstrap's working array (resamples x pairs floats) to about 32 MB per batch.
_BATCH_ELEMENTS = 4_000_000


class StatsInputError(ValueError):
    """Bad input to the statistics; `field` names the offending argument."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PairedEstimate(_Model):
    """The median pair effect and its interval, with every input needed to recompute it."""

    metric: str | None = None
    n_pairs: int
    direction: Direction
    confidence: float
    seed: int
    resamples: int
    method: str = METHOD
    effect_pct: float = Field(description="median pair effect, 100*(exp(median log ratio)-1); + is better")
    ci_low_pct: float = Field(description="lower end of the reported interval (the hull), percent")
    ci_high_pct: float = Field(description="upper end of the reported interval (the hull), percent")
    median_log_ratio: float
    ci_low_log: float
    ci_high_log: float
    bootstrap_ci_low_pct: float
    bootstrap_ci_high_pct: float
    order_ranks: tuple[int, int] | None = Field(
        description="1-based ranks (k, n+1-k) of the order-statistic interval; null when n is too small"
    )
    order_coverage: float | None = Field(description="exact coverage of the order-statistic interval")
    calibrated: bool = Field(description="false when n is too small for any interval to reach the confidence")
    wilcoxon_p: float = Field(
        description="two-sided Wilcoxon signed-rank p-value against effect 0 (not used for verdicts)"
    )
    pair_log_ratios: list[float] | None = None
    versions: dict[str, str]


class Comparison(PairedEstimate):
    """The primary metric's paired comparison and its verdict."""

    kind: Literal["paired_comparison"] = "paired_comparison"
    min_effect_pct: float
    verdict: Verdict


class ConstraintCheck(PairedEstimate):
    """A constraint metric's paired comparison against its maximum regression."""

    kind: Literal["constraint_check"] = "constraint_check"
    max_regression_pct: float
    verdict: ConstraintVerdict


class Resolution(_Model):
    """The noise floor measured on original-vs-original (A/A) pairs."""

    kind: Literal["aa_resolution"] = "aa_resolution"
    estimate: PairedEstimate
    bias_log: float = Field(description="|median A/A log ratio|")
    half_width_log: float = Field(description="half the width of the A/A interval, log space")
    bias_detected: bool = Field(description="the A/A interval excludes zero")
    resolution_pct: float = Field(description="smallest resolvable effect at n_pairs, percent")

    def resolution_pct_at(self, pairs: int) -> float:
        """The resolution for an experiment of `pairs` pairs (half-width scaled by sqrt(n_aa/pairs))."""
        if isinstance(pairs, bool) or not isinstance(pairs, int | np.integer) or pairs < 2:
            raise StatsInputError("pairs", f"must be an integer >= 2, got {pairs!r}")
        scaled = self.bias_log + self.half_width_log * math.sqrt(self.estimate.n_pairs / int(pairs))
        return _pct(scaled)


class ResolutionCheck(_Model):
    kind: Literal["resolution_check"] = "resolution_check"
    min_effect_pct: float
    pairs: int
    resolution_pct: float
    resolvable: bool
    reason: str


class SequentialPlan(_Model):
    """Pre-declared looks (cumulative pair counts) and the confidence each look uses."""

    kind: Literal["sequential_plan"] = "sequential_plan"
    looks: list[int]
    confidence: float
    spending: Literal["weighted-bonferroni"] = "weighted-bonferroni"
    weights: list[float]
    look_confidences: list[float]

    @model_validator(mode="after")
    def _consistent(self) -> SequentialPlan:
        _check_plan(self.looks, self.confidence, self.weights)
        expected = _look_confidences(self.confidence, self.weights)
        if any(abs(a - b) > 1e-12 for a, b in zip(expected, self.look_confidences, strict=True)):
            raise ValueError("look_confidences do not follow from confidence and weights")
        return self


class SequentialComparison(_Model):
    kind: Literal["sequential_comparison"] = "sequential_comparison"
    plan: SequentialPlan
    direction: Direction
    min_effect_pct: float
    seed: int
    resamples: int
    n_pairs_available: int
    looks: list[Comparison] = Field(description="the comparison at each look evaluated, in order")
    state: SequentialState = Field(
        description="decided: a look gave a verdict other than inconclusive; continue: more looks remain; "
        "exhausted: the last look was inconclusive"
    )
    verdict: Verdict
    stopped_at_pairs: int
    next_look_pairs: int | None


# ---------------------------------------------------------------------------------------------
# input checks


def _check_direction(direction: Any) -> Direction:
    if direction not in DIRECTIONS:
        raise StatsInputError("direction", f"must be 'lower' or 'higher', got {direction!r}")
    return "lower" if direction == "lower" else "higher"


def _check_confidence(confidence: Any, field: str = "confidence") -> float:
    if isinstance(confidence, bool) or not isinstance(confidence, int | float | np.floating | np.integer):
        raise StatsInputError(field, f"must be a number in (0.5, 1), got {confidence!r}")
    c = float(confidence)
    if not (math.isfinite(c) and 0.5 < c < 1.0):
        raise StatsInputError(field, f"must be in (0.5, 1), got {c!r}")
    return c


def _check_pct(value: Any, field: str, upper: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
        raise StatsInputError(field, f"must be a number (percent), got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise StatsInputError(field, f"must be finite, got {v!r}")
    if v < 0:
        raise StatsInputError(field, f"must be >= 0 (percent), got {v!r}")
    if upper is not None and v >= upper:
        raise StatsInputError(field, f"must be < {upper:g} (percent), got {v!r}")
    return v


def _check_int(value: Any, field: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise StatsInputError(field, f"must be an integer >= {minimum}, got {value!r}")
    if int(value) < minimum:
        raise StatsInputError(field, f"must be >= {minimum}, got {int(value)}")
    return int(value)


def _as_samples(values: Any, field: str) -> np.ndarray:
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise StatsInputError(field, f"must be a 1-D array of numbers, got shape {values.shape}")
        if values.dtype.kind not in "iuf":
            raise StatsInputError(field, f"must hold numbers, got dtype {values.dtype}")
        arr = values.astype(float)
    else:
        if isinstance(values, str | bytes) or not isinstance(values, Sequence):
            raise StatsInputError(field, f"must be an array of numbers, got {type(values).__name__}")
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, int | float | np.floating | np.integer):
                raise StatsInputError(field, f"{field}[{i}] = {v!r} is not a number")
        arr = np.asarray(values, dtype=float)
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        i = int(bad[0])
        raise StatsInputError(field, f"{field}[{i}] = {float(arr[i])!r} is not finite")
    bad = np.flatnonzero(arr <= 0)
    if bad.size:
        i = int(bad[0])
        raise StatsInputError(field, f"{field}[{i}] = {float(arr[i])!r}: samples must be > 0 (log ratios)")
    return arr


def _pairs(reference: Any, candidate: Any) -> tuple[np.ndarray, np.ndarray]:
    ref = _as_samples(reference, "reference")
    cand = _as_samples(candidate, "candidate")
    if ref.size < 2:
        raise StatsInputError("reference", f"needs at least 2 samples (pairs), got {ref.size}")
    if cand.size != ref.size:
        raise StatsInputError(
            "candidate", f"has {cand.size} samples, reference has {ref.size}; samples pair by position"
        )
    return ref, cand


# ---------------------------------------------------------------------------------------------
# the estimate


def pair_log_ratios(reference: Any, candidate: Any, direction: str) -> np.ndarray:
    """Per-pair log ratios, oriented so that positive = candidate better in `direction`."""
    d = _check_direction(direction)
    ref, cand = _pairs(reference, candidate)
    out: np.ndarray = np.log(ref) - np.log(cand) if d == "lower" else np.log(cand) - np.log(ref)
    return out


def _pct(log_value: float) -> float:
    return float(math.expm1(log_value) * 100.0)


def min_pairs_for(confidence: float) -> int:
    """Fewest pairs for which an interval for the median can reach `confidence`:
    the smallest n with 2 * 0.5**n <= 1 - confidence (the order interval [d_(1), d_(n)])."""
    c = _check_confidence(confidence)
    n = 2
    while 2.0 * 0.5**n > 1.0 - c:
        n += 1
    return n


def order_rank(n: int, confidence: float) -> int:
    """Largest k >= 1 with 2 * P(Binomial(n, 1/2) <= k-1) <= 1 - confidence; 0 when none exists.
    The interval [d_(k), d_(n+1-k)] then covers the median with probability >= confidence."""
    return _order(_check_int(n, "n", 1), _check_confidence(confidence))[0]


def order_coverage(n: int, confidence: float) -> float | None:
    """Exact coverage 1 - 2 * P(Binomial(n, 1/2) <= k-1) of the order interval; None when k = 0."""
    return _order(_check_int(n, "n", 1), _check_confidence(confidence))[1]


@functools.lru_cache(maxsize=4096)
def _order(n: int, confidence: float) -> tuple[int, float | None]:
    alpha_half = (1.0 - confidence) / 2.0
    binom = scipy_stats().binom
    k = max(int(binom.ppf(alpha_half, n, 0.5)), 0)
    while k < n and binom.cdf(k, n, 0.5) <= alpha_half:
        k += 1
    while k >= 1 and binom.cdf(k - 1, n, 0.5) > alpha_half:
        k -= 1
    if k < 1:
        return 0, None
    return k, float(1.0 - 2.0 * binom.cdf(k - 1, n, 0.5))


def percentile_bootstrap(
    samples: tuple[np.ndarray, ...], statistic: Any, confidence: float, seed: int, resamples: int
) -> tuple[float, float]:
    """Seeded, vectorised percentile bootstrap of `statistic` over independent `samples`, in batches
    bounded by _BATCH_ELEMENTS (the one place the paired and the two-sample intervals draw)."""
    batch = max(1, min(resamples, _BATCH_ELEMENTS // sum(x.size for x in samples)))
    res = scipy_stats().bootstrap(
        samples,
        statistic,
        paired=False,
        n_resamples=resamples,
        batch=batch,
        vectorized=True,
        method="percentile",
        confidence_level=confidence,
        **{_seed_kw(): np.random.default_rng(seed)},
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def _bootstrap_ci(d: np.ndarray, confidence: float, seed: int, resamples: int) -> tuple[float, float]:
    if np.all(d == d[0]):
        return float(d[0]), float(d[0])  # every resample has this median
    return percentile_bootstrap((d,), np.median, confidence, seed, resamples)


def _wilcoxon_p(d: np.ndarray) -> float:
    if not np.any(d != 0):
        return 1.0  # every pair is a tie: no evidence of any effect
    return float(scipy_stats().wilcoxon(d).pvalue)


def _versions() -> dict[str, str]:
    import scipy

    return {"numpy": np.__version__, "scipy": scipy.__version__}


def _estimate_fields(
    d: np.ndarray, direction: Direction, confidence: float, seed: int, resamples: int, keep_pairs: bool
) -> dict[str, Any]:
    n = int(d.size)
    med = float(np.median(d))
    b_lo, b_hi = _bootstrap_ci(d, confidence, seed, resamples)
    k, coverage = _order(n, confidence)
    s = np.sort(d)
    ranks: tuple[int, int] | None = None
    if k >= 1:
        o_lo, o_hi = float(s[k - 1]), float(s[n - k])
        ranks = (k, n + 1 - k)
    else:  # too few pairs: the widest interval the data give, flagged as not calibrated
        o_lo, o_hi = float(s[0]), float(s[-1])
    lo, hi = min(b_lo, o_lo), max(b_hi, o_hi)
    return {
        "n_pairs": n,
        "direction": direction,
        "confidence": confidence,
        "seed": seed,
        "resamples": resamples,
        "effect_pct": _pct(med),
        "ci_low_pct": _pct(lo),
        "ci_high_pct": _pct(hi),
        "median_log_ratio": med,
        "ci_low_log": lo,
        "ci_high_log": hi,
        "bootstrap_ci_low_pct": _pct(b_lo),
        "bootstrap_ci_high_pct": _pct(b_hi),
        "order_ranks": ranks,
        "order_coverage": coverage,
        "calibrated": k >= 1,
        "wilcoxon_p": _wilcoxon_p(d),
        "pair_log_ratios": [float(x) for x in d] if keep_pairs else None,
        "versions": _versions(),
    }


def _common_args(
    reference: Any, candidate: Any, direction: Any, confidence: Any, seed: Any, resamples: Any
) -> tuple[np.ndarray, Direction, float, int, int]:
    dirn = _check_direction(direction)
    conf = _check_confidence(confidence)
    sd = _check_int(seed, "seed", 0)
    rs = _check_int(resamples, "resamples", MIN_RESAMPLES)
    d = pair_log_ratios(reference, candidate, dirn)
    return d, dirn, conf, sd, rs


def estimate(
    reference: Any,
    candidate: Any,
    *,
    direction: str,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
    resamples: int = DEFAULT_RESAMPLES,
    keep_pairs: bool = False,
    metric: str | None = None,
) -> PairedEstimate:
    """The median pair effect and its interval, without a verdict."""
    d, dirn, conf, sd, rs = _common_args(reference, candidate, direction, confidence, seed, resamples)
    return PairedEstimate(metric=metric, **_estimate_fields(d, dirn, conf, sd, rs, keep_pairs))


# ---------------------------------------------------------------------------------------------
# verdicts


def primary_verdict(ci_low_pct: float, ci_high_pct: float, min_effect_pct: float) -> Verdict:
    """The primary verdict for the interval [ci_low_pct, ci_high_pct]; rule in the module docstring."""
    if ci_high_pct < 0:
        return "regressed"
    if ci_low_pct >= min_effect_pct:
        return "accepted"
    if ci_high_pct < min_effect_pct:
        return "below_minimum"
    return "inconclusive"


def constraint_verdict(ci_low_pct: float, ci_high_pct: float, max_regression_pct: float) -> ConstraintVerdict:
    """The constraint verdict for the interval [ci_low_pct, ci_high_pct]; rule in the module docstring."""
    if ci_low_pct >= -max_regression_pct:
        return "ok"
    if ci_high_pct < -max_regression_pct:
        return "violated"
    return "inconclusive"


def compare(
    reference: Any,
    candidate: Any,
    *,
    direction: str,
    min_effect_pct: float,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
    resamples: int = DEFAULT_RESAMPLES,
    keep_pairs: bool = False,
    metric: str | None = None,
) -> Comparison:
    """Paired comparison of the primary metric: reference[i] and candidate[i] form pair i."""
    m = _check_pct(min_effect_pct, "min_effect_pct")
    d, dirn, conf, sd, rs = _common_args(reference, candidate, direction, confidence, seed, resamples)
    fields = _estimate_fields(d, dirn, conf, sd, rs, keep_pairs)
    verdict: Verdict = (
        primary_verdict(fields["ci_low_pct"], fields["ci_high_pct"], m)
        if fields["calibrated"]
        else "inconclusive"
    )
    return Comparison(metric=metric, min_effect_pct=m, verdict=verdict, **fields)


def recompute(result: Comparison, reference: Any, candidate: Any) -> Comparison:
    """Re-run `compare` with the inputs recorded in `result` (equal on the same numpy/scipy)."""
    return compare(
        reference,
        candidate,
        direction=result.direction,
        min_effect_pct=result.min_effect_pct,
        confidence=result.confidence,
        seed=result.seed,
        resamples=result.resamples,
        keep_pairs=result.pair_log_ratios is not None,
        metric=result.metric,
    )


def constraint_check(
    reference: Any,
    candidate: Any,
    *,
    direction: str,
    max_regression_pct: float,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
    resamples: int = DEFAULT_RESAMPLES,
    keep_pairs: bool = False,
    metric: str | None = None,
) -> ConstraintCheck:
    """Paired comparison of a constraint metric against its maximum regression (percent)."""
    r = _check_pct(max_regression_pct, "max_regression_pct", upper=100.0)
    d, dirn, conf, sd, rs = _common_args(reference, candidate, direction, confidence, seed, resamples)
    fields = _estimate_fields(d, dirn, conf, sd, rs, keep_pairs)
    verdict: ConstraintVerdict = (
        constraint_verdict(fields["ci_low_pct"], fields["ci_high_pct"], r)
        if fields["calibrated"]
        else "inconclusive"
    )
    return ConstraintCheck(metric=metric, max_regression_pct=r, verdict=verdict, **fields)


# ---------------------------------------------------------------------------------------------
# resolution from A/A pairs


def resolution(
    aa_reference: Any,
    aa_candidate: Any,
    *,
    direction: str,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
    resamples: int = DEFAULT_RESAMPLES,
    keep_pairs: bool = False,
    metric: str | None = None,
) -> Resolution:
    """The noise floor from original-vs-original pairs (see the module docstring)."""
    try:
        est = estimate(
            aa_reference,
            aa_candidate,
            direction=direction,
            confidence=confidence,
            seed=seed,
            resamples=resamples,
            keep_pairs=keep_pairs,
            metric=metric,
        )
    except StatsInputError as err:
        if err.field in ("reference", "candidate"):
            raise StatsInputError(f"aa_{err.field}", err.message) from None
        raise
    bias = abs(est.median_log_ratio)
    half = (est.ci_high_log - est.ci_low_log) / 2.0
    return Resolution(
        estimate=est,
        bias_log=bias,
        half_width_log=half,
        bias_detected=bool(est.ci_low_log > 0 or est.ci_high_log < 0),
        resolution_pct=_pct(bias + half),
    )


def check_min_effect(res: Resolution, min_effect_pct: float, pairs: int | None = None) -> ResolutionCheck:
    """Whether `min_effect_pct` is above the resolution for an experiment of `pairs` pairs
    (default: as many pairs as the A/A baseline)."""
    m = _check_pct(min_effect_pct, "min_effect_pct")
    n = res.estimate.n_pairs if pairs is None else _check_int(pairs, "pairs", 2)
    floor = res.resolution_pct_at(n)
    ok = m > floor and res.estimate.calibrated
    if not res.estimate.calibrated:
        reason = (
            f"the A/A baseline has {res.estimate.n_pairs} pairs, too few for an interval at "
            f"{res.estimate.confidence:g} confidence (need {min_pairs_for(res.estimate.confidence)})"
        )
    elif ok:
        reason = f"minimum effect {m:g}% is above the resolution {floor:.3g}% at {n} pairs"
    else:
        reason = (
            f"minimum effect {m:g}% is at or below the resolution {floor:.3g}% at {n} pairs: "
            "an effect of that size cannot be confirmed in this environment"
        )
    return ResolutionCheck(min_effect_pct=m, pairs=n, resolution_pct=floor, resolvable=ok, reason=reason)


# ---------------------------------------------------------------------------------------------
# sequential looks


def _look_confidences(confidence: float, weights: Sequence[float]) -> list[float]:
    alpha = 1.0 - confidence
    return [1.0 - w * alpha for w in weights]


def _check_plan(looks: Sequence[Any], confidence: float, weights: Sequence[Any]) -> None:
    if not looks:
        raise StatsInputError("looks", "needs at least one look")
    for i, n in enumerate(looks):
        _check_int(n, f"looks[{i}]", 2)
    if any(b <= a for a, b in zip(looks, looks[1:], strict=False)):
        raise StatsInputError("looks", f"pair counts must be strictly increasing, got {list(looks)}")
    if len(weights) != len(looks):
        raise StatsInputError("weights", f"needs one weight per look ({len(looks)}), got {len(weights)}")
    for i, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, int | float) or not (math.isfinite(w) and w > 0):
            raise StatsInputError("weights", f"weights[{i}] = {w!r} must be a positive number")
    if abs(sum(weights) - 1.0) > 1e-9:
        raise StatsInputError("weights", f"must sum to 1, got {sum(weights)!r}")
    for i, c in enumerate(_look_confidences(confidence, weights)):
        need = min_pairs_for(c)
        if looks[i] < need:
            raise StatsInputError(
                "looks",
                f"look {i} at {looks[i]} pairs cannot reach its confidence {c:.6g}; it needs at least {need} pairs",
            )


def sequential_plan(
    looks: Sequence[int], confidence: float = DEFAULT_CONFIDENCE, weights: Sequence[float] | None = None
) -> SequentialPlan:
    """A plan of looks at cumulative pair counts; `weights` split 1 - confidence over the looks
    (default: equally, i.e. plain Bonferroni)."""
    conf = _check_confidence(confidence)
    if isinstance(looks, str | bytes) or not isinstance(looks, Sequence):
        raise StatsInputError("looks", f"must be a list of pair counts, got {looks!r}")
    if weights is None:
        w = [1.0 / len(looks)] * len(looks) if len(looks) else []
    else:
        if isinstance(weights, str | bytes) or not isinstance(weights, Sequence):
            raise StatsInputError("weights", f"must be a list of positive numbers, got {weights!r}")
        for i, x in enumerate(weights):
            if isinstance(x, bool) or not isinstance(x, int | float) or not (math.isfinite(x) and x > 0):
                raise StatsInputError("weights", f"weights[{i}] = {x!r} must be a positive number")
        total = float(sum(weights))
        w = [float(x) / total for x in weights]  # proportional split of 1 - confidence
    _check_plan(looks, conf, w)
    return SequentialPlan(
        looks=[int(n) for n in looks],
        confidence=conf,
        weights=[float(x) for x in w],
        look_confidences=_look_confidences(conf, [float(x) for x in w]),
    )


def evenly_spaced_looks(min_pairs: int, max_pairs: int, count: int) -> list[int]:
    """`count` look pair counts from `min_pairs` to `max_pairs`, evenly spaced (rounded)."""
    lo = _check_int(min_pairs, "min_pairs", 2)
    hi = _check_int(max_pairs, "max_pairs", lo)
    k = _check_int(count, "count", 1)
    if k == 1:
        return [hi]
    if hi - lo < k - 1:
        raise StatsInputError("count", f"{k} distinct looks do not fit between {lo} and {hi} pairs")
    return [round(lo + i * (hi - lo) / (k - 1)) for i in range(k)]


def sequential_compare(
    reference: Any,
    candidate: Any,
    *,
    plan: SequentialPlan,
    direction: str,
    min_effect_pct: float,
    seed: int = 0,
    resamples: int = DEFAULT_RESAMPLES,
    keep_pairs: bool = False,
    metric: str | None = None,
) -> SequentialComparison:
    """Evaluate the plan's looks that the available pairs reach, in order, stopping at the first
    look whose verdict is not `inconclusive`. Look j uses the first plan.looks[j] pairs at
    plan.look_confidences[j]."""
    if not isinstance(plan, SequentialPlan):
        raise StatsInputError("plan", f"must be a SequentialPlan, got {type(plan).__name__}")
    m = _check_pct(min_effect_pct, "min_effect_pct")
    dirn = _check_direction(direction)
    sd = _check_int(seed, "seed", 0)
    rs = _check_int(resamples, "resamples", MIN_RESAMPLES)
    ref, cand = _pairs(reference, candidate)
    n = int(ref.size)
    if n < plan.looks[0]:
        raise StatsInputError(
            "reference", f"has {n} pairs, fewer than the plan's first look at {plan.looks[0]}"
        )
    done: list[Comparison] = []
    for look, conf in zip(plan.looks, plan.look_confidences, strict=True):
        if look > n:
            break
        c = compare(
            ref[:look],
            cand[:look],
            direction=dirn,
            min_effect_pct=m,
            confidence=conf,
            seed=sd,
            resamples=rs,
            metric=metric,
        )
        done.append(c)
        if c.verdict != "inconclusive":
            break
    final = done[-1]
    if keep_pairs:
        final = final.model_copy(
            update={"pair_log_ratios": [float(x) for x in pair_log_ratios(ref, cand, dirn)[: final.n_pairs]]}
        )
        done[-1] = final
    n_done = len(done)
    state: SequentialState
    if final.verdict != "inconclusive":
        state, nxt = "decided", None
    elif n_done == len(plan.looks):
        state, nxt = "exhausted", None
    else:
        state, nxt = "continue", plan.looks[n_done]
    return SequentialComparison(
        plan=plan,
        direction=dirn,
        min_effect_pct=m,
        seed=sd,
        resamples=rs,
        n_pairs_available=n,
        looks=done,
        state=state,
        verdict=final.verdict,
        stopped_at_pairs=final.n_pairs,
        next_look_pairs=nxt,
    )


__all__ = [
    "DEFAULT_CONFIDENCE",
    "DEFAULT_RESAMPLES",
    "DIRECTIONS",
    "METHOD",
    "Comparison",
    "ConstraintCheck",
    "ConstraintVerdict",
    "Direction",
    "PairedEstimate",
    "Resolution",
    "ResolutionCheck",
    "SequentialComparison",
    "SequentialPlan",
    "SequentialState",
    "StatsInputError",
    "Verdict",
    "check_min_effect",
    "compare",
    "constraint_check",
    "constraint_verdict",
    "estimate",
    "evenly_spaced_looks",
    "min_pairs_for",
    "order_coverage",
    "order_rank",
    "pair_log_ratios",
    "primary_verdict",
    "recompute",
    "resolution",
    "sequential_compare",
    "sequential_plan",
]
