"""Hot blocks through the CLI (issue 18): sized at readiness by a sizing smoke, frozen with the Target,
used by every later stage and recorded on every series. Real engine, CPU (the numpy example)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cko_perf.runner.store import Store
from tests.conftest import ROOT, run_cko

pytestmark = pytest.mark.docker
EX = ROOT / "examples" / "numpy-softmax"


def _workload(tmp: Path, timing: dict) -> Path:
    work = tmp / "numpy-softmax"
    shutil.copytree(EX, work, ignore=shutil.ignore_patterns("__pycache__"))
    req = json.loads((work / "readiness.json").read_text())
    req["cases"] = [{"id": "r64x512", "params": {"rows": 64, "cols": 512}}]  # tens of us per run
    req["plan"].update({"baseline_samples": 4, "aa_pairs": 4, "timing": timing})
    req["plan"]["load"] = {"max_foreign_cpu_share": 1.0}
    (work / "readiness.json").write_text(json.dumps(req))
    return work


def test_hot_blocks_are_sized_at_readiness_and_used_by_every_stage(tmp_path: Path) -> None:
    work, store = _workload(tmp_path, {"mode": "hot", "min_block_ms": 5.0}), tmp_path / "store"
    r = run_cko("readiness", "--request", str(work / "readiness.json"), "--json", store=store)
    assert r.code == 0, r.stdout[-2000:] + r.stderr[-2000:]
    tid = r.json["target"]["id"]
    target = json.loads((store / "targets" / f"{tid}.json").read_text())
    runs = target["plan"]["timing"]["runs_per_block"]
    assert target["plan"]["timing"]["mode"] == "hot" and runs > 1, target["plan"]["timing"]
    b = run_cko("baseline", "--request", str(work / "baseline.json"), "--target", tid, "--json", store=store)
    assert b.code == 0, b.stdout[-2000:] + b.stderr[-2000:]
    bas = json.loads((store / "baselines" / f"{b.json['baseline']['id']}.json").read_text())
    inv = json.loads((store / "invocations" / bas["invocation"]["id"] / "result.json").read_text())
    out = next(o for o in inv["outputs"] if o["name"] == "result.json")
    result = json.loads(Store(store).object_path(out["sha256"]).read_bytes())["driver_result"]
    assert {(s["timing_mode"], s["runs"]) for s in result["series"]} == {("hot", runs)}
    # a block lasts runs x the per-run time: at least about the declared 5 ms on this host
    for s in result["series"]:
        per_run_ms = sorted(s["samples"]["time"])[len(s["samples"]["time"]) // 2]
        assert per_run_ms * runs > 2.0, (per_run_ms, runs)


def test_cold_mode_takes_one_run_per_block_only(tmp_path: Path) -> None:
    work = _workload(tmp_path, {"mode": "cold", "runs_per_block": 8})
    r = run_cko("readiness", "--request", str(work / "readiness.json"), "--json", store=tmp_path / "store")
    assert r.code == 2 and "runs_per_block" in r.stdout, r.stdout[-1500:]
    assert not (tmp_path / "store" / "targets").exists() or not any(
        (tmp_path / "store" / "targets").iterdir()
    )


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ({}, "device cuda"),  # the numpy example is a cpu workload
        ({"driver": {"command": ["python", "driver.py"], "kind": "harness_trusted"}}, "harness_trusted"),
    ],
    ids=["cpu", "harness_trusted"],
)
def test_graph_mode_is_refused_where_no_graph_can_be_captured(
    tmp_path: Path, change: dict, names: str
) -> None:
    work = _workload(tmp_path, {"mode": "graph"})
    req = json.loads((work / "readiness.json").read_text())
    if change:
        req.update(change, device="cuda", gpu={"required": True, "count": 1})
    (work / "readiness.json").write_text(json.dumps(req))
    r = run_cko("readiness", "--request", str(work / "readiness.json"), "--json", store=tmp_path / "store")
    assert r.code == 2 and "plan.timing.mode graph" in r.stdout and names in r.stdout, r.stdout[-1500:]
    assert not (tmp_path / "store" / "targets").exists() or not any(
        (tmp_path / "store" / "targets").iterdir()
    )
