"""The driver protocol against hostile drivers, through `cko readiness` in the real sandbox (issue 4)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cko_perf.operations.protocol import DriverRequest, DriverResult, validate_result
from tests.conftest import ROOT, run_cko

HOSTILE = ROOT / "tests" / "hostile_driver"


def _request(tmp_path: Path, mode: str, process_timeout: float = 60) -> Path:
    work = tmp_path / f"w-{mode}"
    shutil.copytree(HOSTILE, work)
    req = {
        "name": f"hostile-{mode}",
        "workload": ".",
        "entry": "kernel.py",
        "allowed_paths": ["kernel.py"],
        "exclude": ["readiness.json"],
        "driver": {"command": ["python", "driver.py"], "env": {"HOSTILE": mode}, "kind": "harness_trusted"},
        "cases": [{"id": "small", "params": {"rows": 64, "cols": 256}}],
        "objective": {"primary": {"name": "time", "unit": "ms", "direction": "lower"}, "min_effect_pct": 5},
        "accuracy": {"rel_l2": 1e-9},
        "plan": {"warmup": 1},
        "timeout_s": 120,
        "process_timeout_s": process_timeout,
    }
    (work / "readiness.json").write_text(json.dumps(req))
    return work / "readiness.json"


@pytest.mark.docker
@pytest.mark.parametrize(
    "mode,code,field",
    [
        ("garbage", "result_not_json", "result"),
        ("wrong_unit", "wrong_unit", "metrics.time.unit"),
        ("too_few", "wrong_sample_count", "series[original/small].reps"),
        ("nan", "non_finite", "series[original/small].samples.time"),
        ("wrong_metric", "missing_metric", "series[original/small].samples.time"),
        ("protocol", "unknown_protocol", "protocol"),
        ("missing_subject", "missing_subject", "series[original/small]"),
        ("crash", "driver_crashed", "driver"),
        ("no_result", "result_not_written", "result_path"),
    ],
)
def test_hostile_driver_is_not_ready(tmp_path: Path, mode: str, code: str, field: str) -> None:
    store = tmp_path / "store"
    r = run_cko("readiness", "--request", str(_request(tmp_path, mode)), "--json", store=store)
    assert r.code == 1, (r.stdout, r.stderr)
    doc = r.json
    assert doc["ready"] is False
    reason = doc["blockers"][0]["reason"]
    assert reason.startswith(code + ":"), reason
    assert f"(field {field})" in reason, reason
    assert list((store / "targets").glob("*.json")) == []  # no Target


@pytest.mark.docker
def test_hanging_driver_times_out(tmp_path: Path) -> None:
    store = tmp_path / "store"
    r = run_cko(
        "readiness", "--request", str(_request(tmp_path, "hang", process_timeout=4)), "--json", store=store
    )
    assert r.code == 1
    assert r.json["blockers"][0]["reason"].startswith("driver_timed_out:")


@pytest.mark.docker
def test_driver_that_prints_megabytes_and_writes_outside_still_contained(tmp_path: Path) -> None:
    store = tmp_path / "store"
    for mode in ("megabytes", "outside"):
        req = _request(tmp_path, mode)
        before = sorted(p.name for p in req.parent.iterdir())
        r = run_cko("readiness", "--request", str(req), "--json", store=store)
        assert r.code == 0, (r.stdout[-2000:], r.stderr[-2000:])
        assert r.json["ready"] is True
        assert sorted(p.name for p in req.parent.iterdir()) == before  # the workload is untouched
    assert not Path("/etc/cko-was-here").exists()
    # the driver's own stdout is kept only as a tail inside the container: no object is megabytes
    sizes = [p.stat().st_size for p in (store / "objects").rglob("*") if p.is_file()]
    assert max(sizes) < 2 << 20
    assert run_cko("verify", "--json", store=store).json["ok"] is True


def _req(**kw: object) -> DriverRequest:
    base = dict(
        mode="measure",
        subjects=[{"id": "a", "path": "/x"}],
        cases=[{"id": "c", "params": {}}],
        schedule=[{"subject": "a", "case": "c", "rep": 0}, {"subject": "a", "case": "c", "rep": 1}],
        metrics=[{"name": "time", "unit": "ms"}],
        accuracy={"rel_l2": 1e-6},
        seed=1,
        result_path="/tmp/r",
    )
    base.update(kw)
    return DriverRequest.model_validate(base)


def _res(
    samples: list[float], reps: list[int] | None = None, units: dict[str, str] | None = None
) -> DriverResult:
    return DriverResult.model_validate(
        {
            "protocol": "cko/driver-v1",
            "mode": "measure",
            "units": units if units is not None else {"time": "ms"},
            "series": [
                {
                    "subject": "a",
                    "case": "c",
                    "reps": reps if reps is not None else [0, 1],
                    "samples": {"time": samples},
                    "accuracy": {"passed": True, "checks": 1},
                }
            ],
        }
    )


def test_validate_result_accepts_a_correct_result() -> None:
    assert validate_result(_req(), _res([1.0, 1.1])) == []


@pytest.mark.parametrize(
    "res,code",
    [
        (_res([1.0]), "wrong_sample_count"),
        (_res([1.0, float("inf")]), "non_finite"),
        (_res([1.0, -1.0]), "non_positive"),
        (_res([1.0, 1.0], units={"time": "us"}), "wrong_unit"),
        (_res([1.0, 1.0], units={}), "missing_unit"),
    ],
)
def test_validate_result_contract_errors(res: DriverResult, code: str) -> None:
    errs = validate_result(_req(), res)
    assert errs and errs[0].code == code, errs


def test_stream_times_must_match_the_repetitions() -> None:
    res = _res([1.0, 1.1])
    assert (
        validate_result(
            _req(),
            res.model_copy(
                update={"series": [res.series[0].model_copy(update={"stream_ns": [900_000, 950_000]})]}
            ),
        )
        == []
    )
    errs = validate_result(
        _req(), res.model_copy(update={"series": [res.series[0].model_copy(update={"stream_ns": [900_000]})]})
    )
    assert [(e.code, e.field) for e in errs] == [("wrong_sample_count", "series[a/c].stream_ns")]


@pytest.mark.parametrize(
    "kw,msg",
    [
        ({"protocol": "cko/driver-v2"}, "unknown protocol version"),
        ({"schedule": [{"subject": "zz", "case": "c", "rep": 0}]}, "is not a subject"),
        (
            {"schedule": [{"subject": "a", "case": "c", "rep": 0}, {"subject": "a", "case": "c", "rep": 0}]},
            "repeats",
        ),
        ({"metrics": [{"name": "time", "unit": "fortnights"}]}, "unit"),
    ],
)
def test_driver_request_is_closed_and_checked(kw: dict, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        _req(**kw)


def test_stream_medians_cover_the_kept_pairs_only() -> None:
    """The experiment's stream-time medians use the pairs the clock rule keeps, like its sample medians."""
    from cko_perf.operations.protocol import Accuracy, Series
    from cko_perf.runner.workflow.analysis import kept_pairs, stream_median

    def series(subject: str, stream: list[int], sm: list[list[int | None]]) -> Series:
        return Series(
            subject=subject,
            case="c",
            reps=[0, 1, 2, 3],
            samples={"time": [1.0] * 4},
            stream_ns=stream,
            sm_mhz=sm,
            accuracy=Accuracy(passed=True, checks=1),
        )

    settled: list[list[int | None]] = [[1980, 1980]] * 4
    ref = series("a", [100, 200, 300, 10_000], [[1980, 1980], [1980, 1980], [1980, 1980], [600, 1980]])
    cand = series("b", [10, 20, 30, 40], settled)
    kept, excluded = kept_pairs(ref, cand, exclude_ramping=True)
    assert kept == [0, 1, 2] and excluded == 1  # rep 3 started at 600 MHz: still ramping
    assert stream_median(ref, kept) == 200 and stream_median(cand, kept) == 20
    assert stream_median(series("c", [], settled), kept) is None  # a CPU clock records none


@pytest.mark.docker
def test_hand_written_driver_is_marked_and_needs_the_callers_word_to_be_selected(tmp_path: Path) -> None:
    """A hand-written driver runs every subject in its own process: the result says harness_trusted,
    and `champion select` refuses it unless the caller passes --allow-harness-trusted."""
    store = tmp_path / "store"
    r = run_cko("readiness", "--request", str(_request(tmp_path, "none")), "--json", store=store)
    assert r.code == 0, r.stdout[-2000:]
    tgt = r.json["target"]["id"]
    vreq = tmp_path / "variant.json"
    vreq.write_text(
        json.dumps({"path": str(ROOT / "examples" / "numpy-softmax" / "candidate"), "claim": "one buffer"})
    )
    v = run_cko("variant", "--request", str(vreq), "--target", tgt, "--json", store=store)
    assert v.code == 0, v.stdout
    ereq = tmp_path / "target.json"
    ereq.write_text(json.dumps({"stage": "target", "seed": 2, "pairs": 6}))
    e = run_cko(
        "experiment",
        "--request",
        str(ereq),
        "--target",
        tgt,
        "--variant",
        v.json["variant"]["id"],
        "--json",
        store=store,
        timeout=600,
    )
    assert e.code == 0, e.stdout[-2000:]
    exp = json.loads((store / "experiments" / f"{e.json['experiment']['id']}.json").read_text())
    assert exp["plan"]["boundary"] == "harness_trusted"
    sel = run_cko("champion", "select", "--experiment", e.json["experiment"]["id"], "--json", store=store)
    assert sel.code == 1
    assert "harness_trusted" in [m["code"] for m in sel.json["detail"]["missing"]], sel.stdout
