"""Images, lock and doctor against the real engine (issue 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cko_perf.runner import __version__
from tests.conftest import GPU, run_cko


def test_version_and_help() -> None:
    r = run_cko("--version")
    assert r.code == 0 and __version__ in r.stdout
    r = run_cko("--help")
    assert r.code == 0
    for cmd in (
        "doctor",
        "exec",
        "readiness",
        "baseline",
        "variant",
        "experiment",
        "champion",
        "audit",
        "verify",
        "schema",
        "demo",
        "stats",
        "profile",
        "sass",
        "knowledge",
        "images",
        "status",
        "cancel",
    ):
        assert cmd in r.stdout, cmd


@pytest.mark.docker
def test_images_list_shows_the_locked_cpu_image() -> None:
    r = run_cko("images", "list", "--json")
    assert r.code == 0
    cpu = next(i for i in r.json["images"] if i["name"] == "cpu")
    assert cpu["present"] is True and cpu["image_id"].startswith("sha256:")
    assert cpu["stale"] is False
    lock = json.loads(Path(r.json["lock"]).read_text())
    entry = lock["images"]["cpu"]
    assert entry["image_id"] == cpu["image_id"]
    assert entry["build_inputs"]["wheels"] and entry["reproducible"] is True
    assert len(entry["build_inputs"]["layers"]) == 3  # debootstrap root, cko's venv, the supervisor


@pytest.mark.docker
def test_corrupt_lock_is_a_one_line_error_exit_5(tmp_path: Path, store: Path) -> None:
    bad = tmp_path / "images.lock"
    bad.write_text("{not json")
    r = run_cko("exec", "--json", "--", "true", store=store, env={"CKO_IMAGES_LOCK": str(bad)})
    assert r.code == 5
    assert r.json["field"] == "images.lock" and r.json["error"] == "corrupt_images_lock"
    assert bad.read_text() == "{not json"  # nothing rewritten
    r = run_cko(
        "exec", "--json", "--", "true", store=store, env={"CKO_IMAGES_LOCK": str(tmp_path / "none.lock")}
    )
    assert r.code == 5 and r.json["error"] == "image_missing"


def test_unknown_image_name_is_a_usage_error(store: Path) -> None:
    r = run_cko("exec", "--image", "gpu-latest", "--", "true", store=store)
    assert r.code == 2 and "gpu-latest" in r.stderr


@pytest.mark.docker
def test_doctor_reports_engine_images_modes_and_gpu() -> None:
    r = run_cko("doctor", "--json")
    assert r.code == 0
    d = r.json
    assert d["engine"]["reachable"] is True and d["engine"]["version"]
    modes = {m["mode"]: m for m in d["passthrough"]}
    assert set(modes) == {"nvidia", "cdi", "devices", "none"} and modes["none"]["usable"] is True
    for m in modes.values():
        assert m["usable"] or (m["reason"] and m["next_step"])
    if not GPU:
        assert d["gpu"]["available"] is False and "no GPU" in d["gpu"]["note"]
    else:
        assert d["gpu"]["devices"][0]["uuid"].startswith("GPU-")


def test_a_carried_wheelhouse_never_lands_in_the_downloaded_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CKO_WHEELHOUSE once copied its wheels into the cache entry pip made for the same requirements,
    so a later plain build of the cpu image took an extra wheel into its inputs and its lock entry."""
    from cko_perf.runner import imagebuild

    monkeypatch.setenv("CKO_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CKO_WHEELHOUSE", raising=False)
    reqs = ["numpy==2.2.6"]
    # the entry a download made earlier (marked complete, so no index is asked)
    plain_key = imagebuild.sha256_bytes(f"3.11\0{False}\0numpy==2.2.6\n".encode())[:24]
    plain = tmp_path / "cache" / "wheels" / plain_key
    plain.mkdir(parents=True)
    (plain / "numpy-2.2.6-cp311-none-any.whl").write_bytes(b"downloaded")
    (plain / ".complete").write_text("")
    carried = tmp_path / "carried"
    carried.mkdir()
    (carried / "triton-0.0.1-py3-none-any.whl").write_bytes(b"carried")
    monkeypatch.setenv("CKO_WHEELHOUSE", str(carried))
    d1, w1 = imagebuild.ensure_wheels(reqs, "3.11", False, lambda _m: None)
    monkeypatch.delenv("CKO_WHEELHOUSE")
    d2, w2 = imagebuild.ensure_wheels(reqs, "3.11", False, lambda _m: None)
    assert d1 != d2 == plain and "triton-0.0.1-py3-none-any.whl" in w1
    assert list(w2) == ["numpy-2.2.6-cp311-none-any.whl"]
