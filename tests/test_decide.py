"""`decide` on synthetic samples (issue 19): pure, fast, no engine.

A/A false accepts stay at or below 5% at every plan the examples use; unbalanced foreign load voids a
verdict and balanced load does not; the outcome is accepted only with every constraint ok.
"""

from __future__ import annotations

import json
import math
import zlib

import numpy as np
import pytest

from cko_perf.operations.protocol import Accuracy, DriverResult, Metric, Series
from cko_perf.operations.stats import evenly_spaced_looks, sequential_plan
from cko_perf.runner.workflow.decide import VOID_OUTCOMES, decide
from cko_perf.runner.workflow.requests import Constraint, Gate, LoadCeiling, Objective, StatsPlan
from cko_perf.runner.workflow.verdicts import DecidePlan, Reason, SampleLoad, Telemetry, WindowLoad
from tests.conftest import ROOT

TIME = Metric(name="time", unit="ms", direction="lower")
P99 = Metric(name="p99", unit="ms", direction="lower")
OK = Accuracy(passed=True, checks=1, worst_rel_l2=1e-12)


def _series(subject: str, case: str, values: dict[str, list[float]], acc: Accuracy = OK) -> Series:
    n = len(next(iter(values.values())))
    return Series(subject=subject, case=case, reps=list(range(n)), samples=values, accuracy=acc)


def result(
    ref: dict[str, list[float]],
    cand: dict[str, list[float]],
    cases: tuple[str, ...] = ("c",),
    cand_acc: Accuracy = OK,
    integrity: list[str] | None = None,
) -> DriverResult:
    series = []
    for c in cases:
        series += [_series("reference", c, ref), _series("candidate", c, cand, cand_acc)]
    return DriverResult(
        protocol="cko/driver-v1",
        mode="measure",
        series=series,
        integrity=integrity or [],
        units={m: "ms" for m in ref},
    )


def plan(
    stats: StatsPlan,
    stage: str = "target",
    min_effect: float = 5.0,
    constraints: list[Constraint] | None = None,
    sequential_looks: list[int] | None = None,
    seed: int = 0,
    **kw: object,
) -> DecidePlan:
    seq = sequential_plan(sequential_looks, confidence=stats.confidence) if sequential_looks else None
    return DecidePlan(
        stage=stage,
        objective=Objective(
            primary=TIME,
            min_effect_pct=min_effect,  # type: ignore[arg-type]
            constraints=constraints or [],
        ),
        stats=stats,
        seed=seed,
        sequential=seq,
        ceiling=stats.load,
        **kw,
    )  # type: ignore[arg-type]


def example_plans() -> list[tuple[str, StatsPlan, str, int, list[int] | None, float]]:
    """(name, plan, stage, pairs, looks, min effect) for every stage every bundled example declares
    (an audit re-runs the target stage's plan: the same statistics)."""
    out = []
    for ex in sorted((ROOT / "examples").iterdir()):
        req = json.loads((ex / "readiness.json").read_text())
        sp = StatsPlan.model_validate(req["plan"])
        m = float(req["objective"]["min_effect_pct"])
        out.append((f"{ex.name}/screen", sp, "screen", sp.screen_pairs, None, m))
        out.append((f"{ex.name}/target", sp, "target", sp.target_pairs, None, m))
        looks = evenly_spaced_looks(sp.min_pairs, sp.target_pairs, 3)
        out.append((f"{ex.name}/target-sequential", sp, "target", sp.target_pairs, looks, m))
    return out


def aa_samples(rng: np.random.Generator, n: int) -> tuple[list[float], list[float]]:
    """Original against itself: a drift common to each pair, heavy-tailed noise per sample."""
    drift = np.exp(np.cumsum(rng.normal(0, 0.01, n)))
    noise = lambda: np.exp(0.08 * rng.standard_t(3, n))  # noqa: E731
    return list(10.0 * drift * noise()), list(10.0 * drift * noise())


SEEDS = 200


@pytest.mark.parametrize(
    "name,sp,stage,pairs,looks,m", example_plans(), ids=lambda x: x if isinstance(x, str) else ""
)
def test_aa_false_accepts_at_most_5_percent(name, sp, stage, pairs, looks, m) -> None:
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    accepted = {m: 0, 0.001: 0}  # the example's minimum, and the worst case: any gain at all
    for seed in range(SEEDS):
        ref, cand = aa_samples(rng, pairs)
        for me in accepted if looks else [m]:
            d = decide(
                result({"time": ref}, {"time": cand}),
                plan(sp, stage, me, sequential_looks=looks, seed=seed),
                Telemetry(),
            )
            assert d.stage_outcome != "accepted" or stage != "screen"
            accepted[me] += d.stage_outcome == "accepted"
            if not looks:  # one interval per case answers both minimums
                accepted[0.001] += stage != "screen" and all(
                    c.primary["ci_low_pct"] >= 0.001 for c in d.cases
                )
    rates = {me: k / SEEDS for me, k in accepted.items()}
    print(f"A/A false accepts {name}: {rates}")
    # binomial noise: 5% over 200 runs has s.e. 1.5%; the rule's own rate is at most 2.5% (one side)
    assert all(r <= 0.05 for r in rates.values()), rates


def test_true_gain_is_accepted_on_a_shared_but_balanced_host() -> None:
    rng = np.random.default_rng(1)
    sp = StatsPlan(target_pairs=20)
    ref = list(10 * np.exp(rng.normal(0, 0.05, 20)))
    cand = [r / 1.3 * math.exp(rng.normal(0, 0.02)) for r in ref]
    load = [
        SampleLoad(subject=s, case="c", rep=i, foreign_cpu_cores=float(x))
        for s in ("reference", "candidate")
        for i, x in enumerate(rng.uniform(0.5, 1.2, 20))
    ]
    d = decide(result({"time": ref}, {"time": cand}), plan(sp), Telemetry(host_cpus=2, samples=load))
    assert d.stage_outcome == "accepted", d.reasons
    assert d.load[0].basis == "per_sample" and d.load[0].level is not None and d.load[0].level > 0.25


def _loaded(rng: np.random.Generator, n: int, shift: float) -> list[SampleLoad]:
    ref = rng.uniform(0.0, 0.8, n)
    cand = rng.uniform(0.0, 0.8, n) + shift
    return [
        SampleLoad(subject="reference", case="c", rep=i, foreign_cpu_cores=float(x))
        for i, x in enumerate(ref)
    ] + [
        SampleLoad(subject="candidate", case="c", rep=i, foreign_cpu_cores=float(x))
        for i, x in enumerate(cand)
    ]


def test_unbalanced_load_is_caught_and_balanced_load_is_not() -> None:
    rng = np.random.default_rng(7)
    sp = StatsPlan(target_pairs=20, bootstrap_resamples=500)
    caught = voided = 0
    for seed in range(200):
        ref, cand = aa_samples(rng, 20)
        r = result({"time": ref}, {"time": cand})
        bad = decide(r, plan(sp, seed=seed), Telemetry(host_cpus=4, samples=_loaded(rng, 20, 0.6)))
        good = decide(r, plan(sp, seed=seed), Telemetry(host_cpus=4, samples=_loaded(rng, 20, 0.0)))
        caught += bad.stage_outcome == "void" and "load_unbalanced:cpu" in bad.codes
        voided += good.stage_outcome == "void"
    print(f"unbalanced load caught {caught}/200; balanced load voided {voided}/200")
    assert caught >= 195 and voided <= 6  # alpha 0.01: about 2 of 200 expected


TICK_NS = 10_000_000  # /proc/stat's USER_HZ tick


def _tick_read(rng: np.random.Generator, busy_cores: float, wall_ns: int) -> float:
    """Foreign cores as the supervisor reads them on a 2-core host: each core's 10 ms tick counts the
    whole tick as busy when it lands on busy time; the supervisor's own use (1 core, exact) is subtracted."""
    ticks = [int((rng.uniform(0, TICK_NS) + wall_ns) // TICK_NS) for _ in range(2)]
    busy_ticks = sum(int(rng.binomial(t, busy_cores / 2)) for t in ticks)
    return (busy_ticks * TICK_NS - wall_ns) / wall_ns


def _ticked(rng: np.random.Generator, n: int, walls: tuple[int, int], extra: float) -> list[SampleLoad]:
    """Blocks of a reference and a candidate arm on a 2-core host with 0.4 foreign cores (+extra on the candidate)."""
    return [
        SampleLoad(
            subject=subj,
            case="c",
            rep=i,
            foreign_cpu_cores=_tick_read(rng, 1.1 + (extra if subj == "candidate" else 0.0), wall),
            wall_ns=wall,
        )
        for subj, wall in zip(("reference", "candidate"), walls, strict=True)
        for i in range(n)
    ]


def test_tick_quantised_load_is_pooled_so_a_short_arm_does_not_read_unbalanced() -> None:
    """A 3 ms candidate against a 40 ms reference on a host with 0.1 foreign cores: one block reads
    zero or whole 10 ms ticks. Pooled by wall and left signed, the level is right and nothing voids;
    clamped at zero block by block (as once recorded), the short arm reads most of a core too high."""
    rng = np.random.default_rng(11)
    sp = StatsPlan(target_pairs=40, bootstrap_resamples=300)
    voided, levels, clamped = 0, [], []
    for seed in range(40):
        ref, cand = aa_samples(rng, 40)
        load = _ticked(rng, 40, (40_000_000, 3_000_000), 0.0)
        d = decide(
            result({"time": ref}, {"time": cand}), plan(sp, seed=seed), Telemetry(host_cpus=2, samples=load)
        )
        voided += "load_unbalanced:cpu" in d.codes
        assert d.load[0].basis == "pooled"
        levels.append((d.load[0].level or 0.0) * 2)
        short = [max(0.0, s.foreign_cpu_cores or 0.0) for s in load if s.subject == "candidate"]
        clamped.append(float(np.mean(short)))
    print(
        f"balanced host, 3 ms vs 40 ms blocks, 0.1 foreign cores: voided {voided}/40, pooled level "
        f"{np.mean(levels):.3f} cores, clamped short arm {np.mean(clamped):.3f} cores"
    )
    assert voided <= 2 and abs(float(np.mean(levels)) - 0.1) < 0.05 and float(np.mean(clamped)) > 0.4


def test_pooled_load_still_catches_load_that_follows_one_arm() -> None:
    rng = np.random.default_rng(12)
    sp = StatsPlan(target_pairs=60, bootstrap_resamples=200)
    caught = 0
    for seed in range(20):
        ref, cand = aa_samples(rng, 60)
        load = _ticked(rng, 60, (50_000_000, 50_000_000), 0.6)
        d = decide(
            result({"time": ref}, {"time": cand}), plan(sp, seed=seed), Telemetry(host_cpus=2, samples=load)
        )
        caught += "load_unbalanced:cpu" in d.codes and d.load[0].basis == "pooled"
    print(f"0.6 cores following the candidate, 50 ms blocks: caught {caught}/20")
    assert caught >= 19


def test_load_above_the_ceiling_voids_per_sample_and_per_window() -> None:
    rng = np.random.default_rng(3)
    ref, cand = aa_samples(rng, 20)
    r = result({"time": ref}, {"time": cand})
    sp = StatsPlan(target_pairs=20, load=LoadCeiling(max_foreign_cpu_share=0.5))
    heavy = Telemetry(
        host_cpus=2,
        samples=[
            SampleLoad(subject=s, case="c", rep=i, foreign_cpu_cores=1.5)
            for s in ("reference", "candidate")
            for i in range(20)
        ],
    )
    d = decide(r, plan(sp), heavy)
    assert d.stage_outcome == "void" and "load_above_ceiling:cpu" in d.codes
    window = Telemetry(host_cpus=2, windows=[WindowLoad(host_cpus=2, foreign_cpu_cores_median=1.5)])
    d = decide(r, plan(sp), window)
    assert d.stage_outcome == "void" and d.load[0].basis == "window"
    light = Telemetry(host_cpus=2, windows=[WindowLoad(host_cpus=2, foreign_cpu_cores_median=0.9)])
    assert decide(r, plan(sp), light).stage_outcome != "void"
    gpu = Telemetry(windows=[WindowLoad(foreign_gpu_contexts=1)])
    assert "load_above_ceiling:gpu_contexts" in decide(r, plan(sp), gpu).codes


def test_outcome_is_primary_and_constraints() -> None:
    rng = np.random.default_rng(5)
    sp = StatsPlan(target_pairs=20)
    ref_t = list(10 * np.exp(rng.normal(0, 0.03, 20)))
    fast = [x / 4 for x in ref_t]  # +300% throughput-like gain on the primary
    ref_p = list(5 * np.exp(rng.normal(0, 0.03, 20)))
    cons = [Constraint(metric=P99, max_regression_pct=10)]
    bad_p99 = decide(
        result({"time": ref_t, "p99": ref_p}, {"time": fast, "p99": [x * 8 for x in ref_p]}),
        plan(sp, constraints=cons),
        Telemetry(),
    )
    assert bad_p99.primary_verdict == "accepted"
    assert bad_p99.stage_outcome == "constraint_violated" and bad_p99.blocking_constraints == ["p99"]
    assert "constraint_violated" in bad_p99.codes
    noisy = [x * math.exp(rng.normal(0.05, 0.3)) for x in ref_p]
    und = decide(
        result({"time": ref_t, "p99": ref_p}, {"time": fast, "p99": noisy}),
        plan(sp, constraints=cons),
        Telemetry(),
    )
    assert (
        und.constraint_verdicts == {"p99": "inconclusive"} and und.stage_outcome == "constraint_inconclusive"
    )
    good = decide(
        result({"time": ref_t, "p99": ref_p}, {"time": fast, "p99": ref_p}),
        plan(sp, constraints=cons),
        Telemetry(),
    )
    assert good.stage_outcome == "accepted" and good.constraint_verdicts == {"p99": "ok"}
    screen = decide(
        result({"time": ref_t, "p99": ref_p}, {"time": fast, "p99": [x * 8 for x in ref_p]}),
        plan(sp, stage="screen", constraints=cons),
        Telemetry(),
    )
    assert screen.stage_outcome == "rejected" and screen.blocking_constraints == ["p99"]


def test_failures_void_the_samples_and_are_coded() -> None:
    sp = StatsPlan()
    ref = [10.0, 11.0, 10.5, 10.2, 10.1, 10.3, 10.4, 10.6]
    wrong = Accuracy(passed=False, checks=1, detail="rel_l2 0.5 > 1e-9")
    assert decide(result({"time": ref}, {"time": ref}, cand_acc=wrong), plan(sp), Telemetry()).codes == [
        "accuracy_failed"
    ]
    loose = Accuracy(passed=True, checks=1, worst_rel_l2=1e-3)
    gated = decide(
        result({"time": ref}, {"time": ref}, cand_acc=loose),
        plan(sp, gates=[Gate(name="tight", rel_l2=1e-6)]),
        Telemetry(),
    )
    assert gated.stage_outcome == "failed_accuracy" and gated.codes == ["gate_failed"]
    integ = decide(
        result({"time": ref}, {"time": ref}, integrity=["subject wrote outside its windows"]),
        plan(sp),
        Telemetry(),
    )
    assert integ.stage_outcome == "integrity_violation" and integ.stage_outcome in VOID_OUTCOMES
    failed = decide(None, plan(sp), Telemetry())
    assert failed.stage_outcome == "failed_run" and failed.primary_verdict == "void"
    # the supervisor ended the stage on a violation it confirmed: no samples, and not a failed run
    stopped = decide(
        None, plan(sp), Telemetry(), Reason(code="integrity_violation", message="work left running")
    )
    assert stopped.stage_outcome == "integrity_violation" and stopped.codes == ["integrity_violation"]
    crashed = decide(None, plan(sp), Telemetry(), Reason(code="measurement_failed", message="driver crashed"))
    assert crashed.stage_outcome == "failed_run"
    mism = decide(result({"time": ref}, {"time": ref}), plan(sp, identity_mismatch=["image.id"]), Telemetry())
    assert mism.stage_outcome == "void" and "environment_mismatch" in mism.codes


def test_decide_is_pure_and_repeatable() -> None:
    rng = np.random.default_rng(11)
    ref, cand = aa_samples(rng, 20)
    args = (
        result({"time": ref}, {"time": cand}, cases=("a", "b")),
        plan(StatsPlan(), seed=4),
        Telemetry(host_cpus=2, samples=_loaded(rng, 20, 0.0)),
    )
    first = decide(*args)
    assert decide(*args) == first and len(first.cases) == 2
    back = type(first).model_validate_json(first.model_dump_json())
    assert back == first  # what the record stores is what verify recomputes


def test_every_case_must_accept_and_a_case_verdict_is_not_the_stage_outcome() -> None:
    rng = np.random.default_rng(2)
    ref = list(10 * np.exp(rng.normal(0, 0.02, 20)))
    series = [
        _series("reference", "fast", {"time": ref}),
        _series("candidate", "fast", {"time": [x / 1.5 for x in ref]}),
        _series("reference", "same", {"time": ref}),
        _series("candidate", "same", {"time": ref}),
    ]
    r = DriverResult(protocol="cko/driver-v1", mode="measure", series=series, units={"time": "ms"})
    d = decide(r, plan(StatsPlan()), Telemetry())
    verdicts = {c.case: c.primary["verdict"] for c in d.cases}
    assert verdicts["fast"] == "accepted" and d.stage_outcome != "accepted"


def test_examples_declare_a_claim_layer() -> None:
    for ex in (ROOT / "examples").iterdir():
        req = json.loads((ex / "readiness.json").read_text())
        assert req.get("claim_layer") == "kernel", ex.name  # each is a micro-benchmark of one operation


def test_a_baseline_says_when_its_resolution_was_measured_under_load() -> None:
    from cko_perf.runner.workflow.decide import under_load

    loaded = under_load(WindowLoad(host_cpus=2, foreign_cpu_cores_median=1.1))
    assert loaded is not None and loaded.code == "measured_under_load" and "1.10 of 2" in loaded.message
    assert under_load(WindowLoad(host_cpus=2, foreign_cpu_cores_median=0.05)) is None
    assert under_load(WindowLoad(foreign_gpu_contexts=1)) is not None


def test_a_screen_below_the_baselines_resolution_stays_open() -> None:
    """No gain, measured tightly: `below_minimum`, a final rejection at a screen, unless the baseline
    said its A/A resolution was coarser than the minimum effect: then the screen could not have seen
    the minimum, and it is inconclusive (target stays open). Target stages are not affected."""
    rng = np.random.default_rng(11)
    sp = StatsPlan(screen_pairs=20, target_pairs=20)
    ref = list(10 * np.exp(rng.normal(0, 0.002, 20)))
    cand = [x * math.exp(rng.normal(0, 0.002)) for x in ref]
    r = result({"time": ref}, {"time": cand})
    plain = decide(r, plan(sp, stage="screen"), Telemetry())
    assert plain.primary_verdict == "below_minimum" and plain.stage_outcome == "rejected", plain.codes
    fine = decide(r, plan(sp, stage="screen", resolution_pct={"c": 1.0}), Telemetry())
    assert fine.stage_outcome == "rejected" and "below_resolution" not in fine.codes
    coarse = decide(r, plan(sp, stage="screen", resolution_pct={"c": 12.0}), Telemetry())
    assert coarse.primary_verdict == "inconclusive" and coarse.stage_outcome == "open", coarse.codes
    assert "below_resolution" in coarse.codes and coarse.cases[0].primary["verdict"] == "inconclusive"
    target = decide(r, plan(sp, stage="target", resolution_pct={"c": 12.0}), Telemetry())
    assert target.primary_verdict == "below_minimum" and "below_resolution" not in target.codes
    assert decide(r, plan(sp, stage="screen", resolution_pct={"c": 12.0}), Telemetry()) == coarse  # pure


LAZY_OUTPUT = ROOT / "tests" / "fixtures" / "driver" / "lazy_output.json"


def _unvoided(r: DriverResult) -> DriverResult:
    return r.model_copy(
        update={"series": [s.model_copy(update={"void": [""] * len(s.reps)}) for s in r.series]}
    )


def test_checks_that_do_not_vouch_void_the_stage_on_a_real_record() -> None:
    """The driver's result of tests/adversarial/lazy_output before outputs had to be plain (numpy
    softmax, 16 pairs): its output computed itself when a check's fetch read it. Each of its 10
    checked blocks was voided (its CPU after the window), none of its 6 unchecked; every check passed,
    and the 6 blocks that counted were garbage, timed at 0.02 ms against 13.6 ms. It was accepted.
    None of the reference's 7 checked blocks was voided."""
    r = DriverResult.model_validate_json(LAZY_OUTPUT.read_text())
    cand = next(s for s in r.series if s.subject == "candidate")
    assert cand.accuracy.passed and cand.accuracy.checks == 10
    sp = StatsPlan(screen_pairs=16, target_pairs=16)
    d = decide(r, plan(sp), Telemetry())
    assert d.stage_outcome == "void" and d.primary_verdict == "void", d.codes
    assert "accuracy_unconfirmed" in d.codes and d.stage_outcome in VOID_OUTCOMES
    why = next(x.message for x in d.reasons if x.code == "accuracy_unconfirmed")
    assert "all 10 of its checked blocks were voided" in why, why
    # the same samples without the voids: the rule, not the samples, decided
    assert decide(_unvoided(r), plan(sp), Telemetry()).stage_outcome == "accepted"


def _voids(subject: str, reps: int, checked: list[int], voided: set[int]) -> Series:
    acc = Accuracy(passed=True, checks=len(checked), checked_reps=checked, worst_rel_l2=0.0)
    return Series(
        subject=subject,
        case="c",
        reps=list(range(reps)),
        samples={"time": [1.0] * reps},
        accuracy=acc,
        void=["x" if r in voided else "" for r in range(reps)],
    )


def test_voids_that_follow_the_check_draw_are_told_from_the_fetchs_own() -> None:
    from cko_perf.runner.workflow.vouch import unvouched

    checks = [0, 4, 9, 13, 20, 26, 31, 38, 44, 50, 53, 58]
    ref_checks = [0, 3, 7, 15, 22, 27, 33, 41, 49, 57]
    ref = _voids("reference", 60, ref_checks, {22, 35})
    # the first block honest (its check stands), every later check voided
    assert "Fisher" in unvouched(_voids("candidate", 60, checks, set(checks[1:])), ref)
    # honest on a host where a fetch is often voided (probed through a large copy): the reference's
    # fetches are voided as often, checked blocks more than unchecked on both sides
    fetchy = _voids("reference", 60, ref_checks, {0, 7, 15, 27, 33, 41, 49, 11})
    assert unvouched(_voids("candidate", 60, checks, {0, 9, 13, 26, 38, 44, 50, 53, 17}), fetchy) == ""
    # load scattered over both arms, no voids, or no reference to hold it against
    assert unvouched(_voids("candidate", 60, checks, {2, 4, 11, 17, 23, 29}), ref) == ""
    assert unvouched(_voids("candidate", 60, checks, set()), ref) == ""
    assert unvouched(_voids("candidate", 60, checks, set(checks[1:])), None) == ""
    # every check voided: nothing vouches, whatever the reference (the torch lazy_mode candidate on a
    # loaded host: 3 of 3 checked blocks voided against 1 of the reference's 7, Fisher p = 0.033)
    few, ref_few = [0, 3, 7], _voids("reference", 12, [0, 1, 2, 3, 5, 8, 9], {3, 10})
    for against in (ref_few, None):
        assert "all 3 of its checked blocks were voided" in unvouched(
            _voids("candidate", 12, few, set(few)), against
        )
