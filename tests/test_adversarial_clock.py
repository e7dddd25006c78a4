"""Tricks aimed at blocks too short for a block's own clock check, and at hot blocks of many runs.

A small case (64x512, tens of us a softmax) leaves each block's bracket a slack larger than the whole
window, so one block cannot show a forged time; the verdict's clock rule holds the pairs together
to the supervisor's clock (runner/workflow/clockcheck.py). A hot block's runs each get inputs of
their own, so an answer remembered per input is never reused. Every stage here runs against the
real engine, and none may end accepted but memo_repeat, whose trick has nothing left to reuse
(MEMO_MAX_EFFECT_PCT)."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT, adversarial_target, run_candidate

pytestmark = pytest.mark.docker
EX = ROOT / "examples" / "numpy-softmax"
ADV = ROOT / "tests" / "adversarial"
SMALL = {"id": "r64x512", "params": {"rows": 64, "cols": 512}}
HOT = {"mode": "hot", "min_block_ms": 2.0}
CLOCK_CODES = {"clock_unconfirmed", "clock_hidden_time"}
# "void" for the tricks whose only effect is the claim: the clock rule (or, where the host is loaded,
# the load ceiling too) voids the stage. The staging tricks can also be caught block by block.
HONEST = ("below_minimum", "inconclusive", "regressed", "void")
# memo_repeat computes every run (no run of a block shares another's inputs): what is left of its gain
# is its held arrays' effect on its own allocator, +4% here on an idle host, over the 15% minimum
# once under load. A reused answer would read as the block's runs over one: about +900% here (+635%
# measured before every run had inputs of its own). Its bound is on the effect, not the outcome.
MEMO_MAX_EFFECT_PCT = 50.0
EXPECTED = {
    "cold": {
        "forged_time": ("void",),
        "forged_stage": ("void", "integrity_violation"),
        "precompute_staging": ("void", "integrity_violation", "inconclusive"),
        "memo_repeat": (*HONEST, "accepted"),
    },
    "hot": {
        "forged_time": ("void", "integrity_violation"),
        "forged_stage": ("void", "integrity_violation"),
        "precompute_staging": ("void", "integrity_violation", "inconclusive"),
        "memo_repeat": (*HONEST, "accepted"),
    },
}


@pytest.fixture(scope="module", params=["cold", "hot"])
def small(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    timing = HOT if request.param == "hot" else None
    return request.param, adversarial_target(EX, tmp_path_factory.mktemp(request.param), SMALL, timing=timing)


@pytest.mark.parametrize("name", sorted(EXPECTED["cold"]))
def test_a_trick_on_short_blocks_is_never_accepted(small: tuple[str, dict], name: str) -> None:
    mode, target = small
    _, doc = run_candidate(target, ADV / name, f"{name}-{mode}")
    codes = {r["code"] for r in doc["reasons"]}
    assert doc["stage_outcome"] in EXPECTED[mode][name], doc
    if name == "memo_repeat":
        assert doc["cases"][0]["effect_pct"] < MEMO_MAX_EFFECT_PCT, doc["cases"]
    if name.startswith("forged") and doc["stage_outcome"] == "void":
        # its claimed saving is many times the minimum effect: the pairs decide it, not the host's load
        assert codes & CLOCK_CODES, doc["reasons"]


def test_an_honest_candidate_is_never_called_a_forger_and_hot_blocks_confirm_it(
    small: tuple[str, dict],
) -> None:
    """The control: the genuine candidate (~35% faster on this case in hot blocks) keeps no time
    outside its windows, and in hot blocks its saving is there on the supervisor's clock too. In cold
    one-run blocks of tens of us the clock may not resolve it (`clock_unconfirmed`, void): that is
    the rule saying what it cannot see, never a verdict against the candidate."""
    mode, target = small
    _, doc = run_candidate(target, EX / "candidate", f"honest-{mode}")
    codes = {r["code"] for r in doc["reasons"]}
    assert "clock_hidden_time" not in codes, doc["reasons"]
    if mode == "hot":
        assert "clock_unconfirmed" not in codes, doc["reasons"]
    assert doc["cases"][0]["effect_pct"] > 0, doc
