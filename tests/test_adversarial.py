"""Candidates written to game the measurement must never be accepted (issue 10)."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT, adversarial_target, run_candidate, run_cko

pytestmark = pytest.mark.docker
EX = ROOT / "examples" / "numpy-softmax"
ADV = ROOT / "tests" / "adversarial"
CANDIDATES = sorted(p.name for p in ADV.iterdir() if (p / "kernel.py").is_file())
VOIDING = ("failed_accuracy", "integrity_violation")


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return adversarial_target(EX, tmp_path_factory.mktemp("adv"), {"id": "r256x1024", "params": {"rows": 256, "cols": 1024}})


@pytest.mark.parametrize("name", CANDIDATES)
def test_adversarial_candidate_is_never_accepted(target: dict, name: str) -> None:
    r, doc = run_candidate(target, ADV / name, name)
    assert doc["stage_outcome"] != "accepted" and doc["primary_verdict"] != "accepted", doc
    expected = {
        "cache_by_shape": "failed_accuracy", "disk_cache": "failed_accuracy", "nan_output": "failed_accuracy",
        "unwritten_output": "failed_accuracy", "check_detector": "failed_accuracy",
        "patched_timer": "integrity_violation", "patched_reference": "integrity_violation",
        "deferred_thread": VOIDING, "child_process": "integrity_violation",
    }[name]
    assert doc["stage_outcome"] in (expected if isinstance(expected, tuple) else (expected,)), doc
    assert r.code == 1
    sel = run_cko("champion", "select", "--experiment", doc["experiment"]["id"], "--json", store=target["store"])
    assert sel.code == 1


def test_honest_candidate_same_harness_is_accepted_or_honestly_inconclusive(target: dict) -> None:
    """The control: the genuine candidate through the same harness is not voided."""
    r, doc = run_candidate(target, EX / "candidate", "honest")
    assert r.code == 0, r.stdout
    assert doc["stage_outcome"] not in VOIDING
    assert doc["cases"][0]["effect_pct"] > 0
