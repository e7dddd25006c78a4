"""The agent and CI interface on the CPU example, in the real sandbox: a real MCP client session runs
readiness -> baseline -> variant -> experiment; --detach with status --wait and per-look events; the CI
exports; the HTML report rendered in headless Chromium."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cko
from tests.test_cli_contract import assert_valid

EX = ROOT / "examples" / "numpy-softmax"
pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _small_example(tmp: Path) -> Path:
    work = tmp / "numpy-softmax"
    shutil.copytree(EX, work, ignore=shutil.ignore_patterns("__pycache__"))
    req = json.loads((work / "readiness.json").read_text())
    req["cases"] = [{"id": "r512x2048", "params": {"rows": 512, "cols": 2048}}]
    # a shared 2-core CI host: the ceiling is the whole machine (declared)
    req["plan"].update(
        {
            "screen_pairs": 8,
            "target_pairs": 16,
            "baseline_samples": 6,
            "aa_pairs": 8,
            "load": {"max_foreign_cpu_share": 1.0},
        }
    )
    (work / "readiness.json").write_text(json.dumps(req))
    return work


def _mcp_loop(work: Path, store: Path) -> dict:
    import anyio
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    async def main() -> dict:
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "cko_perf", "mcp", "--store", str(store)],
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
            cwd=str(ROOT),
        )
        out: dict = {}
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            tools = {t.name: t for t in (await s.list_tools()).tools}
            out["tools"] = tools
            req = json.loads((work / "readiness.json").read_text())
            calls = [("readiness", {"request": req, "request_dir": str(work)})]
            for name, args in calls:
                res = await s.call_tool(name, args)
                out[name] = res
            assert "target" in (out["readiness"].structured_content or {}), out["readiness"]
            tid = out["readiness"].structured_content["target"]["id"]
            out["baseline"] = await s.call_tool("baseline", {"request": {"seed": 1}, "target": tid})
            out["variant"] = await s.call_tool(
                "variant",
                {
                    "request": json.loads((work / "variant.json").read_text()),
                    "request_dir": str(work),
                    "target": tid,
                },
            )
            vid = out["variant"].structured_content["variant"]["id"]
            out["experiment"] = await s.call_tool(
                "experiment",
                {
                    "request": {
                        "stage": "screen",
                        "seed": 3,
                        "hypothesis": "one buffer: fewer passes",
                        "mechanism_key": "memory.temporaries",
                        "cheapest_falsifier": {"why_none": "the screen is the cheapest check"},
                        "estimated_cost": {"p50_s": 20, "p90_s": 60, "gpus": 0},
                    },
                    "target": tid,
                    "variant": vid,
                },
            )
            out["tid"], out["vid"] = tid, vid
        return out

    return anyio.run(main)


@pytest.fixture(scope="module")
def agent_loop(tmp_path_factory: pytest.TempPathFactory) -> dict:
    pytest.importorskip("mcp", reason="the mcp package is not installed (pip install 'cko[mcp]')")
    tmp = tmp_path_factory.mktemp("agent")
    work = _small_example(tmp)
    store = tmp / "store"
    out = _mcp_loop(work, store)
    return {"work": work, "store": store, "tmp": tmp, **out}


def test_mcp_session_lists_tools_and_runs_the_loop(agent_loop: dict) -> None:
    tools = agent_loop["tools"]
    assert {"readiness", "baseline", "variant", "experiment", "status", "champion_select", "audit"} <= set(
        tools
    )
    exp_schema = tools["experiment"].input_schema
    assert exp_schema["properties"]["request"]["properties"]["stage"]["enum"] == ["screen", "target", "audit"]
    for name in ("readiness", "baseline", "variant"):
        res = agent_loop[name]
        assert not res.is_error, (name, res.structured_content)
        assert_valid(res.structured_content, 0)
    exp = agent_loop["experiment"].structured_content
    # exit 1 only for a stage whose samples were voided (a loaded 2-core host can trip the supervisor's
    # clock check); is_error mirrors the exit code either way
    assert_valid(exp, 1 if exp["stage_outcome"] in ("integrity_violation", "failed_run") else 0)
    assert agent_loop["experiment"].is_error is (exp["exit_code"] != 0)
    assert exp["stage"] == "screen"
    assert exp["mechanism_key"] == "memory.temporaries" and exp["cost"]["estimated"]["p90_s"] == 60
    assert exp["cost"]["actual"]["seconds"] > 0 and exp["cost"]["vs_estimate"] in (
        "within p50",
        "within p90",
        "beyond p90",
    )
    rec = json.loads((agent_loop["store"] / "experiments" / f"{exp['experiment']['id']}.json").read_text())
    assert rec["hypothesis"] == "one buffer: fewer passes" and rec["cheapest_falsifier"]["why_none"]


def test_detached_experiment_answers_at_once_and_records_per_look_events(agent_loop: dict) -> None:
    work, store = agent_loop["work"], agent_loop["store"]
    # a fresh snapshot of the same change, so this target stage does not hang on the screen's outcome
    (work / "candidate2").mkdir()
    (work / "candidate2" / "kernel.py").write_text(
        (work / "candidate" / "kernel.py").read_text() + "\n# v2\n"
    )
    (work / "variant2.json").write_text(
        json.dumps({"path": "candidate2", "claim": "same change, new snapshot"})
    )
    v2 = run_cko(
        "variant",
        "--request",
        str(work / "variant2.json"),
        "--target",
        agent_loop["tid"],
        "--json",
        store=store,
    )
    assert v2.code == 0, v2.stdout
    req = work / "target-seq.json"
    req.write_text(
        json.dumps(
            {
                "stage": "target",
                "seed": 12,
                "sequential": True,
                "cheapest_falsifier": {
                    "tried": "screen",
                    "result": agent_loop["experiment"].structured_content["experiment"]["id"],
                },
            }
        )
    )
    d = run_cko(
        "experiment",
        "--request",
        str(req),
        "--target",
        agent_loop["tid"],
        "--variant",
        v2.json["variant"]["id"],
        "--detach",
        "--json",
        store=store,
        timeout=60,
    )
    assert d.code == 0 and d.json["invocation_id"].startswith("op-") and d.json["schema"] == "detached-result"
    assert_valid(d.json, 0)
    w = run_cko(
        "status", d.json["invocation_id"], "--wait", "--timeout", "900", "--json", store=store, timeout=960
    )
    assert_valid(w.json)
    op = w.json["operation"]
    assert op["state"] in ("succeeded", "failed") and w.code == op["exit_code"], op
    assert_valid(op["result"], op["exit_code"])
    events = [e["event"] for e in w.json["events"]]
    assert events[0] == "started" and events[-1] == "ended"
    assert "estimate_final" in events and "cost" in events and "progress" in events, events
    if op["result"]["stage_outcome"] not in ("integrity_violation", "failed_run"):
        look = next(e for e in w.json["events"] if e["event"] == "look")  # each look's running estimate
        assert look["pairs_done"] >= 10 and look["pairs_planned"] == 16 and look["cases"][0]["case_verdict"]
        assert {"effect_pct", "ci_low_pct", "ci_high_pct", "pairs"} <= set(
            look["cases"][0]
        )  # None below a look
    assert op["result"]["cheapest_falsifier"]["result_ref"]["kind"] == "experiment"
    ls = run_cko("ls", "--kind", "operations", "--kind", "experiments", "--json", store=store)
    assert_valid(ls.json, 0)
    assert {i["kind"] for i in ls.json["items"]} == {"operation", "experiment"}
    only = run_cko("ls", "--kind", "experiments", "--stage", "screen", "--json", store=store).json["items"]
    assert [i["stage"] for i in only] == ["screen"]


def test_ci_exports_junit_and_fail_on(agent_loop: dict) -> None:
    work, store, tmp = agent_loop["work"], agent_loop["store"], agent_loop["tmp"]
    req = work / "screen-ci.json"
    req.write_text(json.dumps({"stage": "screen", "seed": 21}))
    ej, em, ju = tmp / "e.json", tmp / "e.md", tmp / "e.xml"
    r = run_cko(
        "experiment",
        "--request",
        str(req),
        "--target",
        agent_loop["tid"],
        "--variant",
        agent_loop["vid"],
        "--export-json",
        str(ej),
        "--export-markdown",
        str(em),
        "--junit",
        str(ju),
        "--fail-on",
        "promising,open,rejected,integrity_violation",
        "--json",
        store=store,
        timeout=900,
    )
    assert_valid(r.json)
    assert r.code == 1 and r.json["fail_on"]["matched"] == [r.json["stage_outcome"]]  # opt-in nonzero exit
    rows = json.loads(ej.read_text())["results"]
    if r.json["stage_outcome"] != "integrity_violation":  # voided samples have no rows
        assert rows[0]["unit"] == "ms" and rows[0]["reference_median"] > 0 and rows[0]["ratio"] > 0
    assert "| case | reference median [ms]" in em.read_text()
    suite = ET.parse(ju).getroot()
    cases = suite.findall("testcase")
    assert (
        len(cases) == max(1, len(rows)) and float(suite.get("time")) > 0 and float(cases[0].get("time")) > 0
    )
    bad = run_cko(
        "experiment",
        "--request",
        str(req),
        "--target",
        agent_loop["tid"],
        "--fail-on",
        "nope",
        "--json",
        store=store,
    )
    assert bad.code == 2 and bad.json["field"] == "fail_on"


def test_html_report_renders_in_headless_chromium(agent_loop: dict) -> None:
    store, tmp = agent_loop["store"], agent_loop["tmp"]
    page = tmp / "report.html"
    r = run_cko("report", "--html", str(page), "--json", store=store)
    assert r.code == 0
    assert_valid(r.json, 0)
    html = page.read_text()
    for must in (
        "Summary",
        "ratio",
        "stage outcome",
        "case verdict",
        agent_loop["vid"],
        "memory.temporaries",
        "minimum effect",
        "A/A resolution",
        "Candidates and their stages",
        "<svg",
    ):
        assert must in html, must
    assert "<script" not in html and 'src="http' not in html and 'href="http' not in html  # self-contained
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip(
            "chromium is not installed (apt-get install chromium): the screenshot half is not checked"
        )
    shot = tmp / "report.png"
    p = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            f"--screenshot={shot}",
            "--window-size=1280,2400",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shot.is_file(), p.stderr[-2000:]
    console = [ln for ln in p.stderr.splitlines() if "CONSOLE" in ln or "Failed to load resource" in ln]
    assert not console, console
    import matplotlib.image as mpimg

    img = mpimg.imread(shot)[..., :3]
    non_white = (img.sum(axis=2) < 2.9).mean()
    assert non_white > 0.02 and img.std() > 0.05, (non_white, img.std())  # not blank
