"""Portable pinned environments (issue 21): the same inputs give the same image id in two engines;
an image moves by digest (store archive, local registry); an audit runs in the Target's exact image.

Costs on the 2-core CI machine: the second engine's build ~1-1.5 min (a fresh debootstrap from cached
.debs, a venv install, a load); the audit test a cheap private image, one `cko demo` and three audits.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, run_cko

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _dockerd(base: Path, name: str) -> tuple[subprocess.Popen[bytes], str]:
    """A second engine beside the shared one: its own data-root, exec-root, socket and pidfile."""
    d = base / name
    for sub in ("data", "exec"):
        (d / sub).mkdir(parents=True)
    sock = f"unix://{d}/docker.sock"
    log = open(d / "dockerd.log", "wb")
    proc = subprocess.Popen(
        [
            "dockerd",
            "--data-root",
            str(d / "data"),
            "--exec-root",
            str(d / "exec"),
            "-H",
            sock,
            "--pidfile",
            str(d / "docker.pid"),
            "--bridge=none",
            "--iptables=false",
            "--ip6tables=false",
        ],
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    for _ in range(150):
        if subprocess.run(["docker", "-H", sock, "info"], capture_output=True).returncode == 0:
            return proc, sock
        time.sleep(0.2)
    proc.terminate()
    pytest.fail(f"dockerd {name} did not answer: {(d / 'dockerd.log').read_text()[-1500:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def engine() -> Iterator[tuple[Path, str]]:
    if shutil.which("dockerd") is None or os.geteuid() != 0:
        pytest.skip("needs root and dockerd to start a second engine")
    base = Path(tempfile.mkdtemp(prefix="cko-engines-", dir="/var/tmp"))
    proc = None
    try:
        proc, sock = _dockerd(base, "b")
        yield base, sock
    finally:
        if proc is not None:
            _stop(proc)
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_a_second_engine_builds_the_tracked_cpu_image_id(engine: tuple[Path, str]) -> None:
    """A fresh engine and a fresh cache (a new debootstrap root from the same .debs): the id and the
    lock entry are the tracked lock's, which `make images` built in the shared engine (on CI, from
    nothing, on another machine than the one that committed it): one id in every engine."""
    base, sock = engine
    debs = Path(os.environ.get("CKO_DEB_CACHE") or Path.home() / ".cache" / "cko" / "debs")
    debs.mkdir(parents=True, exist_ok=True)
    lock = base / "lock.json"
    env = {
        "DOCKER_HOST": sock,
        "CKO_CACHE": str(base / "cache"),
        "CKO_DEB_CACHE": str(debs),
        "CKO_IMAGES_LOCK": str(lock),
    }
    t0 = time.monotonic()
    r = run_cko("images", "build", "cpu", "--json", env=env, timeout=1200)
    assert r.code == 0, r.stderr[-3000:]
    built = r.json["built"][0]
    tracked = json.loads((ROOT / "cko-images.lock").read_text())["images"]["cpu"]
    print(f"second engine, fresh cache: {built['image_id']} in {time.monotonic() - t0:.0f} s")
    assert built["reproducible"] is True and built["image_id"] == tracked["image_id"], (built, tracked)
    # the lock holds no time: the same inputs write the same entry
    assert json.loads(lock.read_text())["images"]["cpu"] == tracked


def test_rebuild_leaves_the_tracked_lock_untouched() -> None:
    lock = ROOT / "cko-images.lock"
    before = lock.read_bytes()
    r = run_cko("images", "build", "cpu", "--json", timeout=900)
    assert r.code == 0, r.stderr[-2000:]
    assert r.json["built"][0]["lock_changed"] is False, (
        "the tracked lock's cpu image is not what this checkout builds"
    )
    assert lock.read_bytes() == before
    git = subprocess.run(
        ["git", "status", "--porcelain", "--", "cko-images.lock", "images"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert git.stdout == ""


# -- moving by digest and auditing anywhere ---------------------------------------------------------


def _registry(tmp: Path) -> Iterator[str]:
    exe = shutil.which("docker-registry") or "/usr/bin/docker-registry"
    if not Path(exe).exists():
        r = subprocess.run(
            ["apt-get", "install", "-y", "-qq", "docker-registry"],
            capture_output=True,
            text=True,
            env=os.environ | {"DEBIAN_FRONTEND": "noninteractive"},
        )
        if r.returncode != 0 or not Path(exe).exists():
            pytest.skip(f"Debian's docker-registry could not be installed: {r.stderr.strip()[-300:]}")
    port = 5000 + os.getpid() % 1000
    cfg = tmp / "registry.yml"
    cfg.write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp / 'registry'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    proc = subprocess.Popen(
        [exe, "serve", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    import requests

    for _ in range(100):
        try:
            if requests.get(f"http://127.0.0.1:{port}/v2/", timeout=1).status_code == 200:
                break
        except requests.RequestException:
            time.sleep(0.1)
    try:
        yield f"localhost:{port}"
    finally:
        _stop(proc)  # type: ignore[arg-type]


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    yield from _registry(tmp_path)


def _rmi(image_id: str, *, must: bool = True) -> None:
    """Remove the image from the engine and make sure it is gone (an untag alone would leave it by id)."""
    for _ in range(20):
        r = subprocess.run(["docker", "rmi", "-f", image_id], capture_output=True, text=True, check=False)
        inspect = subprocess.run(["docker", "image", "inspect", image_id], capture_output=True, text=True)
        # gone only when the engine says so: under load an inspect can fail for other reasons (a timeout)
        if inspect.returncode != 0 and "no such image" in inspect.stderr.lower():
            return
        time.sleep(1)
    users = subprocess.run(
        [
            "docker",
            "ps",
            "-a",
            "--filter",
            f"ancestor={image_id}",
            "--format",
            "{{.ID}} {{.Status}} {{.Labels}}",
        ],
        capture_output=True,
        text=True,
    ).stdout
    if must:
        pytest.fail(
            f"image {image_id} stays in the engine: {r.stderr.strip()}; containers using it: {users!r}"
        )


def test_audit_brings_the_targets_image_back(tmp_path: Path, registry: str) -> None:
    """A private image (the cpu image under a name no other test uses: a recipe on base cpu, built in
    seconds), a demo store in it, then the image removed from the engine three times: back from the
    store's archive, back from the registry, and neither: could_not_check naming the image."""
    cache = tmp_path / "cache"
    shared = Path.home() / ".cache" / "cko"
    for sub in ("rootfs", "wheels", "debs"):  # inputs only: the layers, archives and image are new
        if (shared / sub).is_dir():
            (cache / sub).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(shared / sub, cache / sub)
    lock = tmp_path / "cko-images.lock"
    shutil.copy(ROOT / "cko-images.lock", lock)
    (tmp_path / "cko-images").mkdir()
    (tmp_path / "cko-images" / "cpu-a.yaml").write_text(
        "description: the cpu image, this test's own\nbase: cpu\n"
    )
    env = {"CKO_CACHE": str(cache), "CKO_IMAGES_LOCK": str(lock)}
    r = run_cko("images", "build", "cpu-a", "--json", env=env, timeout=900)
    assert r.code == 0, r.stdout[-2000:] + r.stderr[-2000:]
    image_id = r.json["built"][0]["image_id"]
    # short: the store's scratch holds unix sockets (108-byte paths), which tmp_path would overrun
    store = Path(tempfile.mkdtemp(prefix="cko-a-", dir="/tmp")) / "s"
    try:
        d = run_cko("demo", "--image", "cpu-a", "--json", store=store, env=env, timeout=1500)
        assert d.code == 0, d.stdout[-3000:] + d.stderr[-2000:]
        s = run_cko("images", "save", "cpu-a", "--json", store=store, env=env)
        assert s.code == 0 and Path(s.json["path"]) == store / "images" / f"{image_id[7:]}.tar", s.stdout
        p = run_cko(
            "images", "push", "cpu-a", "--registry", registry, "--json", store=store, env=env, timeout=600
        )
        assert p.code == 0, p.stdout + p.stderr[-2000:]
        shutil.rmtree(cache / "images", ignore_errors=True)  # only the store and the registry hold it now

        _rmi(image_id)
        a = run_cko("audit", "--json", store=store, env=env, timeout=1500)
        _ran_in_the_targets_image(a)
        assert "loaded from" in a.stderr and str(store / "images") in a.stderr.replace("\n", ""), a.stderr[
            -3000:
        ]

        _rmi(image_id)
        (store / "images" / f"{image_id[7:]}.tar").unlink()
        shutil.rmtree(cache / "images", ignore_errors=True)
        a = run_cko(
            "audit",
            "--json",
            store=store,
            env=env | {"CKO_IMAGES_LOCK": str(tmp_path / "none.json"), "CKO_REGISTRY": registry},
            timeout=1500,
        )
        _ran_in_the_targets_image(a)
        assert f"pulled {registry}/cko/cpu-a:sha256-{image_id[7:]}" in a.stderr.replace(
            "\n", ""
        )  # rich wraps lines

        _rmi(image_id)
        shutil.rmtree(cache / "images", ignore_errors=True)
        junit = tmp_path / "audit.xml"
        a = run_cko(
            "audit",
            "--junit",
            str(junit),
            "--json",
            store=store,
            env=env | {"CKO_IMAGES_LOCK": str(tmp_path / "none.json")},
            timeout=600,
        )
        assert a.code == 5 and a.json["answer"] == "could_not_check", a.stdout[-3000:]
        missing = [c for c in a.json["checks"] if c["answer"] == "could_not_check"]
        assert {c["code"] for c in missing} == {"image_missing"} and image_id in missing[0]["detail"]
        assert "<error" in junit.read_text()
    finally:
        _rmi(image_id, must=False)
        shutil.rmtree(store.parent, ignore_errors=True)


def _ran_in_the_targets_image(a: Any) -> None:
    """The audit re-ran in the Target's exact image. Whether the champion's gain shows again is the
    measurement's business: on a shared 2-core host others' load may leave it inconclusive, so only
    an environment or image reason fails this check."""
    doc = a.json
    assert a.code in (0, 1) and doc["answer"] in ("holds", "does_not_hold"), a.stdout[-3000:]
    for t in doc["targets"].values():
        codes = set(t["audit_experiment"]["reason_codes"])
        assert not codes & {"environment_mismatch", "image_missing"}, codes
        assert not t["audit_experiment"].get("identity_mismatch"), t["audit_experiment"].get(
            "identity_mismatch"
        )


def test_host_id_and_gpu_uuid_never_void_a_comparison() -> None:
    from cko_perf.runner.identity import MATTERS

    assert not any(k.startswith(("host.host_id", "devices.uuid", "devices.pci_bus_id")) for k in MATTERS)


def test_images_list_names_the_recipes() -> None:
    r = run_cko("images", "list", "--json")
    assert r.code == 0 and {"cpu", "cuda", "torch-cpu"} <= set(r.json["recipes"])
    assert json.loads((ROOT / "cko-images.lock").read_text())["images"]["cpu"]["reproducible"] is True
