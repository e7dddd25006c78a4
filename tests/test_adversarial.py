"""Candidates written to game the measurement must never be accepted (issue 10)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, adversarial_target, run_candidate, run_cko

pytestmark = pytest.mark.docker
EX = ROOT / "examples" / "numpy-softmax"
ADV = ROOT / "tests" / "adversarial"
ALL = sorted(p.name for p in ADV.iterdir() if (p / "kernel.py").is_file())
# Tricks aimed at hot blocks, run there (tests/test_adversarial_clock.py). memo_repeat keeps its last
# input and output alive: in one-run blocks its cache never hits, and holding 32 MB keeps its worker's
# heap warm where the reference's page-faults fresh temporaries (in one process, the original ran
# 15.2 ms a call before the memo's first calls and 11.5 ms after them): a real gain of its code, not
# of the trick, so this suite's "never accepted" is not its claim to make on this case.
HOT_TRICKS = ("memo_repeat",)
CANDIDATES = [n for n in ALL if n not in HOT_TRICKS]
VOIDING = ("failed_accuracy", "integrity_violation")


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> dict:
    # Large enough (16 MB of float64, ~10-30 ms a softmax) that work hidden outside the window,
    # before it (staging) or after it (fetch, release), stands well above the slack the rules allow.
    return adversarial_target(
        EX, tmp_path_factory.mktemp("adv"), {"id": "r512x4096", "params": {"rows": 512, "cols": 4096}}
    )


# What each class of trick must end in. "honest": the candidate's own maths is the original's, the
# trick aims at the other subject, the harness or the record; the boundary leaves it an honest,
# unaccepted comparison of identical code.
# "void": the stage saw more foreign load than the plan allows (other tests share the host) and gave
# no verdict; still an unaccepted stage, and the trick's own effects are decided before load is.
HONEST = ("below_minimum", "inconclusive", "regressed", "void")
EXPECTED: dict[str, tuple[str, ...]] = {
    "cache_by_shape": ("failed_accuracy",),
    "disk_cache": ("failed_accuracy",),
    "nan_output": ("failed_accuracy",),
    "unwritten_output": ("failed_accuracy",),
    "check_detector": ("failed_accuracy",),
    "input_overwrite": ("failed_accuracy",),
    "patched_reference": ("failed_accuracy",),
    "shm_snoop": ("failed_accuracy",),
    "patched_timer": ("integrity_violation",),
    "forged_time": ("integrity_violation",),
    # nine tenths of each window claimed as staging: the staging is held against the other subject's
    # (its blocks voided, its checks then do not vouch) and the supervisor's clock sees no saving
    "forged_stage": ("integrity_violation", "inconclusive", "void"),
    "deferred_thread": ("failed_accuracy", "integrity_violation", "inconclusive"),
    # its file is read once it is frozen: the zeros it was timed on are what is compared
    "output_rewrite": ("failed_accuracy", "integrity_violation", "inconclusive"),
    # its staging is held against the other's and voids its blocks, checked ones included, while the
    # reference's stand: its checks do not vouch (void), else the pairs left decide (inconclusive)
    "precompute_staging": ("integrity_violation", "inconclusive", "void"),
    # its output computes itself when a check's fetch first reads it: every checked block is voided (its
    # CPU after the window) and the blocks that count are unchecked garbage: the checks do not vouch
    "lazy_output": ("void",),
    "predicted_inputs": ("failed_accuracy",),
    # each call forks a child that sleeps 30 s and then exits: an exit due while its worker is frozen
    # runs at the thaw, inside the worker's command but outside its window (tearing down a copy of a
    # numpy process), so the supervisor may find such blocks too often and void the pairs, rightly:
    # the candidate's processes worked outside the window
    "child_process": (*HONEST, "integrity_violation"),
    "sabotage_library": HONEST,
    # its loader burns the worker's CPU outside the window too (the check after the block): the
    # supervisor may call that what it is, work outside the window, and void the pairs
    "detached_loader": (*HONEST, "integrity_violation"),
    "exit_hook_result": HONEST,
    "probe_rewrite": HONEST,
    "signal_everyone": HONEST,
    "import_hook_env": HONEST,
}


def test_every_candidate_has_an_expectation() -> None:
    assert sorted([*EXPECTED, *HOT_TRICKS]) == ALL


@pytest.mark.parametrize("name", CANDIDATES)
def test_adversarial_candidate_is_never_accepted(target: dict, name: str) -> None:
    r, doc = run_candidate(target, ADV / name, name)
    assert doc["stage_outcome"] != "accepted" and doc["primary_verdict"] != "accepted", doc
    assert doc["stage_outcome"] in EXPECTED[name], doc
    assert r.code == (1 if doc["stage_outcome"] in VOIDING else 0), doc
    sel = run_cko(
        "champion", "select", "--experiment", doc["experiment"]["id"], "--json", store=target["store"]
    )
    assert sel.code == 1
    result = measured(target["store"], doc)
    # The freezer held: no worker used CPU while another subject was timed.
    assert all(v == 0 for s in result["series"] for v in s["idle_cpu_ns"]), result["series"]
    assert result["boundary"] == "workers" and not result.get("forged")


def measured(store, doc: dict) -> dict:
    """The stage's driver result as the supervisor wrote it (from the experiment's samples object)."""
    exp = json.loads((store / "experiments" / f"{doc['experiment']['id']}.json").read_text())
    if exp.get("samples"):
        h = exp["samples"]["sha256"]
        return json.loads((store / "objects" / "sha256" / h[:2] / h).read_text())
    inv = json.loads((store / "invocations" / exp["invocation"]["id"] / "result.json").read_text())
    out = next(o for o in inv["outputs"] if o["name"] == "result.json")
    return json.loads((store / "objects" / "sha256" / out["sha256"][:2] / out["sha256"]).read_text())[
        "driver_result"
    ]


def test_probe_rewrite_leaves_the_recorded_identity_alone(target: dict, tmp_path) -> None:
    # a snapshot of its own: the parametrized test already ran the formal target stage of the original one
    (tmp_path / "kernel.py").write_text(
        (ADV / "probe_rewrite" / "kernel.py").read_text() + "\n# identity run\n"
    )
    _, doc = run_candidate(target, tmp_path, "probe_rewrite-identity")
    exp = json.loads((target["store"] / "experiments" / f"{doc['experiment']['id']}.json").read_text())
    inv = json.loads((target["store"] / "invocations" / exp["invocation"]["id"] / "result.json").read_text())
    tools = inv["identity"]["tools"]
    assert tools.get("python", "").startswith("3.") and "forged" not in json.dumps(inv["identity"])


def test_honest_candidate_same_harness_is_accepted_or_honestly_inconclusive(target: dict) -> None:
    """The control: the genuine candidate through the same harness is not voided."""
    r, doc = run_candidate(target, EX / "candidate", "honest")
    assert r.code == 0, r.stdout
    assert doc["stage_outcome"] not in VOIDING
    assert doc["cases"][0]["effect_pct"] > 0
    # where the loop's wall went, by part of a block: the parts are the loop's, and no more than it
    cal = measured(target["store"], doc)["calibration"]
    parts = cal["block_parts_s"]
    assert {"inputs", "stage copy", "bracket", "check: fetch", "check: reference"} <= parts.keys(), parts
    assert 0 < sum(parts.values()) <= cal["loop_s"] + 0.01, (parts, cal["loop_s"])
