"""The optimisation loop through the CLI on the NumPy example, in the real sandbox (issues 4 and 5)."""

from __future__ import annotations

import json
import shutil

import pytest

from cko_perf.runner.canonical import sha256_file
from tests.conftest import ROOT, run_cko

pytestmark = pytest.mark.docker
EX = ROOT / "examples" / "numpy-softmax"

SLOWER = '''import numpy as np


def softmax(x):
    """Same function, one strided column at a time: thousands of small passes over cold memory."""
    m = x.max(axis=1)
    out = np.empty_like(x)
    for j in range(x.shape[1]):
        out[:, j] = np.exp(x[:, j] - m)
    s = out.sum(axis=1)
    for j in range(x.shape[1]):
        out[:, j] /= s
    return out
'''

WRONG = """import numpy as np


def softmax(x):
    e = np.exp(x)  # forgets the max shift and the normalisation: fast and wrong
    return e
"""


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("loop")
    work = tmp / "numpy-softmax"
    shutil.copytree(EX, work, ignore=shutil.ignore_patterns("__pycache__"))
    req = json.loads((work / "readiness.json").read_text())
    req["cases"] = [{"id": "r512x2048", "params": {"rows": 512, "cols": 2048}}]
    req["exclude"] += ["slower", "wrong", "outside", "same"]
    # A shared 2-core CI host: the ceiling is the whole machine (declared); load balance is still tested
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
    for name, code in (("slower", SLOWER), ("wrong", WRONG)):
        (work / name).mkdir()
        (work / name / "kernel.py").write_text(code)
    (work / "outside").mkdir()
    (work / "outside" / "driver.py").write_text("print('harness changed')\n")
    (work / "same").mkdir()
    shutil.copy(work / "kernel.py", work / "same" / "kernel.py")
    store = tmp / "store"
    r = run_cko("readiness", "--request", str(work / "readiness.json"), "--json", store=store)
    assert r.code == 0, r.stderr
    return {"work": work, "store": store, "target": r.json["target"]}


def _variant(loop: dict, path: str, claim: str = "c") -> dict:
    req = loop["work"] / f"variant-{path}.json"
    req.write_text(json.dumps({"path": path, "claim": claim}))
    r = run_cko(
        "variant", "--request", str(req), "--target", loop["target"]["id"], "--json", store=loop["store"]
    )
    return {"code": r.code, "doc": r.json}


def _experiment(loop: dict, variant: str, stage: str, seed: int = 3, **extra: object) -> tuple[int, dict]:
    req = loop["work"] / f"exp-{variant}-{stage}-{seed}.json"
    req.write_text(json.dumps({"stage": stage, "seed": seed, **extra}))
    r = run_cko(
        "experiment",
        "--request",
        str(req),
        "--target",
        loop["target"]["id"],
        "--variant",
        variant,
        "--json",
        store=loop["store"],
        timeout=600,
    )
    return r.code, r.json


def test_target_is_frozen_with_matching_hash(loop: dict) -> None:
    path = loop["store"] / "targets" / f"{loop['target']['id']}.json"
    assert sha256_file(path) == loop["target"]["sha256"]
    t = json.loads(path.read_text())
    assert t["original"]["files"] >= 2 and t["identity"]["image"]["id"].startswith("sha256:")
    assert t["smoke"]["id"].startswith("inv-")
    digest = t["original"]["manifest"]["sha256"]
    manifest = json.loads((loop["store"] / "objects" / "sha256" / digest[:2] / digest).read_text())
    paths = sorted(f["path"] for f in manifest["files"])
    assert paths == ["driver.py", "kernel.py"]  # candidate dirs, requests and docs are excluded


def test_baseline_samples_and_resolution(loop: dict) -> None:
    req = loop["work"] / "baseline.json"
    r = run_cko(
        "baseline",
        "--request",
        str(req),
        "--target",
        loop["target"]["id"],
        "--json",
        store=loop["store"],
        timeout=600,
    )
    assert r.code == 0, r.stderr
    doc = r.json
    rec = json.loads((loop["store"] / "baselines" / f"{doc['baseline']['id']}.json").read_text())
    assert len(rec["cases"][0]["samples"]) == 8  # baseline.json asks for 8 per case
    assert rec["aa_pairs"] == 12
    assert doc["resolution_pct"] > 0
    assert isinstance(doc["min_effect_resolvable"], bool) and "resolution" in doc["note"]


def test_variant_outside_allowed_paths_is_refused_by_name(loop: dict) -> None:
    before = list((loop["store"] / "variants").glob("*.json"))
    v = _variant(loop, "outside")
    assert v["code"] == 2
    assert "driver.py" in v["doc"]["message"] and v["doc"]["field"] == "path"
    assert list((loop["store"] / "variants").glob("*.json")) == before


def test_identical_variant_is_an_aa_control(loop: dict) -> None:
    v = _variant(loop, "same")
    assert v["code"] == 0 and v["doc"]["identical_to_parent"] is True
    code, doc = _experiment(loop, v["doc"]["variant"]["id"], "screen")
    assert code == 0
    assert doc["aa_control"] is True
    assert "aa_control" in doc["reason_codes"]
    assert doc["stage_outcome"] != "promising" or doc["cases"][0]["ci_low_pct"] < 5


def test_screen_target_select_audit(loop: dict) -> None:
    v = _variant(loop, "candidate", "one buffer instead of three temporaries")
    assert v["code"] == 0 and v["doc"]["changed"] == ["kernel.py"]
    vid = v["doc"]["variant"]["id"]
    code, screen = _experiment(loop, vid, "screen")
    assert code == 0
    assert screen["stage_outcome"] in ("promising", "open")  # a screen never accepts
    sel = run_cko(
        "champion", "select", "--experiment", screen["experiment"]["id"], "--json", store=loop["store"]
    )
    assert sel.code == 1 and sel.json["error"] == "not_target_stage"
    code, target = _experiment(loop, vid, "target")
    assert code == 0
    case = target["cases"][0]
    # 16 pairs measured; the supervisor may void a few blocks on a busy host (counted as excluded)
    assert case["pairs"] + case["excluded"] == 16 and case["pairs"] >= 12, case
    assert case["effect_pct"] > 0
    # The example's gain is real but modest: two shared cores may not resolve it. Either way the
    # stage decided, and select follows the stage outcome (the 25x cases in test_verdict_rules.py
    # carry the verdict-dependent checks that must not depend on an idle host).
    assert target["stage_outcome"] in ("accepted", "inconclusive"), target
    sel = run_cko(
        "champion", "select", "--experiment", target["experiment"]["id"], "--json", store=loop["store"]
    )
    rep = loop["work"] / "report.html"
    r = run_cko("report", "--html", str(rep), "--json", store=loop["store"])
    assert r.code == 0 and "<svg" in rep.read_text() and "stage outcome" in rep.read_text()
    if target["stage_outcome"] != "accepted":
        assert sel.code == 1 and sel.json["error"] == "not_accepted", sel.stdout
        return
    assert target["supports"]["claim_supported"] and target["supports"]["claim_layer"] == "kernel"
    assert sel.code == 0, sel.stdout
    # a second select of the same evidence loses: the champion is no longer the original it beat
    again = run_cko(
        "champion", "select", "--experiment", target["experiment"]["id"], "--json", store=loop["store"]
    )
    assert again.code == 1 and again.json["error"] == "champion_already_selected"
    show = run_cko("champion", "show", "--json", store=loop["store"]).json
    assert show["champion"]["variant"]["id"] == vid and len(show["history"]) == 1


def test_wrong_candidate_fails_accuracy_and_blocks_later_stages(loop: dict) -> None:
    v = _variant(loop, "wrong")
    vid = v["doc"]["variant"]["id"]
    code, doc = _experiment(loop, vid, "screen")
    assert code == 1
    assert doc["stage_outcome"] == "failed_accuracy" and doc["primary_verdict"] == "void"
    code, doc = _experiment(loop, vid, "target")
    assert code == 2 and doc["error"] == "earlier_stage_failed"


def test_rejected_screen_refuses_target_even_with_a_new_plan(loop: dict) -> None:
    v = _variant(loop, "slower")
    vid = v["doc"]["variant"]["id"]
    code, doc = _experiment(loop, vid, "screen")
    assert code == 0
    assert doc["stage_outcome"] == "rejected", doc
    assert doc["primary_verdict"] == "regressed"
    code, doc2 = _experiment(loop, vid, "target", seed=99, pairs=40)
    assert code == 2 and doc2["error"] == "screen_rejected"


def test_tampering_is_detected_by_verify_and_audit(loop: dict) -> None:
    assert run_cko("verify", "--json", store=loop["store"]).json["ok"] is True
    exp = sorted((loop["store"] / "experiments").glob("*.json"))[0]
    data = exp.read_bytes()
    exp.write_bytes(
        data.replace(b'"stage":"screen"', b'"stage":"target"', 1)
        if b'"stage":"screen"' in data
        else data + b" "
    )
    v = run_cko("verify", "--json", store=loop["store"])
    a = run_cko("audit", "--json", store=loop["store"])
    exp.write_bytes(data)
    if v.code == 0:  # the tampered record was referenced by nothing: verify cannot see content changes there
        pytest.fail("verify missed an altered record")
    assert a.code == 1 and a.json["answer"] == "does_not_hold"
