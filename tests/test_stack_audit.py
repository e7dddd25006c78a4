"""`cko audit --stack` without an engine: the component rule, the two-sample verdict, bad input.

The rule (runner/workflow/stackdiff.py) and the per-case verdict (operations/twosample.py,
runner/workflow/stackaudit.py:case_result) are pure functions of records, so these run in
milliseconds on synthetic Targets and samples.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cko_perf.operations.twosample import _u_counts, compare_two, rank_rank, stack_verdict
from cko_perf.runner.errors import CkoError, Exit
from cko_perf.runner.identity import EnvironmentIdentity, HostIdentity, ImageIdentity
from cko_perf.runner.models import ObjectRef, Ref
from cko_perf.runner.workflow.records import Snapshot, Target
from cko_perf.runner.workflow.requests import ReadinessRequest
from cko_perf.runner.workflow.stackaudit import case_result
from cko_perf.runner.workflow.stackdiff import check_declared, stack_diff
from cko_perf.runner.workflow.stackrecord import StackInvocation
from cko_perf.runner.workflow.verdicts import WindowLoad
from tests.conftest import ROOT, run_cko

SHA = "a" * 64
PROBED = ["cuda_version_env", "nvcc", "numpy", "python", "scipy", "torch", "triton"]


def identity(image: str = "1", probed: list[str] | None = PROBED, **tools: str) -> EnvironmentIdentity:
    base = {"python": "3.11.2", "numpy": "2.4.6", "scipy": "1.17.1"}
    return EnvironmentIdentity(
        image=ImageIdentity(name="cpu", ref="cko/cpu", id="sha256:" + image * 64),
        host=HostIdentity(host_id="h1", kernel="6.1", cpu_model="x86", cpu_count=2),
        tools={k: v for k, v in (base | tools).items() if v},
        probed=probed,
    )


def target(ident: EnvironmentIdentity, **over: Any) -> Target:
    req = ReadinessRequest.model_validate(
        json.loads((ROOT / "examples/numpy-softmax/readiness.json").read_text())
    )
    fields: dict[str, Any] = {
        "id": "tgt-20260101T000000-abcdef01",
        "name": req.name,
        "mode": "optimization",
        "created_at": "2026-01-01T00:00:00+00:00",
        "original": Snapshot(sha256=SHA, manifest=ObjectRef(sha256=SHA, size=1), files=2, bytes=10),
        "entry": req.entry,
        "allowed_paths": req.allowed_paths,
        "driver": req.driver,
        "image": req.image,
        "device": req.device,
        "gpu": req.gpu,
        "cases": req.cases,
        "objective": req.objective,
        "accuracy": req.accuracy,
        "plan": req.plan,
        "timeout_s": 60,
        "process_timeout_s": 60,
        "memory": "1g",
        "identity": ident,
        "request": ObjectRef(sha256=SHA, size=1),
    }
    return Target(**(fields | over))


def refusal(a: Target, b: Target, component: str) -> CkoError:
    with pytest.raises(CkoError) as exc:
        check_declared(stack_diff(a, b), component)
    return exc.value


# -- the component rule ------------------------------------------------------------------------


def test_an_image_only_change_passes_as_image_and_nothing_else() -> None:
    a, b = target(identity("1")), target(identity("2"))
    diff = stack_diff(a, b)
    assert [c.name for c in diff.components if c.status == "differs"] == ["image"]
    assert check_declared(diff, "image").name == "image"
    err = refusal(a, b, "torch")
    assert (err.code, err.exit_code, err.field) == (
        "declared_component_unchanged",
        Exit.BAD_REQUEST,
        "component",
    )


def test_a_torch_upgrade_carries_its_image_but_not_as_image() -> None:
    a, b = target(identity("1", torch="2.12.0")), target(identity("2", torch="2.13.0"))
    assert check_declared(stack_diff(a, b), "torch").status == "differs"
    err = refusal(a, b, "image")
    assert err.code == "more_than_declared_component" and "torch" in err.message
    assert "2.12.0" in err.message and "2.13.0" in err.message


def test_every_other_component_that_differs_is_named() -> None:
    a = target(identity("1", torch="2.12.0", numpy="2.4.6"))
    b = target(identity("2", torch="2.13.0", numpy="2.5.0", triton="3.5.0"))
    err = refusal(a, b, "torch")
    assert err.code == "more_than_declared_component"
    assert err.detail["unexpected"] == ["triton", "numpy"]  # named components first, then other tools
    assert "image" not in err.detail["unexpected"]  # torch lives in the image


def test_a_version_the_identity_does_not_record_could_not_be_checked() -> None:
    old = identity("1", probed=None)  # recorded before the probe listed what it looked for
    a, b = target(old), target(identity("2"))
    diff = stack_diff(a, b)
    torch = diff.by_name()["torch"]
    assert torch.status == "could_not_check" and "from identity" in (torch.facets[0].note or "")
    err = refusal(a, b, "torch")
    assert err.code == "declared_component_unchecked"
    assert (
        check_declared(diff, "image").name == "image"
    )  # allowed, but the record lists what it could not check
    assert {"torch", "triton"} <= {c.name for c in diff.components if c.status == "could_not_check"}


def test_absent_from_both_probes_is_equal_not_unknown() -> None:
    diff = stack_diff(target(identity("1")), target(identity("2")))
    assert diff.by_name()["torch"].status == "equal"
    assert diff.by_name()["cuda"].status == "equal"


def test_a_driver_change_is_the_hosts_and_drags_the_drivers_cuda_only() -> None:
    ia, ib = identity("1"), identity("1")
    ia = ia.model_copy(update={"driver_version": "570.1", "cuda_driver_version": "12.8"})
    ib = ib.model_copy(update={"driver_version": "580.2", "cuda_driver_version": "13.0"})
    a, b = target(ia), target(ib)
    err = refusal(a, b, "driver")
    assert (err.code, err.exit_code) == ("host_component_not_here", Exit.UNAVAILABLE)
    err = refusal(a, b, "cuda")
    assert err.code == "more_than_declared_component" and err.detail["unexpected"] == ["driver"]


def test_another_gpu_or_host_is_named() -> None:
    ib = identity("2").model_copy(
        update={"host": HostIdentity(host_id="h2", kernel="6.8", cpu_model="x86", cpu_count=2)}
    )
    err = refusal(target(identity("1")), target(ib), "image")
    assert err.code == "more_than_declared_component" and err.detail["unexpected"] == ["host"]
    assert "kernel '6.1' -> '6.8'" in err.message


def test_a_changed_workload_is_not_a_stack_change() -> None:
    a = target(identity("1"))
    b = target(identity("2"), cases=[], objective=a.objective.model_copy(update={"min_effect_pct": 1.0}))  # type: ignore[union-attr]
    err = refusal(a, b, "image")
    assert err.code == "not_a_stack_change" and err.exit_code == Exit.BAD_REQUEST
    assert [d["field"] for d in err.detail["definition"]] == ["cases", "objective"]
    snap = Snapshot(sha256="b" * 64, manifest=ObjectRef(sha256=SHA, size=1), files=2, bytes=10)
    assert (
        refusal(a, target(identity("2"), original=snap), "image").detail["definition"][0]["field"]
        == "original"
    )


def test_an_unknown_component_is_refused_naming_the_known_ones() -> None:
    err = refusal(target(identity("1")), target(identity("2")), "tensorflow")
    assert err.code == "unknown_component" and "image" in err.message and "torch" in err.message


# -- the two-sample statistics -------------------------------------------------------------------


@pytest.mark.parametrize(("n", "m"), [(2, 3), (4, 4), (4, 5), (3, 6)])
def test_u_distribution_matches_enumeration(n: int, m: int) -> None:
    counts = [0] * (n * m + 1)
    for xs in itertools.combinations(range(n + m), n):
        others = [j for j in range(n + m) if j not in xs]
        counts[sum(1 for i in xs for j in others if i < j)] += 1
    assert list(_u_counts(n, m)) == counts and sum(counts) == math.comb(n + m, n)


def test_rank_interval_needs_four_and_four_at_95() -> None:
    assert rank_rank(3, 3, 0.95) == (0, None)
    c, cov = rank_rank(4, 4, 0.95)
    assert c == 1 and cov == pytest.approx(1 - 2 / 70)
    c, cov = rank_rank(6, 6, 0.95)
    assert c >= 2 and cov is not None and cov >= 0.95


@pytest.mark.parametrize(
    ("low", "high", "verdict"),
    [
        (-3.0, 4.0, "no_difference"),
        (-0.8, -0.2, "no_difference"),  # significant, but smaller than the minimum
        (2.0, 8.0, "faster"),
        (-9.0, -1.0, "slower"),
        (-3.0, 8.0, "inconclusive"),
        (-5.0, 1.0, "inconclusive"),  # reaches the minimum: not shown smaller
    ],
)
def test_stack_verdict_rule(low: float, high: float, verdict: str) -> None:
    assert stack_verdict(low, high, 5.0) == verdict


def test_compare_two_finds_a_clear_speedup_and_orients_it() -> None:
    rng = np.random.default_rng(3)
    a = np.exp(rng.normal(0, 0.02, 8)) * 10.0
    b = np.exp(rng.normal(0, 0.02, 8)) * 8.0  # 20 % less time: "to" is faster
    r = compare_two(a, b, direction="lower", min_effect_pct=5.0)
    assert r.verdict == "faster" and 20 < r.effect_pct < 30 and r.calibrated
    assert r.ci_low_pct <= min(r.bootstrap_ci_low_pct, r.rank_ci_low_pct) + 1e-9
    assert compare_two(a, b, direction="higher", min_effect_pct=5.0).verdict == "slower"


def test_compare_two_does_not_invent_a_difference_between_equal_stacks() -> None:
    rng = np.random.default_rng(4)
    wrong = 0
    for _ in range(200):
        a, b = np.exp(rng.normal(0, 0.05, 6)), np.exp(rng.normal(0, 0.05, 6))
        wrong += compare_two(a, b, direction="lower", min_effect_pct=5.0, resamples=200).verdict in (
            "faster",
            "slower",
        )
    assert wrong <= 10  # at most the 5 % the interval allows (expected ~0: it must also pass the minimum)


def test_too_few_invocations_are_inconclusive() -> None:
    r = compare_two([1.0, 1.1, 1.05], [2.0, 2.1, 2.2], direction="lower", min_effect_pct=5.0)
    assert not r.calibrated and r.verdict == "inconclusive"


def test_run_order_interleaves_in_seeded_blocks() -> None:
    from cko_perf.runner.workflow.stackaudit import run_order

    order = run_order(5, seed=7)
    assert [r for r, _ in order] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert all({order[2 * r][1], order[2 * r + 1][1]} == {"from", "to"} for r in range(5))
    assert all(order[4 * b][1] == order[4 * b + 3][1] for b in range(2))  # ABBA or BAAB
    assert order == run_order(5, seed=7)
    assert len({tuple(run_order(6, seed=s)) for s in range(20)}) > 1


# -- the per-case result -----------------------------------------------------------------------


def _inv(side: str, rnd: int, median: float, failed: bool = False) -> StackInvocation:
    return StackInvocation(
        round=rnd,
        side=side,  # type: ignore[arg-type]
        invocation=Ref(id=f"inv-20260101T000000-{rnd:02d}{side[0]}0000a", sha256=SHA),
        image_id=None,
        load=WindowLoad(),
        accuracy_failed=["c"] if failed else [],
        samples={"c": [median]},
        medians={"c": median},
    )


def test_case_result_counts_invocations_and_voids_a_failed_accuracy_gate() -> None:
    t = target(identity("1"))
    invs = [_inv(s, r, 2.0 + 0.01 * r) for r in range(5) for s in ("from", "to")]
    res = case_result(t, "c", invs, 0, {"from": 1.5, "to": None})
    assert len(res.from_medians) == 5 and res.comparison is not None and res.comparison.n_reference == 5
    assert res.verdict == "no_difference" and res.aa_resolution_pct == {"from": 1.5, "to": None}
    bad = [*invs, _inv("to", 5, 2.0, failed=True)]
    assert case_result(t, "c", bad, 0, {}).verdict == "failed_accuracy"


# -- bad input on the command line: exit 2, the field named, nothing written -----------------------


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--from", "tgt-20260101T000000-abcdef01", "--component", "image"], "to"),
        (["--from", "tgt-20260101T000000-abcdef01", "--to", "tgt-20260101T000000-abcdef02"], "component"),
        (
            ["--from", "tgt-20260101T000000-abcdef01", "--to", "tgt-20260101T000000-abcdef02"]
            + ["--component", "image", "--rounds", "1"],
            "rounds",
        ),
        (["--from", "nope", "--to", "tgt-20260101T000000-abcdef02", "--component", "image"], "from"),
    ],
)
def test_bad_stack_requests_name_the_field_and_write_nothing(
    args: list[str], field: str, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    r = run_cko("audit", "--stack", *args, "--json", store=store)
    doc = json.loads(r.stdout)
    assert r.code == 2 and doc["field"] == field, r.stdout
    assert not store.exists()


def test_stack_options_without_stack_are_refused(tmp_path: Path) -> None:
    r = run_cko("audit", "--component", "image", "--json", store=tmp_path / "s")
    assert r.code == 2 and json.loads(r.stdout)["field"] == "component"


def test_verify_recomputes_a_stack_audits_verdicts_from_its_medians(tmp_path: Path) -> None:
    from cko_perf.runner.store import Store
    from cko_perf.runner.workflow.stackaudit import recheck
    from cko_perf.runner.workflow.stackdiff import StackDiff
    from cko_perf.runner.workflow.stackrecord import StackAudit

    store = Store(tmp_path / "store")
    t = target(identity("1"))
    with store.writer():
        tref = Ref(**store.put_record("targets", t.id, t))
    invs = [_inv(s, r, 2.0 + 0.01 * r) for r in range(4) for s in ("from", "to")]
    case = case_result(t, "c", invs, 0, {"from": None, "to": None})
    rec = StackAudit(
        id="sta-20260101T000000-abcdef01",
        created_at="2026-01-01T00:00:00+00:00",
        from_target=tref,
        to_target=tref,
        component="image",
        diff=StackDiff(),
        images={},
        rounds=4,
        samples_per_case=1,
        warmup=0,
        seed=0,
        order=["from", "to"] * 4,
        metric="time",
        direction="lower",
        min_effect_pct=5.0,
        confidence=0.95,
        resamples=4000,
        baselines={"from": None, "to": None},
        invocations=invs,
        cases=[case],
        answer="measured",
        results=ObjectRef(sha256=SHA, size=1),
    )
    assert recheck(store, rec) == []
    forged = rec.model_copy(update={"cases": [case.model_copy(update={"verdict": "faster"})]})
    assert recheck(store, forged) == ["case c: recorded faster, the stored medians give no_difference"]


def test_load_above_the_targets_ceiling_is_named_and_blocks() -> None:
    from cko_perf.runner.workflow.requests import LoadCeiling
    from cko_perf.runner.workflow.stackaudit import _reasons

    busy = WindowLoad(host_cpus=2, foreign_cpu_cores_median=1.9)
    invs = [_inv(s, r, 2.0).model_copy(update={"load": busy}) for r in range(4) for s in ("from", "to")]
    reasons, loaded = _reasons(invs, LoadCeiling())
    assert [r.code for r in reasons] == ["load_above_ceiling", "measured_under_load"] and loaded
    reasons, _ = _reasons(invs, LoadCeiling(max_foreign_cpu_share=1.0))
    assert [r.code for r in reasons] == ["measured_under_load"]  # reported, not blocking
