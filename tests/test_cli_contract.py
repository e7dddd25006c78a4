"""The agent and CI contract without a container: one JSON envelope on every path (usage, internal,
interrupt), every schema valid, every document valid against the schema it names, the catalogue,
detached operations, ls/stop/handoff, and readable non-TTY tables."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema

from tests.conftest import CKO, ROOT, Result, run_cko

ENV = os.environ | {"PYTHONPATH": str(ROOT)}


@functools.cache
def schema_of(name: str) -> dict:
    """`cko schema NAME --json`, through the CLI in this process (a process per schema cost ~40 s)."""
    from click.testing import CliRunner

    from cko_perf.runner.cli import cli

    r = CliRunner().invoke(cli, ["schema", name, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    return {k: v for k, v in doc.items() if k not in ("ok", "command", "exit_code", "schema")}


def assert_valid(doc: dict, expect_code: int | None = None) -> None:
    """The envelope is there and the document validates against the schema it names."""
    for k in ("ok", "command", "exit_code", "schema"):
        assert k in doc, f"envelope key {k} missing: {doc}"
    assert doc["ok"] is (doc["exit_code"] == 0)
    if expect_code is not None:
        assert doc["exit_code"] == expect_code, doc
    jsonschema.validate(doc, schema_of(doc["schema"]))


def test_usage_errors_keep_the_json_contract() -> None:
    for args, field in (
        (["readiness", "--json", "--bogus"], None),
        (["experiment", "--json"], "request"),
        (["nosuch", "--json"], None),
        (["ls", "--kind", "nope", "--json"], "kinds"),
    ):
        r = run_cko(*args)
        assert r.code == 2, (args, r.stdout, r.stderr)
        assert r.json["error"] in ("usage", "bad_request") and r.json["ok"] is False
        if field:
            assert r.json["field"] == field, r.json
        assert_valid(r.json, 2)


def test_fleet_combine_with_a_bad_list_is_a_bad_request_not_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    r = run_cko("fleet", "combine", "--results", str(bad), "--json")
    assert r.code == 2 and r.json["field"] == "results[0]" and "Traceback" not in r.stderr
    assert_valid(r.json, 2)


def test_an_internal_error_becomes_a_json_document(tmp_path: Path) -> None:
    # The real handler on a real crash: the verify body is replaced by one that raises.
    code = (
        "import cko_perf.runner.commands.store_cmd as m\n"
        "def boom(st):\n    raise RuntimeError('simulated bug')\n"
        "m.verify_store = boom\n"
        "from cko_perf.runner.cli import main\n"
        f"main(['verify', '--json', '--store', {str(tmp_path)!r}])\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
    doc = json.loads(p.stdout)
    assert p.returncode == 1 and doc["error"] == "internal" and "simulated bug" in doc["message"]
    assert "RuntimeError" in p.stderr  # the traceback goes to stderr for the person debugging
    assert_valid(doc, 1)


def test_ctrl_c_exits_130_with_a_json_document(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    op = store / "operations" / "op-20250101T000000-abcdef01"
    op.mkdir(parents=True)
    (op / "argv.json").write_text(json.dumps({"argv": ["audit", "--json"], "cwd": str(tmp_path)}))
    (op / "events.jsonl").write_text("")
    (op / "launcher.pid").write_text(str(os.getpid()))  # alive: the operation looks running forever
    p = subprocess.Popen(
        [*CKO, "status", op.name, "--wait", "--json", "--store", str(store)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        cwd=ROOT,
        # as from a terminal: a suite started in the background (`make test &`) has SIGINT ignored,
        # which its children inherit, and Python then installs no KeyboardInterrupt handler
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    time.sleep(3)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    doc = json.loads(out)
    assert p.returncode == 130 and doc["error"] == "interrupted" and doc["command"] == "status", (out, err)
    assert_valid(doc, 130)


def test_every_listed_schema_is_a_valid_json_schema() -> None:
    names = run_cko("schema", "--json").json["schemas"]
    assert "stats-result" in names and "error" in names and "experiment-result" in names
    for name in names:
        jsonschema.Draft202012Validator.check_schema(schema_of(name))


def test_the_catalogue_names_schemas_and_exit_codes_for_every_command() -> None:
    r = run_cko("commands", "--json")
    assert_valid(r.json, 0)
    cat = {c["name"]: c for c in r.json["commands"]}
    for name in (
        "readiness",
        "baseline",
        "variant",
        "experiment",
        "audit",
        "status",
        "ls",
        "stop",
        "report",
        "champion select",
        "stats compare",
        "schema",
        "commands",
    ):
        assert cat[name]["result_schema"], name
        assert {"0", "2"} <= set(cat[name]["exit_codes"])
    assert cat["experiment"]["request_schema"] == "experiment-request"
    assert {n for n, c in cat.items() if c["detachable"]} == {"readiness", "baseline", "experiment", "audit"}
    names = set(run_cko("schema", "--json").json["schemas"])
    missing = [
        c["result_schema"] for c in cat.values() if c["result_schema"] and c["result_schema"] not in names
    ]
    assert not missing and all(c["result_schema"] for n, c in cat.items() if n != "mcp")


def test_commands_that_need_no_container_validate_against_their_schemas(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    ref, cand = tmp_path / "r.json", tmp_path / "c.json"
    ref.write_text(json.dumps([10.0, 10.2, 9.9, 10.1, 10.0, 10.3, 9.8, 10.1]))
    cand.write_text(json.dumps([9.0, 9.1, 8.9, 9.2, 9.0, 9.1, 8.8, 9.0]))
    runs = [
        run_cko(
            "stats",
            "compare",
            "--reference",
            str(ref),
            "--candidate",
            str(cand),
            "--direction",
            "lower",
            "--min-effect",
            "5",
            "--json",
        ),
        run_cko("ls", "--json", store=store),
        run_cko("verify", "--json", store=store),
        run_cko("report", "--json", store=store),
        run_cko("champion", "show", "--json", store=store),
        run_cko("stop", "--reason", "budget spent", "--json", store=store),
        run_cko("knowledge", "lint", "--json"),
        run_cko("schema", "target", "--json"),
        run_cko("images", "list", "--json"),
    ]
    for r in runs:
        assert r.json["schema"] != "error", r.json
        assert_valid(r.json)
        assert r.code == r.json["exit_code"]
    # refusals of the long operations validate too (exit 2, nothing written)
    r = run_cko("readiness", "--request", str(tmp_path / "missing.json"), "--json", store=tmp_path / "s2")
    assert r.code == 2 and r.json["field"] == "request"
    assert_valid(r.json, 2)
    assert not (tmp_path / "s2").exists()


def test_stop_records_an_immutable_termination_and_the_handoff_cites_it(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    s = run_cko(
        "stop", "--reason", "gains under [items/s] resolution", "--by", "agent-7", "--json", store=store
    )
    assert s.code == 0 and s.json["termination"]["id"].startswith("stp-")
    rec = store / "terminations" / f"{s.json['termination']['id']}.json"
    assert json.loads(rec.read_text())["reason"] == "gains under [items/s] resolution"
    assert any(
        e["path"] == f"terminations/{rec.name}"
        for e in map(json.loads, (store / "ledger.jsonl").read_text().splitlines())
    )
    assert run_cko("verify", "--json", store=store).json["ok"] is True
    rec.write_text(rec.read_text().replace("agent-7", "agent-8"))
    assert run_cko("verify", "--json", store=store).code == 1  # the ledger catches an edited termination
    h = run_cko("report", "--handoff", "-", store=store)
    assert "## Why it stopped" in h.stdout and "gains under [items/s] resolution" in h.stdout
    assert "## Evidence gaps" in h.stdout and "## Rejected directions" in h.stdout


def test_tables_off_a_tty_keep_every_character_and_units_in_brackets(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    reason = "throughput [items/s] did not move: " + "x" * 150
    run_cko("stop", "--reason", reason, store=store)
    r = run_cko("ls", store=store, env={"NO_COLOR": "1", "FORCE_COLOR": "1"})
    assert r.code == 0 and reason in r.stdout and "…" not in r.stdout
    # styles (bold, italic) may stay under NO_COLOR; colours (SGR 30-38, 90-97) may not
    assert not re.search(r"\x1b\[(?:[0-9]+;)*(?:3[0-8]|9[0-7])(?:;[0-9]+)*m", r.stdout), r.stdout[:300]


def test_demo_uses_the_given_store_even_when_cko_store_names_it(tmp_path: Path) -> None:
    d = tmp_path / "demo"
    d.mkdir()
    (d / "something").write_text("x")
    r = run_cko("demo", "--store", str(d), "--json", env={"CKO_STORE": str(d)}, cwd=tmp_path)
    # the given directory is used (and refused: the demo needs a fresh one); ./cko-demo is never created
    assert r.code == 2 and r.json["error"] == "store_not_empty" and str(d) in r.json["message"]
    assert not (tmp_path / "cko-demo").exists()


def test_request_from_stdin_is_read_and_validated(tmp_path: Path) -> None:
    p = subprocess.run(
        [
            *CKO,
            "variant",
            "--request",
            "-",
            "--target",
            "tgt-20250101T000000-abcdef01",
            "--json",
            "--store",
            str(tmp_path / "s"),
        ],
        input='{"path": "x"}',
        capture_output=True,
        text=True,
        env=ENV,
        cwd=ROOT,
        timeout=60,
    )
    doc = Result(p).json
    assert p.returncode == 2 and doc["error"] == "invalid_request" and doc["field"] == "claim"
    assert_valid(doc, 2)
