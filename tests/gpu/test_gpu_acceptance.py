"""GPU acceptance through the CLI (marked gpu: skipped where no NVIDIA GPU is present).

Run on a GPU machine after `source tests/gpu/prepare.sh` and the cuda image build
(tests/gpu/README.md): `python3 -m pytest -q -m gpu tests/gpu`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cko

pytestmark = [pytest.mark.gpu, pytest.mark.docker]


def test_doctor_sees_the_gpu_and_a_usable_passthrough() -> None:
    d = run_cko("doctor", "--json").json
    assert d["gpu"]["available"] is True
    assert d["gpu"]["devices"][0]["uuid"].startswith("GPU-")
    assert any(m["usable"] for m in d["passthrough"] if m["mode"] != "none")


def test_container_sees_exactly_the_granted_gpu(store: Path) -> None:
    r = run_cko("exec", "--image", "cuda", "--gpus", "0", "--json", "--", "nvidia-smi", "-L", store=store)
    assert r.code == 0, r.stdout
    uuid = r.json["identity"]["devices"][0]["uuid"]
    assert uuid in r.json["stdout_tail"] and r.json["stdout_tail"].count("GPU ") == 1
    assert r.json["probe"]["gpus"]["uuids"] == [uuid]


@pytest.mark.parametrize("example", ["torch-layernorm", "cuda-reduce"])
def test_loop_on_gpu_example(example: str, store: Path) -> None:
    ex = ROOT / "examples" / example
    r = run_cko("readiness", "--request", str(ex / "readiness.json"), "--json", store=store, timeout=900)
    assert r.code == 0, r.stdout
    tgt = r.json["target"]["id"]
    assert r.json["identity"]["driver_version"].startswith("580")
    assert run_cko("baseline", "--request", str(ex / "baseline.json"), "--target", tgt, "--json", store=store,
                   timeout=900).code == 0
    v = run_cko("variant", "--request", str(ex / "variant.json"), "--target", tgt, "--json", store=store).json
    t = run_cko("experiment", "--request", str(ex / "target.json"), "--target", tgt, "--variant",
                v["variant"]["id"], "--json", store=store, timeout=900)
    assert t.code == 0, t.stdout
    assert t.json["outcome"] == "accepted", json.dumps(t.json)[:2000]
