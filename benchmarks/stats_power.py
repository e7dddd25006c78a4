"""How many measurements does a true effect need, and how often does noise pass for one?

cko's paired test (operations.stats.compare: median pair log ratio, interval = hull of the seeded
percentile bootstrap and the order-statistic interval, accepted when the whole interval is at or
beyond the minimum effect) against a KernelBench-style harness: N timed runs of the reference,
then N of the candidate, speedup = mean(reference) / mean(candidate), counted "faster" when the
speedup exceeds 1 (or a threshold 1 + min effect). Both spend 2N runs.

Synthetic workload: time = T * exp(drift_t + noise) with lognormal noise (sigma = 1 %, 2 %, 5 %
per run) and, in the drift scenario, a slow random walk drift_t (per-run step 0.2 %) shared by
everything measured at that time (over the 200 runs of a 100-run harness that walk has wandered by
about 1.4 %: a slow clock or thermal drift). cko measures pair i at consecutive times in ABBA order (pairs
alternate AB, BA), so the drift is (almost) common to the pair and cancels in its ratio; the
KernelBench-style harness measures in two blocks, so the drift between the blocks adds to the
difference of the means and does not shrink with N.

For each noise level and scenario it prints the smallest N (pairs for cko, runs of each for the
harness) at which a true 2 % effect is accepted with probability >= 80 %, and the false-positive
rate on A/A data (no effect) at that same N; then, at a fixed budget of 100 runs each (pairs for
cko), both rates side by side. A last table measures the coverage of cko's
interval and of the percentile bootstrap alone (the reason for the hull).

    .venv/bin/python benchmarks/stats_power.py [--trials 200] [--resamples 1000] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from cko_perf.operations import stats as st

GRID = [5, 10, 15, 20, 30, 40, 60, 80, 100, 150, 200, 300, 400, 600, 800, 1200, 1600]
NOISE = [0.01, 0.02, 0.05]
DRIFT_STEP = 0.001
BUDGET = 100  # KernelBench times 100 runs of each by default


def _times(rng: np.random.Generator, count: int, sigma: float, drift: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-run log drift at times 0..count-1 and per-run lognormal noise."""
    walk = np.cumsum(rng.normal(0.0, drift, count)) if drift else np.zeros(count)
    return walk, rng.normal(0.0, sigma, count)


def paired_samples(
    rng: np.random.Generator, n: int, sigma: float, drift: float, effect_pct: float
) -> tuple[np.ndarray, np.ndarray]:
    """n pairs in ABBA order: pair i occupies times 2i, 2i+1; AB for even i, BA for odd i."""
    walk, noise = _times(rng, 2 * n, sigma, drift)
    g = math.log1p(effect_pct / 100.0)
    first = np.arange(0, 2 * n, 2)
    ref_t = np.where(np.arange(n) % 2 == 0, first, first + 1)
    cand_t = np.where(np.arange(n) % 2 == 0, first + 1, first)
    ref = np.exp(walk[ref_t] + noise[ref_t])
    cand = np.exp(walk[cand_t] + noise[cand_t] - g)
    return ref, cand


def block_samples(
    rng: np.random.Generator, n: int, sigma: float, drift: float, effect_pct: float
) -> tuple[np.ndarray, np.ndarray]:
    """N runs of the reference (times 0..N-1), then N of the candidate (times N..2N-1)."""
    walk, noise = _times(rng, 2 * n, sigma, drift)
    g = math.log1p(effect_pct / 100.0)
    return np.exp(walk[:n] + noise[:n]), np.exp(walk[n:] + noise[n:] - g)


def cko_accepts(rng, n, sigma, drift, effect_pct, min_effect, resamples, seed) -> bool:  # type: ignore[no-untyped-def]
    ref, cand = paired_samples(rng, n, sigma, drift, effect_pct)
    c = st.compare(ref, cand, direction="lower", min_effect_pct=min_effect, seed=seed, resamples=resamples)
    return c.verdict == "accepted"


def harness_faster(rng, n, sigma, drift, effect_pct, threshold) -> bool:  # type: ignore[no-untyped-def]
    ref, cand = block_samples(rng, n, sigma, drift, effect_pct)
    return float(np.mean(ref) / np.mean(cand)) > threshold


def rate(fn, trials: int) -> float:  # type: ignore[no-untyped-def]
    return sum(bool(fn(t)) for t in range(trials)) / trials


def smallest_n(power_at, monotone: bool, target: float = 0.8) -> int | None:  # type: ignore[no-untyped-def]
    """Smallest grid N with power_at(N) >= target. cko's paired power rises with N, so it is found by
    bisection over the grid; the block harness under drift is not monotone (the walk between its
    two blocks grows with N), so it is scanned upwards from the smallest N."""
    if not monotone:
        return next((n for n in GRID if power_at(n) >= target), None)
    cache: dict[int, float] = {}

    def p(i: int) -> float:
        if i not in cache:
            cache[i] = power_at(GRID[i])
        return cache[i]

    if p(len(GRID) - 1) < target:
        return None
    lo, hi = -1, len(GRID) - 1  # p(hi) >= target; lo is below or unknown
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if p(mid) >= target:
            hi = mid
        else:
            lo = mid
    return GRID[hi]


def point(
    args: argparse.Namespace,
    rule: tuple[str, float | None],
    sigma: float,
    drift: float,
    n: int,
    effect: float,
) -> float:
    """Rate of "accepted" (cko) or "faster" (harness) over args.trials trials at one (N, effect)."""
    kind, value = rule
    assert value is not None
    rng = np.random.default_rng([args.seed, int(sigma * 1e4), int(drift * 1e4), n, int(effect * 1000)])
    if kind == "cko":
        return rate(
            lambda t: cko_accepts(rng, n, sigma, drift, effect, value, args.resamples, args.seed + t),
            args.trials,
        )
    return rate(lambda t: harness_faster(rng, n, sigma, drift, effect, value), args.trials)


def _rules(args: argparse.Namespace) -> list[tuple[str, tuple[str, float | None]]]:
    return [
        (f"cko paired, min effect {args.min_effect:g}%", ("cko", args.min_effect)),
        ("cko paired, min effect 0%", ("cko", 0.0)),
        ("harness: mean faster (speedup > 1)", ("harness", 1.0)),
        (f"harness: speedup > 1 + {args.min_effect:g}%", ("harness", 1.0 + args.min_effect / 100.0)),
    ]


def power_table(args: argparse.Namespace) -> list[list[str]]:
    rows = []
    for drift in (0.0, DRIFT_STEP):
        for sigma in NOISE:
            for label, rule in _rules(args):
                n80 = smallest_n(
                    lambda n, rule=rule, sigma=sigma, drift=drift: point(
                        args, rule, sigma, drift, n, args.effect
                    ),
                    monotone=rule[0] == "cko",
                )
                fp = point(args, rule, sigma, drift, n80, 0.0) if n80 is not None else float("nan")
                rows.append(
                    [
                        "random walk" if drift else "none",
                        f"{sigma * 100:g}%",
                        label,
                        str(n80) if n80 is not None else f"> {GRID[-1]}",
                        f"{2 * n80}" if n80 is not None else "-",
                        f"{fp:.3f}" if not math.isnan(fp) else "-",
                    ]
                )
    return rows


def budget_table(args: argparse.Namespace) -> list[list[str]]:
    rows = []
    for drift in (0.0, DRIFT_STEP):
        for sigma in NOISE:
            for label, rule in _rules(args):
                power = point(args, rule, sigma, drift, BUDGET, args.effect)
                fp = point(args, rule, sigma, drift, BUDGET, 0.0)
                rows.append(
                    [
                        "random walk" if drift else "none",
                        f"{sigma * 100:g}%",
                        label,
                        f"{power:.3f}",
                        f"{fp:.3f}",
                    ]
                )
    return rows


def coverage_table(args: argparse.Namespace) -> list[list[str]]:
    rows = []
    rng = np.random.default_rng([args.seed, 77])
    trials = args.coverage_trials
    for conf in (0.95, 0.9875):
        for n in (10, 20, 30, 50, 100):
            hull = boot = 0
            for t in range(trials):
                ref, cand = paired_samples(rng, n, 0.02, 0.0, 3.0)
                e = st.estimate(
                    ref, cand, direction="lower", confidence=conf, seed=t, resamples=args.resamples
                )
                hull += e.ci_low_pct <= 3.0 <= e.ci_high_pct
                boot += e.bootstrap_ci_low_pct <= 3.0 <= e.bootstrap_ci_high_pct
            se = math.sqrt(conf * (1 - conf) / trials)
            exact = st.order_coverage(n, conf)
            rows.append(
                [
                    f"{conf:g}",
                    str(n),
                    f"{boot / trials:.4f}",
                    f"{hull / trials:.4f}",
                    f"{exact:.4f}" if exact is not None else "-",
                    f"{se:.4f}",
                ]
            )
    return rows


def show(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print(f"\n{title}")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=200, help="trials per (N, effect) estimate")
    ap.add_argument("--coverage-trials", type=int, default=1000)
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--effect", type=float, default=2.0, help="true effect, percent")
    ap.add_argument("--min-effect", type=float, default=1.0, help="cko's minimum effect, percent")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-coverage", action="store_true")
    args = ap.parse_args()

    t0 = time.time()
    show(
        f"N for >= 80% acceptance of a true {args.effect:g}% speedup, and the A/A false-positive rate at "
        f"that N ({args.trials} trials per point, Monte-Carlo s.e. <= {0.5 / math.sqrt(args.trials):.3f}; "
        f"drift step {DRIFT_STEP * 100:g}% per run)",
        ["drift", "noise", "rule", "N", "runs", "A/A false-positive rate"],
        power_table(args),
    )
    show(
        f"fixed budget: {BUDGET} runs of each (cko: {BUDGET} pairs); rate of 'accepted'/'faster' with a true "
        f"{args.effect:g}% speedup and with none (A/A)",
        ["drift", "noise", "rule", f"power at true {args.effect:g}%", "A/A false-positive rate"],
        budget_table(args),
    )
    if not args.skip_coverage:
        show(
            f"coverage of the interval for the median effect (true +3%, noise 2%, {args.coverage_trials} trials): "
            "percentile bootstrap alone vs cko's hull",
            ["confidence", "n", "percentile only", "cko hull", "order exact", "s.e."],
            coverage_table(args),
        )
    print(f"\n({time.time() - t0:.0f} s; seed {args.seed}, {args.resamples} bootstrap resamples)")


if __name__ == "__main__":
    main()
