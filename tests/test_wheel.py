"""The built wheel, installed into a fresh venv outside the checkout, runs the whole loop.

Nothing from the checkout is on the path there: the recipes and examples come from the wheel
(setup.py installs them as cko_perf/runner/_assets), the lock is written in the working directory,
the store where the caller says. The image is the checkout's (same inputs, same id), so the build
is a check, not a rebuild. The wheel's only top-level import name is cko_perf.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _run(exe: Path, *args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CKO_HOME", "CKO_IMAGES_LOCK")}
    return subprocess.run(
        [str(exe), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
    )


@pytest.fixture(scope="module")
def installed() -> Path:
    """A fresh venv in /tmp with only the wheel (and its dependencies) installed: the `cko` command."""
    top = Path(tempfile.mkdtemp(prefix="cko-wheel-"))
    wheels = top / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheels),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("cko_perf-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    # one top-level import name: runner, operations and knowledge are common names elsewhere
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == {"cko_perf"}, names
    assert "cko_perf/runner/_assets/images/recipes/cpu.yaml" in names
    assert "cko_perf/runner/_assets/examples/numpy-softmax/readiness.json" in names
    assert "cko_perf/knowledge/cards/measurement.yaml" in names
    assert "cko_perf/operations/evidence/native/trace_scan.c" in names
    assert not [n for n in names if n.endswith(".pyc") or "/build/" in n], names
    subprocess.run([sys.executable, "-m", "venv", str(top / "venv")], check=True, timeout=120)
    pip = subprocess.run(
        [str(top / "venv" / "bin" / "pip"), "install", "-q", str(wheel)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if pip.returncode != 0:
        pytest.skip(f"the wheel's dependencies cannot be installed here: {pip.stderr[-600:]}")
    return top


def test_the_wheel_runs_doctor_build_and_demo_outside_the_checkout(installed: Path) -> None:
    cko = installed / "venv" / "bin" / "cko"
    work = installed / "work"
    work.mkdir()
    doctor = _run(cko, "doctor", "--json", cwd=work, timeout=120)
    assert doctor.returncode in (0, 1), doctor.stderr[-2000:]
    assert json.loads(doctor.stdout)["engine"]["reachable"] is True

    # how cko starts itself (detached commands, the MCP server's calls)
    version = _run(installed / "venv" / "bin" / "python", "-m", "cko_perf", "--version", cwd=work, timeout=60)
    assert version.returncode == 0 and "0.1.0" in version.stdout, version.stderr[-2000:]

    build = _run(cko, "images", "build", "cpu", "--json", cwd=work, timeout=900)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    lock = json.loads(
        (work / "cko-images.lock").read_text()
    )  # the project's lock: where it ran, not site-packages
    ours = json.loads((ROOT / "cko-images.lock").read_text())
    assert lock["images"]["cpu"]["image_id"] == ours["images"]["cpu"]["image_id"]  # same inputs, same image

    demo = _run(cko, "demo", "--store", str(work / "store"), "--json", cwd=work, timeout=1500)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-2000:]
    doc = json.loads(demo.stdout)
    assert doc["steps"]["audit"]["answer"] == "holds", doc["steps"]["audit"]
    assert (work / "store" / "targets").is_dir() and not (ROOT / "cko-demo").exists()
