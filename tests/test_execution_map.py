"""Execution map: coverage, overlap, idle gaps and the removable-time bound (Amdahl with overlap),
on hand-computed cases, against a brute-force count on random intervals, and on the real trace
fixtures through the converters and the in-container operation."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from cko_perf.operations.evidence.common import Refusal
from cko_perf.operations.evidence.execution_map import (
    ExecutionMapRequest,
    Interval,
    Selector,
    Source,
    execution_map,
    intervals_from_nsys,
    intervals_from_source,
    intervals_from_torch,
)
from cko_perf.operations.ops import execution_map as em_op

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "tests" / "fixtures" / "torch" / "torch_trace.json"
NSYS_DB = ROOT / "tests" / "fixtures" / "nsys" / "torch_like_export.sqlite"
REPORT = {
    "report_sha256": "0" * 64,
    "report_bytes": 0,
    "tool": "intervals",
    "tool_version": None,
    "tool_version_source": None,
    "parser": "test",
    "parser_version": "1",
    "dialect": "intervals-1",
    "source_kind": "intervals",
}

CASE = [
    Interval("cpu", "launch", 0, 10),
    Interval("cpu", "sync", 20, 30),
    Interval("gpu:stream7", "gemm", 5, 25),
    Interval("copy", "memcpy HtoD", 40, 50),
]


def emap(intervals, **kw):
    return execution_map(intervals, report=REPORT, **kw)


def test_coverage_overlap_and_gaps_by_hand():
    m = emap(CASE, window=(0, 60))
    assert m.window_ns == 60 and m.window_given
    lanes = {la.lane: la for la in m.lanes}
    assert lanes["cpu"].busy_ns == 20 and lanes["gpu:stream7"].busy_ns == 20 and lanes["copy"].busy_ns == 10
    assert lanes["cpu"].coverage == pytest.approx(20 / 60)
    assert [(g.start_ns, g.end_ns) for g in lanes["cpu"].largest_gaps] == [(30, 60), (10, 20)]
    assert m.union_busy_ns == 40 and m.union_coverage == pytest.approx(40 / 60)
    assert m.concurrent_ns == 10  # [5,10) and [20,25)
    assert [(o.lanes, o.overlap_ns) for o in m.overlaps] == [(["cpu", "gpu:stream7"], 10)]
    assert m.idle_total_ns == 20 and m.idle_gaps == 2
    assert [(g.start_ns, g.end_ns, g.duration_ns) for g in m.largest_idle_gaps] == [
        (30, 40, 10),
        (50, 60, 10),
    ]


def test_removable_respects_overlap():
    m = emap(
        CASE,
        window=(0, 60),
        remove=[
            Selector(label="gemm", names=["gemm"]),
            Selector(label="copies", contains=["memcpy"]),
            Selector(label="sync", regex="^sync$"),
            Selector(label="all cpu", contains=[""], lanes=["cpu"]),
        ],
    )
    r = {x.label: x for x in m.removable}
    # gemm runs 5..25, cpu work covers 5..10 and 20..25: only 10..20 is gemm alone.
    assert (r["gemm"].selected_union_ns, r["gemm"].overlapped_by_other_ns, r["gemm"].removable_ns) == (
        20,
        10,
        10,
    )
    assert r["gemm"].end_to_end_lower_bound_ns == 50 and r["gemm"].removable_fraction == pytest.approx(
        10 / 60
    )
    assert r["copies"].removable_ns == 10 and r["copies"].overlapped_by_other_ns == 0
    assert r["sync"].removable_ns == 5  # 25..30
    assert r["all cpu"].matched_intervals == 2 and r["all cpu"].removable_ns == 10  # 0..5 and 25..30


def test_overlapping_selected_intervals_count_once():
    ivs = [
        Interval("gpu:stream1", "k", 0, 10),
        Interval("gpu:stream2", "k", 5, 15),
        Interval("cpu", "x", 14, 20),
    ]
    r = emap(ivs, remove=[Selector(label="k", names=["k"])]).removable[0]
    assert r.selected_total_ns == 20 and r.selected_union_ns == 15 and r.removable_ns == 14


def test_window_clipping_exclusion_and_lane_prefixes():
    ivs = [*CASE, Interval("gpu:stream9", "late", 100, 200), Interval("cpu", "cudaDeviceSynchronize", 0, 60)]
    m = emap(ivs, window=(0, 60), exclude=[Selector(label="sync", contains=["Synchronize"])])
    assert m.intervals_excluded == 1 and m.intervals_outside_window == 1 and m.intervals == 4
    clip = emap([Interval("cpu", "a", -10, 10)], window=(0, 20))
    assert clip.lanes[0].busy_ns == 10
    r = emap(ivs, remove=[Selector(label="gpu", contains=[""], lanes=["gpu:*"])]).removable[0]
    assert r.matched_intervals == 2
    # Without the exclusion, the synchronize call overlaps everything: gemm removes nothing.
    r2 = emap(ivs, window=(0, 60), remove=[Selector(label="g", names=["gemm"])]).removable[0]
    assert r2.removable_ns == 0 and r2.overlapped_by_other_ns == 20


def _brute(ivs, w0, w1, chosen):
    busy: dict[int, set[str]] = {}
    sel: dict[int, bool] = {}
    for iv in ivs:
        for t in range(max(iv.start_ns, w0), min(iv.end_ns, w1)):
            busy.setdefault(t, set()).add(iv.lane)
            is_sel = chosen(iv)
            if t not in sel:
                sel[t] = is_sel
            else:
                sel[t] = sel[t] and is_sel
    union = len(busy)
    concurrent = sum(1 for lanes in busy.values() if len(lanes) >= 2)
    removable = sum(1 for v in sel.values() if v)
    return union, concurrent, removable


def test_against_brute_force_on_random_intervals():
    rnd = random.Random(20261202)
    for _ in range(300):
        ivs = []
        for _ in range(rnd.randint(1, 12)):
            s = rnd.randint(0, 80)
            ivs.append(
                Interval(
                    rnd.choice(["cpu", "gpu:stream7", "copy"]),
                    rnd.choice(["a", "b", "c"]),
                    s,
                    s + rnd.randint(0, 25),
                )
            )
        w0, w1 = rnd.randint(-5, 20), rnd.randint(60, 110)
        name = rnd.choice(["a", "b"])
        m = emap(ivs, window=(w0, w1), remove=[Selector(label="x", names=[name])])
        union, concurrent, removable = _brute(ivs, w0, w1, lambda iv, n=name: iv.name == n)
        assert (m.union_busy_ns, m.concurrent_ns, m.removable[0].removable_ns) == (
            union,
            concurrent,
            removable,
        )
        assert m.idle_total_ns == (w1 - w0) - union
        for la in m.lanes:
            assert la.busy_ns + la.idle_ns == w1 - w0


def test_refusals_and_request_validation():
    with pytest.raises(Refusal) as info:
        emap([])
    assert info.value.code == "empty"
    with pytest.raises(Refusal) as info:
        intervals_from_source(Source(kind="ncu", report="r.csv"), "r.csv")
    assert info.value.code == "no_timeline"
    with pytest.raises(ValidationError):
        ExecutionMapRequest.model_validate(
            {"intervals": [{"lane": "cpu", "name": "a", "start_ns": 5, "end_ns": 1}]}
        )
    with pytest.raises(ValidationError):
        ExecutionMapRequest.model_validate({"intervals": [], "source": {"kind": "torch", "report": "x"}})
    with pytest.raises(ValidationError):
        ExecutionMapRequest.model_validate({})
    with pytest.raises(ValidationError):
        Selector(label="nothing")
    with pytest.raises(ValidationError):
        Selector(label="bad", regex="(")
    with pytest.raises(Refusal) as info:
        intervals_from_torch(TRACE, include=["kernel", "gpu_teleport"])
    assert info.value.code == "bad_request" and info.value.field == "include"


def test_converters_on_the_fixtures_agree():
    t = emap(intervals_from_torch(TRACE))
    n = emap(intervals_from_nsys(NSYS_DB))
    tl = {la.lane: la for la in t.lanes}
    nl = {la.lane: la for la in n.lanes}
    assert set(tl) == {"cpu", "gpu:stream7", "copy:stream7"} and set(nl) == set(tl)
    # The nsys fixture was built from this trace: the GPU lanes carry the same work.
    assert tl["gpu:stream7"].busy_ns == pytest.approx(nl["gpu:stream7"].busy_ns, abs=50)
    assert tl["copy:stream7"].busy_ns == pytest.approx(nl["copy:stream7"].busy_ns, abs=50)
    assert 0 < t.union_coverage <= 1
    gemm = emap(intervals_from_torch(TRACE), remove=[Selector(label="gemm", contains=["nvjet"])]).removable[0]
    assert gemm.matched_intervals == 3 and 0 <= gemm.removable_ns <= gemm.selected_union_ns == 73312
    with_nvtx = emap(intervals_from_nsys(NSYS_DB, include=["kernel", "nvtx"]))
    assert {la.lane for la in with_nvtx.lanes} == {"gpu:stream7", "nvtx"}


def _op(tmp_path: Path, request: dict, *extra: str) -> tuple[int, dict]:
    req = tmp_path / "request.json"
    req.write_text(json.dumps(request))
    out = tmp_path / "out"
    rc = em_op.main(["--request", str(req), *extra, "--out", str(out)])
    return rc, json.loads((out / "result.json").read_text())


def test_op_with_intervals_and_with_sources(tmp_path):
    rc, doc = _op(
        tmp_path,
        {
            "intervals": [
                {"lane": iv.lane, "name": iv.name, "start_ns": iv.start_ns, "end_ns": iv.end_ns}
                for iv in CASE
            ],
            "window": {"start_ns": 0, "end_ns": 60},
            "remove": [{"label": "gemm", "names": ["gemm"]}],
        },
    )
    assert rc == 0 and doc["kind"] == "execution_map" and doc["removable"][0]["removable_ns"] == 10
    assert doc["source_kind"] == "intervals" and len(doc["report_sha256"]) == 64
    rc, doc = _op(
        tmp_path,
        {
            "source": {"kind": "torch", "report": str(TRACE)},
            "remove": [{"label": "h2d", "contains": ["HtoD"]}],
        },
    )
    assert rc == 0 and doc["tool"] == "torch" and doc["removable"][0]["matched_intervals"] == 3
    rc, doc = _op(tmp_path, {"source": {"kind": "nsys", "report": "ignored"}}, "--report", str(NSYS_DB))
    assert rc == 0 and doc["source_kind"] == "nsys"


def test_op_refusals(tmp_path):
    rc, doc = _op(tmp_path, {"source": {"kind": "ncu", "report": str(TRACE)}})
    assert rc == 1 and doc["error"] == "no_timeline"
    rc, doc = _op(tmp_path, {"intervals": [{"lane": "cpu", "name": "a", "start_ns": 3, "end_ns": 1}]})
    assert rc == 1 and doc["error"] == "invalid_request" and doc["field"].startswith("intervals")
    rc, doc = _op(tmp_path, {"source": {"kind": "nsys", "report": str(TRACE)}})
    assert rc == 1 and doc["error"] == "not_sqlite"
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    assert em_op.main(["--request", str(bad), "--out", str(tmp_path / "o2")]) == 1
    assert json.loads((tmp_path / "o2" / "result.json").read_text())["error"] == "not_json"


@pytest.mark.docker
def test_cli_execution_map(tmp_path):
    req = tmp_path / "req.json"
    req.write_text(
        json.dumps(
            {
                "source": {"kind": "torch", "report": str(TRACE)},
                "remove": [{"label": "gemm", "contains": ["nvjet"]}],
            }
        )
    )
    env = dict(os.environ, CKO_STORE=str(tmp_path / "store"))
    p = subprocess.run(
        [sys.executable, "-m", "cko_perf", "execution-map", "--request", str(req), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr
    facts = json.loads(p.stdout)["facts"]
    assert facts["removable"][0]["matched_intervals"] == 3 and {la["lane"] for la in facts["lanes"]} >= {
        "cpu",
        "gpu:stream7",
    }
