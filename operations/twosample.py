"""Two independent samples: the relative difference of medians and its interval (cko audit --stack).

A stack audit measures two Targets' originals in two different images, so no sample of one has a
partner in the other: the paired statistics of `stats.py` do not apply. What is estimated is the
difference of the two medians in log space, oriented like `stats.py` (positive = the second sample,
the "to" stack, is better in the metric's direction); reported in percent as ``100*(exp(d)-1)``.

The interval is the hull of two intervals, for the reason `stats.py` gives for the paired case
(never narrower than what is guaranteed, while keeping the seeded bootstrap on record):

1. the percentile bootstrap of ``median(log b) - median(log a)``, the two samples resampled
   independently (``scipy.stats.bootstrap(paired=False)``, seeded);
2. the distribution-free Mann-Whitney interval for a shift of the log values: the order statistics
   ``[D_(c), D_(nm+1-c)]`` of the ``n*m`` differences, ``c`` the largest count with
   ``2 * P(U <= c-1) <= 1 - confidence`` under the exact null distribution of U (no ties). Its
   coverage holds for any continuous distribution under the location-shift model (a multiplicative
   effect on the raw values), which is how a changed stack usually moves a time.

It exists once ``2 / C(n+m, n) <= 1 - confidence`` (4 and 4 at 95 %); with fewer samples the
result says ``calibrated: false`` and the verdict is ``inconclusive``.

Verdict (exact rule on the reported interval ``[L, U]`` in percent, minimum effect ``m >= 0``):

- ``no_difference`` if ``-m < L`` and ``U < m``: every effect the interval allows is smaller than
  the minimum (it may still exclude zero: ``excludes_zero`` says so);
- ``slower``        if ``U < 0``: wholly worse, and not wholly inside the minimum;
- ``faster``        if ``L > 0``: wholly better, and not wholly inside the minimum;
- ``inconclusive``  otherwise.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Literal

import numpy as np

from .stats import (
    DEFAULT_CONFIDENCE,
    DEFAULT_RESAMPLES,
    MIN_RESAMPLES,
    Direction,
    StatsInputError,
    _as_samples,
    _check_confidence,
    _check_direction,
    _check_int,
    _check_pct,
    _Model,
    _pct,
    _versions,
    percentile_bootstrap,
    scipy_stats,
)

StackVerdict = Literal["faster", "slower", "no_difference", "inconclusive"]
METHOD = "difference of log medians; hull(percentile bootstrap, two samples; Mann-Whitney shift interval)"


class TwoSampleComparison(_Model):
    """One case of a stack audit: the "from" sample against the "to" sample, and its verdict."""

    kind: Literal["two_sample_comparison"] = "two_sample_comparison"
    metric: str | None = None
    n_reference: int
    n_candidate: int
    direction: Direction
    confidence: float
    seed: int
    resamples: int
    method: str = METHOD
    min_effect_pct: float
    reference_median: float
    candidate_median: float
    effect_pct: float  # 100*(exp(log median difference)-1); + is the candidate ("to") better
    ci_low_pct: float
    ci_high_pct: float
    log_effect: float
    ci_low_log: float
    ci_high_log: float
    bootstrap_ci_low_pct: float
    bootstrap_ci_high_pct: float
    rank_ci_low_pct: float
    rank_ci_high_pct: float
    hodges_lehmann_pct: float  # the shift the rank interval is centred on
    rank_coverage: float | None  # exact coverage of the rank interval; None when none exists
    calibrated: bool
    mannwhitney_p: float  # two-sided, against no shift (not used for the verdict)
    excludes_zero: bool
    verdict: StackVerdict
    versions: dict[str, str]


def stack_verdict(ci_low_pct: float, ci_high_pct: float, min_effect_pct: float) -> StackVerdict:
    """The verdict for the interval [ci_low_pct, ci_high_pct]; rule in the module docstring."""
    if -min_effect_pct < ci_low_pct and ci_high_pct < min_effect_pct:
        return "no_difference"
    if ci_high_pct < 0:
        return "slower"
    if ci_low_pct > 0:
        return "faster"
    return "inconclusive"


@functools.lru_cache(maxsize=256)
def _u_counts(n: int, m: int) -> tuple[int, ...]:
    """How many arrangements give each value of Mann-Whitney U for samples of n and m (no ties):
    the coefficients of the Gaussian binomial [n+m choose m]_q, built as
    prod_{i=1..m} (1 - q^(n+i)) / (1 - q^i) in exact integers."""
    size = n * m + 1
    poly = np.zeros(size, dtype=object)
    poly[0] = 1
    for i in range(1, m + 1):
        step = n + i
        if step < size:
            poly[step:] = poly[step:] - poly[:-step].copy()
        for r in range(i):  # dividing by (1 - q^i): a running sum along each residue class mod i
            poly[r::i] = np.cumsum(poly[r::i])
    return tuple(int(x) for x in poly)


def rank_rank(n: int, m: int, confidence: float) -> tuple[int, float | None]:
    """(c, coverage): the largest c >= 1 with 2 * P(U <= c-1) <= 1 - confidence, or (0, None)."""
    counts = _u_counts(n, m)
    total = math.comb(n + m, n)
    alpha_half = (1.0 - confidence) / 2.0
    c, tail = 0, 0
    while c < len(counts) and (tail + counts[c]) / total <= alpha_half:
        tail += counts[c]
        c += 1
    if c < 1:
        return 0, None
    return c, 1.0 - 2.0 * tail / total


def _oriented(a: np.ndarray, b: np.ndarray, direction: Direction) -> tuple[np.ndarray, np.ndarray]:
    """Log samples arranged so that (second - first) > 0 means the candidate is better."""
    la, lb = np.log(a), np.log(b)
    return (-la, -lb) if direction == "lower" else (la, lb)


def _bootstrap(
    x: np.ndarray, y: np.ndarray, confidence: float, seed: int, resamples: int
) -> tuple[float, float]:
    if np.all(x == x[0]) and np.all(y == y[0]):
        d = float(y[0] - x[0])
        return d, d  # every resample gives this difference

    def stat(xs: np.ndarray, ys: np.ndarray, axis: int = -1) -> Any:
        return np.median(ys, axis=axis) - np.median(xs, axis=axis)

    return percentile_bootstrap((x, y), stat, confidence, seed, resamples)


def _rank_interval(
    x: np.ndarray, y: np.ndarray, confidence: float
) -> tuple[float, float, float, int, float | None]:
    """(low, high, Hodges-Lehmann shift, c, coverage) of the shift y - x."""
    diffs = np.sort((y[None, :] - x[:, None]).ravel())
    c, coverage = rank_rank(x.size, y.size, confidence)
    hl = float(np.median(diffs))
    if c < 1:  # too few samples: the widest interval the data give, flagged as not calibrated
        return float(diffs[0]), float(diffs[-1]), hl, c, coverage
    return float(diffs[c - 1]), float(diffs[diffs.size - c]), hl, c, coverage


def _mannwhitney_p(x: np.ndarray, y: np.ndarray) -> float:
    if np.all(x == x[0]) and np.all(y == y[0]) and x[0] == y[0]:
        return 1.0
    return float(scipy_stats().mannwhitneyu(y, x, alternative="two-sided").pvalue)


def compare_two(
    reference: Any,
    candidate: Any,
    *,
    direction: str,
    min_effect_pct: float,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
    resamples: int = DEFAULT_RESAMPLES,
    metric: str | None = None,
) -> TwoSampleComparison:
    """The candidate sample against the reference sample (independent, any sizes >= 2)."""
    dirn = _check_direction(direction)
    m = _check_pct(min_effect_pct, "min_effect_pct")
    conf = _check_confidence(confidence)
    sd = _check_int(seed, "seed", 0)
    rs = _check_int(resamples, "resamples", MIN_RESAMPLES)
    a, b = _as_samples(reference, "reference"), _as_samples(candidate, "candidate")
    for name, arr in (("reference", a), ("candidate", b)):
        if arr.size < 2:
            raise StatsInputError(name, f"needs at least 2 samples, got {arr.size}")
    x, y = _oriented(a, b, dirn)
    d = float(np.median(y) - np.median(x))
    b_lo, b_hi = _bootstrap(x, y, conf, sd, rs)
    r_lo, r_hi, hl, c, coverage = _rank_interval(x, y, conf)
    lo, hi = min(b_lo, r_lo, d), max(b_hi, r_hi, d)
    lo_pct, hi_pct = _pct(lo), _pct(hi)
    return TwoSampleComparison(
        metric=metric,
        n_reference=int(a.size),
        n_candidate=int(b.size),
        direction=dirn,
        confidence=conf,
        seed=sd,
        resamples=rs,
        min_effect_pct=m,
        reference_median=float(np.median(a)),
        candidate_median=float(np.median(b)),
        effect_pct=_pct(d),
        ci_low_pct=lo_pct,
        ci_high_pct=hi_pct,
        log_effect=d,
        ci_low_log=lo,
        ci_high_log=hi,
        bootstrap_ci_low_pct=_pct(b_lo),
        bootstrap_ci_high_pct=_pct(b_hi),
        rank_ci_low_pct=_pct(r_lo),
        rank_ci_high_pct=_pct(r_hi),
        hodges_lehmann_pct=_pct(hl),
        rank_coverage=coverage,
        calibrated=c >= 1,
        mannwhitney_p=_mannwhitney_p(x, y),
        excludes_zero=lo > 0 or hi < 0,
        verdict=stack_verdict(lo_pct, hi_pct, m) if c >= 1 else "inconclusive",
        versions=_versions(),
    )
