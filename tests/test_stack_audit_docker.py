"""`cko audit --stack` against the real engine, on CPU: the bundled numpy-softmax in three images.

- `cpu`   : cko's own image (the tracked lock's entry);
- `cpu-b` : the same recipe under another name: the same layers and packages, another image id
            (its labels differ): an "image" upgrade that changes nothing the workload runs;
- `cpu-t` : cpu plus a dist-info-only wheel that says it is triton 0.0.1: another image id AND a
            triton version in the identity, so declaring it as only "image" must be refused.

The images are recorded in a private copy of the lock (CKO_IMAGES_LOCK), so the tracked
cko-images.lock is untouched. Other tests load this host: the verdict is asserted only where it is
robust. Identical packages must never come out faster or slower by more than the Target's minimum
effect (25 % here); no_difference or, under load, inconclusive are both honest.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cko

pytestmark = [pytest.mark.docker, pytest.mark.slow]

FAKE = "triton-0.0.1"


def _fake_wheel(wheelhouse: Path) -> None:
    """A wheel with only its metadata: installs nothing importable, but the probe reads its version."""
    files = {
        f"{FAKE}.dist-info/METADATA": "Metadata-Version: 2.1\nName: triton\nVersion: 0.0.1\n",
        f"{FAKE}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: cko-test\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files[f"{FAKE}.dist-info/RECORD"] = "\n".join([*record, f"{FAKE}.dist-info/RECORD,,"]) + "\n"
    wheelhouse.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheelhouse / "triton-0.0.1-py3-none-any.whl", "w") as z:
        for name, text in files.items():
            z.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), text)


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("stack-lock")
    lock = root / "cko-images.lock"
    shutil.copy(ROOT / "cko-images.lock", lock)
    recipes = root / "cko-images"
    recipes.mkdir()
    (recipes / "cpu-b.yaml").write_text("description: the cpu image under another name\nbase: cpu\n")
    (recipes / "cpu-t.yaml").write_text(
        "description: cpu plus a triton that says 0.0.1\nbase: cpu\npackages: [triton==0.0.1]\n"
    )
    _fake_wheel(root / "wheels")
    env = {"CKO_IMAGES_LOCK": str(lock)}
    for name, extra in (("cpu", {}), ("cpu-b", {}), ("cpu-t", {"CKO_WHEELHOUSE": str(root / "wheels")})):
        r = run_cko("images", "build", name, "--if-missing", "--json", env=env | extra, timeout=600)
        assert r.code == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return env


def _target(tmp: Path, store: Path, env: dict[str, str], image: str) -> str:
    work = tmp / f"softmax-{image}"
    if not work.exists():
        shutil.copytree(
            ROOT / "examples" / "numpy-softmax", work, ignore=shutil.ignore_patterns("__pycache__")
        )
    req = json.loads((work / "readiness.json").read_text())
    req["cases"] = [{"id": "rows256x1024", "params": {"rows": 256, "cols": 1024}}]
    # A shared, loaded host: a false faster/slower needs every one of the 25 cross-round differences
    # on one side (5+5 rounds at 99 %: at most 0.8 % under equal stacks) AND beyond 25 %.
    req["objective"]["min_effect_pct"] = 25.0
    req["plan"].update({"warmup": 1, "confidence": 0.99, "load": {"max_foreign_cpu_share": 1.0}})
    req.update({"image": image, "memory": "1g"})
    (work / "readiness.json").write_text(json.dumps(req))
    r = run_cko("readiness", "--request", str(work / "readiness.json"), "--json", store=store, env=env)
    assert r.code == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return str(r.json["target"]["id"])


def _written(store: Path) -> tuple[list[str], bytes]:
    return sorted(p.name for p in (store / "stackaudits").glob("*.json")), (
        store / "ledger.jsonl"
    ).read_bytes()


def test_stack_audit_of_an_image_change_and_a_refusal(images: dict[str, str], tmp_path: Path) -> None:
    store = tmp_path / "store"
    a, b, t = (_target(tmp_path, store, images, img) for img in ("cpu", "cpu-b", "cpu-t"))

    before = _written(store)
    r = run_cko(
        "audit", "--stack", "--from", a, "--to", t, "--component", "image", "--json", store=store, env=images
    )
    doc = r.json
    assert r.code == 2 and doc["error"] == "more_than_declared_component", r.stdout
    assert doc["field"] == "component" and "triton (triton None -> '0.0.1')" in doc["message"]
    assert _written(store) == before  # refused: nothing measured, nothing written

    r = run_cko(
        "audit", "--stack", "--from", a, "--to", b, "--component", "image", "--rounds", "5", "--json",
        store=store, env=images, timeout=600,
    )  # fmt: skip
    doc = r.json
    assert r.code == 0 and doc["schema"] == "stack-audit-result", r.stdout[-2000:] + r.stderr[-2000:]
    assert doc["answer"] == "measured" and doc["differs"] == ["image"] and doc["unchecked"] == []
    assert len(doc["invocations"]) == 10 and len(set(doc["invocations"])) == 10
    (case,) = doc["cases"]
    assert case["case"] == "rows256x1024" and case["unit"] == "ms" and case["calibrated"] is True
    assert case["ci_low_pct"] <= case["effect_pct"] <= case["ci_high_pct"]
    assert case["verdict"] in ("no_difference", "inconclusive"), case  # never faster/slower: same packages
    rec = json.loads((store / "stackaudits" / f"{doc['stack_audit']['id']}.json").read_text())
    rounds = [sorted(i["side"] for i in rec["invocations"] if i["round"] == r) for r in range(5)]
    assert rounds == [["from", "to"]] * 5 and rec["order"] == [i["side"] for i in rec["invocations"]]
    assert rec["from_target"]["id"] == a and rec["to_target"]["id"] == b
    sides = {i["side"]: i["image_id"] for i in rec["invocations"]}
    assert sides == {s: rec["images"][s]["id"] for s in ("from", "to")} and sides["from"] != sides["to"]
    assert all(i["identity_mismatch"] == [] for i in rec["invocations"])
    assert run_cko("verify", "--json", store=store).code == 0
