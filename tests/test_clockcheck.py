"""The verdict's clock rule (runner/workflow/clockcheck.py) on real records: the driver results of
stages run through the real engine on the numpy example's 64x512 case (a 2-core host, 16 pairs).

forged_time_cold: tests/adversarial/forged_time, one-run blocks; each block's bracket check let
its claim of a tenth through (the slack is larger than the window) and it read +822%.
forged_stage_hot: tests/adversarial/forged_stage, hot blocks of 2 ms; nine tenths of each window
claimed as staging, +864%. honest_cold / honest_hot: examples/numpy-softmax/candidate, +5% / +33%."""

from __future__ import annotations

from pathlib import Path

import pytest

from cko_perf.operations.protocol import DriverResult
from cko_perf.runner.workflow import clockcheck
from cko_perf.runner.workflow.decide import decide
from cko_perf.runner.workflow.requests import StatsPlan
from cko_perf.runner.workflow.verdicts import Telemetry
from tests.test_decide import plan

FIXTURES = Path(__file__).parent / "fixtures" / "driver"
CLOCK = {"clock_unconfirmed", "clock_hidden_time"}


def record(name: str) -> DriverResult:
    return DriverResult.model_validate_json((FIXTURES / f"{name}.json").read_text())


def _decide(r: DriverResult):  # type: ignore[no-untyped-def]
    return decide(r, plan(StatsPlan(screen_pairs=16, target_pairs=16)), Telemetry())


@pytest.mark.parametrize("name", ["forged_time_cold", "forged_stage_hot"])
def test_a_forged_claim_is_void_on_the_supervisors_clock(name: str) -> None:
    d = _decide(record(name))
    assert d.stage_outcome == "void" and CLOCK <= set(d.codes), d.codes
    why = next(x.message for x in d.reasons if x.code == "clock_unconfirmed")
    assert "no faster than the reference" in why, why
    # the windows alone would have accepted it: the rule decided, not the samples
    assert d.cases[0].primary["verdict"] == "accepted"


def test_an_honest_gain_in_hot_blocks_is_confirmed() -> None:
    d = _decide(record("honest_hot"))
    assert d.stage_outcome == "accepted" and not CLOCK & set(d.codes), d.codes


def test_an_honest_candidate_is_not_called_a_forger() -> None:
    d = _decide(record("honest_cold"))
    assert "clock_hidden_time" not in d.codes and d.stage_outcome != "accepted", d.codes


def test_records_without_windows_decide_as_they_did() -> None:
    """Records made before Series.window_ns was kept: the rule has nothing to hold, and stands aside."""
    r = record("forged_time_cold")
    old = r.model_copy(update={"series": [s.model_copy(update={"window_ns": []}) for s in r.series]})
    d = _decide(old)
    assert not CLOCK & set(d.codes) and d.stage_outcome == "accepted", d.codes


def test_the_floor_keeps_a_small_honest_difference_outside_the_windows_from_voiding() -> None:
    """A candidate whose blocks spend 45 us more outside their windows than the reference's (what
    staging into a differently shaped process cost once, see HIDDEN_FLOOR_NS) is below the floor;
    the same shift by 4x the floor is hidden time."""
    r = record("honest_hot")
    by = {s.subject: s for s in r.series}
    arr = clockcheck.clock_arrays(by["reference"], by["candidate"], True)
    assert arr is not None and not clockcheck.hidden(arr, 0.95)
    for shift, hidden in ((45_000, False), (8 * clockcheck.HIDDEN_FLOOR_NS, True)):
        moved = dict(arr) | {"cand_bracket": arr["cand_bracket"] + shift}
        assert bool(clockcheck.hidden(moved, 0.95)) is hidden, (shift, clockcheck.hidden(moved, 0.95))
