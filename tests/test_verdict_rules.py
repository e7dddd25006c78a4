"""Verdict rules through the CLI in the real sandbox (issue 19).

The workload: the NumPy softmax example turned around -- a slow column-at-a-time original (8192 tiny NumPy calls per run) and the
example's vectorised kernel as the candidate, several times faster, so every verdict here is far
from its boundary on a loaded 2-core host. A constraint on the memory-bus pressure the kernel puts
on co-located work (bytes per second, lower is better) is what a faster kernel regresses: +300%
on the primary and the constraint 4x worse, as in the issue.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cko_perf.runner.canonical import sha256_bytes
from tests.conftest import ROOT, run_cko

pytestmark = pytest.mark.docker
EX = ROOT / "examples" / "numpy-softmax"

SLOW = """import numpy as np


def softmax(x):
    m = x.max(axis=1)
    out = np.empty_like(x)
    for j in range(x.shape[1]):
        out[:, j] = np.exp(x[:, j] - m)
    s = out.sum(axis=1)
    for j in range(x.shape[1]):
        out[:, j] /= s
    return out
"""

DRIVER = """import numpy as np

from operations.driver import main


def make_inputs(case, rng, device):
    return {"x": rng.standard_normal((case["rows"], case["cols"])) * 4.0}


def run(impl, inputs):
    return impl.softmax(inputs["x"])


def reference(case, inputs):
    x = inputs["x"].astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def bus(params, t_ns):
    return params["rows"] * params["cols"] * 8 * 2 / (t_ns / 1e9)  # bytes the kernel streams per second


if __name__ == "__main__":
    raise SystemExit(main(make_inputs=make_inputs, run=run, reference=reference,
                          extra_metrics={"bus_bytes_per_s": ("bytes/s", bus)}))
"""
BUS = {"name": "bus_bytes_per_s", "unit": "bytes/s", "direction": "lower"}


def _workload(tmp: Path) -> Path:
    w = tmp / "serve"
    (w / "common").mkdir(parents=True)  # a subdirectory that sorts before driver.py
    (w / "driver.py").write_text(DRIVER)
    (w / "kernel.py").write_text(SLOW)
    (w / "common" / "notes.py").write_text("ROWS_HINT = 16\n")
    (w / "fast").mkdir()
    shutil.copy(EX / "kernel.py", w / "fast" / "kernel.py")
    (w / "same" / "common").mkdir(parents=True)
    (w / "same" / "kernel.py").write_text(SLOW)
    (w / "same" / "common" / "notes.py").write_text("ROWS_HINT = 16\n")
    return w


def _readiness(w: Path, store: Path, name: str, constraints: list[dict]) -> str:
    req = {
        "name": name,
        "claim_layer": "kernel",
        "workload": ".",
        "allowed_paths": ["kernel.py", "common/notes.py"],
        "exclude": ["fast", "same", "*.json"],
        "driver": {"command": ["python", "driver.py"]},
        "cases": [{"id": "r16x4096", "params": {"rows": 16, "cols": 4096}}],
        "objective": {
            "primary": {"name": "time", "unit": "ms", "direction": "lower"},
            "min_effect_pct": 5.0,
            "constraints": constraints,
        },
        "accuracy": {"rel_l2": 1e-9, "check_fraction": 0.25},
        # min_pairs 6 with sequential looks is the traceback; the ceiling is the whole
        # machine (declared): a shared CI host, where arm balance is what protects the verdict
        "plan": {
            "screen_pairs": 6,
            "target_pairs": 16,
            "min_pairs": 6,
            "warmup": 1,
            "acquisition": "same_process",
            "load": {"max_foreign_cpu_share": 1.0},
        },
        "timeout_s": 600,
        "process_timeout_s": 300,
        "memory": "2g",
    }
    p = w / f"readiness-{name}.json"
    p.write_text(json.dumps(req))
    r = run_cko("readiness", "--request", str(p), "--json", store=store, timeout=600)
    assert r.code == 0, r.stdout[-3000:] + r.stderr[-2000:]
    return str(r.json["target"]["id"])


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("verdicts")
    w = _workload(tmp)
    store = tmp / "store"
    ids = {
        "c": _readiness(w, store, "serve-c", [{"metric": BUS, "max_regression_pct": 10}]),
        "a": _readiness(w, store, "serve-a", []),
        "b": _readiness(w, store, "serve-b", []),
    }
    return {"work": w, "store": store, "t": ids, "exp": {}}


def _variant(env: dict, target: str, path: str) -> dict:
    req = env["work"] / f"variant-{target}-{path}.json"
    req.write_text(json.dumps({"path": path, "claim": f"{path} kernel"}))
    r = run_cko("variant", "--request", str(req), "--target", env["t"][target], "--json", store=env["store"])
    assert r.code == 0, r.stdout
    return r.json


def _experiment(env: dict, target: str, vid: str, **req: object) -> tuple[int, dict]:
    p = env["work"] / f"exp-{target}-{vid}-{len(list(env['work'].glob('exp-*')))}.json"
    p.write_text(json.dumps({"seed": 3} | req))
    r = run_cko(
        "experiment",
        "--request",
        str(p),
        "--target",
        env["t"][target],
        "--variant",
        vid,
        "--json",
        store=env["store"],
        timeout=600,
    )
    return r.code, r.json


def _count(env: dict, kind: str) -> int:
    return len(list((env["store"] / kind).glob("*.json")))


def test_sequential_looks_validate_min_pairs_up_front(env: dict) -> None:
    vid = _variant(env, "a", "fast")["variant"]["id"]
    env["va"] = vid
    before = _count(env, "experiments")
    code, doc = _experiment(env, "a", vid, stage="target", sequential=True)
    assert code == 2 and doc["field"] == "plan.min_pairs", doc
    assert "min_pairs" in doc["message"] and _count(env, "experiments") == before


def test_constraint_violating_candidate_is_refused_at_select(env: dict) -> None:
    vid = _variant(env, "c", "fast")["variant"]["id"]
    env["vc"] = vid
    code, doc = _experiment(env, "c", vid, stage="target")
    assert code == 0, doc
    assert doc["primary_verdict"] == "accepted", (
        doc.get("reasons"),
        doc.get("cases"),
    )  # several times faster
    assert doc["constraint_verdicts"] == {"bus_bytes_per_s": "violated"}
    assert doc["stage_outcome"] == "constraint_violated" and doc["blocking_constraints"] == [
        "bus_bytes_per_s"
    ]
    assert "bus_bytes_per_s" in doc["stage_outcome_text"] and "constraint_violated" in doc["reason_codes"]
    # the case row's verdict is the primary's: it says that the stage outcome is another
    row = doc["cases"][0]
    assert (
        row["case_verdict"] == "accepted" and "stage outcome: constraint_violated" in row["case_verdict_text"]
    )
    assert doc["supports"]["claim_supported"] is False
    env["exp"]["c"] = doc["experiment"]["id"]
    sel = run_cko("champion", "select", "--experiment", doc["experiment"]["id"], "--json", store=env["store"])
    assert sel.code == 1 and sel.json["error"] == "constraint_violated", sel.stdout
    assert not (env["store"] / "champion" / f"{env['t']['c']}.json").exists()


def test_a_decided_target_stage_is_final_for_its_snapshot(env: dict) -> None:
    before = _count(env, "experiments")
    code, doc = _experiment(env, "c", env["vc"], stage="target", seed=99, pairs=12)
    assert code == 2 and doc["error"] == "target_stage_final", doc
    assert doc["detail"]["experiment"] == env["exp"]["c"] and doc["field"] == "stage"
    assert _count(env, "experiments") == before


def _rechain(store: Path, rel: str, data: bytes) -> None:
    """What a forger with write access does to an unkeyed ledger: new digest, chain recomputed."""
    lines = (store / "ledger.jsonl").read_bytes().splitlines()
    out, prev = [], "0" * 64
    for raw in lines:
        e = json.loads(raw)
        if e["path"] == rel:
            e["sha256"] = sha256_bytes(data)
        e["prev"] = prev
        line = json.dumps(e, sort_keys=True, separators=(",", ":")).encode()
        out.append(line)
        prev = sha256_bytes(line)
    (store / "ledger.jsonl").write_bytes(b"\n".join(out) + b"\n")


def test_an_edited_record_is_refused_by_select_and_verify(env: dict) -> None:
    store = env["store"]
    rel = f"experiments/{env['exp']['c']}.json"
    path, ledger = store / rel, (store / "ledger.jsonl").read_bytes()
    original = path.read_bytes()
    doc = json.loads(original)
    doc.update(
        {
            "outcome": "accepted",
            "blocking_constraints": [],
            "constraint_verdicts": {"bus_bytes_per_s": "ok"},
            "reasons": [r for r in doc["reasons"] if r["code"] != "constraint_violated"],
        }
    )
    edited = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    try:
        path.write_bytes(edited)
        _rechain(store, rel, edited)
        sel = run_cko("champion", "select", "--experiment", env["exp"]["c"], "--json", store=store)
        assert sel.code == 1 and sel.json["error"] == "verdict_mismatch", sel.stdout
        v = run_cko("verify", "--json", store=store)
        assert v.code != 0 and not v.json["ok"]
        assert [
            p for p in v.json["problems"] if p["path"] == rel and p["problem"].startswith("verdict_mismatch")
        ]
    finally:
        path.write_bytes(original)
        (store / "ledger.jsonl").write_bytes(ledger)
    assert run_cko("verify", "--json", store=store).json["ok"] is True


def test_two_targets_keep_two_champions(env: dict) -> None:
    vb = _variant(env, "b", "fast")["variant"]["id"]
    for key, vid in (("a", env["va"]), ("b", vb)):
        code, doc = _experiment(env, key, vid, stage="target")
        assert code == 0 and doc["stage_outcome"] == "accepted", (doc.get("reasons"), doc.get("cases"))
        sel = run_cko(
            "champion", "select", "--experiment", doc["experiment"]["id"], "--json", store=env["store"]
        )
        assert sel.code == 0, sel.stdout
        assert [s["experiment"]["id"] for s in sel.json["stages"]] == [doc["experiment"]["id"]]
        assert sel.json["supports"]["claim_layer"] == "kernel" and sel.json["supports"]["claim_supported"]
    show = run_cko("champion", "show", "--json", store=env["store"])
    assert show.code == 0
    champs = show.json["champions"]
    assert set(champs) == {env["t"]["a"], env["t"]["b"]}
    assert {tid: c["pointer"]["target"]["id"] for tid, c in champs.items()} == {t: t for t in champs}
    assert champs[env["t"]["b"]]["pointer"]["variant"]["id"] == vb
    # restoring one Target needs evidence, and leaves the other's champion alone
    r = run_cko("champion", "restore", "--target", env["t"]["a"], "--json", store=env["store"])
    assert r.code == 2 and r.json["error"] == "restore_needs_evidence"


def test_audit_answers_three_ways_with_matching_junit(env: dict, tmp_path: Path) -> None:
    store = env["store"]
    junit = tmp_path / "audit.xml"
    a = run_cko("audit", "--junit", str(junit), "--json", store=store, timeout=900)
    assert a.code == 0 and a.json["answer"] == "holds", a.stdout[-3000:]
    assert 'failures="0"' in junit.read_text() and 'errors="0"' in junit.read_text()
    held = a.json["targets"][env["t"]["a"]]["audit_experiment"]["experiment"]["id"]
    env["held_audit"] = held
    # could not check (the Target's exact image in none of engine, store, cache, registry) and the
    # audit that runs in that image whatever the lock names now: tests/test_images_portable.py (issue 21)
    # does not hold: a champion pointer that names a variant the store does not have
    ptr = store / "champion" / f"{env['t']['b']}.json"
    saved = ptr.read_bytes()
    doc = json.loads(saved)
    doc["variant"]["sha256"] = "f" * 64
    try:
        ptr.write_text(json.dumps(doc))
        a = run_cko("audit", "--junit", str(junit), "--json", store=store)
        assert a.code == 1 and a.json["answer"] == "does_not_hold", a.stdout[-3000:]
        assert "<failure" in junit.read_text() and 'failures="0"' not in junit.read_text()
        for cmd in (("champion", "show"), ("verify",)):
            r = run_cko(*cmd, "--json", store=store)
            assert r.code == 1 and "dangling_champion" in r.stdout, r.stdout
    finally:
        ptr.write_bytes(saved)


def test_restore_needs_a_rejecting_audit_or_a_recorded_reason(env: dict) -> None:
    tid, store = env["t"]["a"], env["store"]
    r = run_cko("champion", "restore", "--target", tid, "--audit", env["held_audit"], "--json", store=store)
    assert r.code == 1 and r.json["error"] == "audit_does_not_reject", r.stdout
    r = run_cko("champion", "restore", "--target", tid, "--reason", "rollback drill", "--json", store=store)
    assert r.code == 0 and r.json["evidence"] == "operator_reason" and r.json["champion"]["variant"] is None
    show = run_cko("champion", "show", "--json", store=store).json
    assert (
        show["champions"][env["t"]["b"]]["pointer"]["variant"] is not None
    )  # the other Target keeps its own
    assert [h["evidence"] for h in show["history"] if h["target"] == tid] == [
        "target_stage",
        "operator_reason",
    ]


def test_identical_code_with_subdirectories_is_an_aa_control(env: dict) -> None:
    v = _variant(env, "c", "same")
    target = json.loads((env["store"] / "targets" / f"{env['t']['c']}.json").read_text())
    assert v["identical_to_parent"] is True and v["snapshot"] == target["original"]["sha256"]
    code, doc = _experiment(env, "c", v["variant"]["id"], stage="screen")
    assert code == 0 and doc["aa_control"] is True and "aa_control" in doc["reason_codes"], doc
    assert doc["supports"]["claim_supported"] is False
