"""Time to build the cpu image offline from nothing (debootstrap root, wheelhouse, docker build)
and from a warm cache, and the image size (issue 2). Goal: < 3 min cold, < 15 s warm, < 400 MB.

The cold build runs in a scratch copy of the repository's image inputs (CKO_HOME), so the
checkout's cache and lock are left alone. It needs debootstrap and the network to Debian's
archive and the Python package index, like `make images` on a fresh machine.

    .venv/bin/python benchmarks/image_build.py [--skip-cold]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build(home: Path, lock: Path) -> tuple[float, dict]:
    import json

    env = os.environ | {"CKO_HOME": str(home), "CKO_IMAGES_LOCK": str(lock), "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-m", "cko_perf", "images", "build", "cpu", "--offline", "--json"],
        env=env,
        capture_output=True,
        text=True,
    )
    dt = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(f"build failed: {r.stderr[-2000:]}")
    return dt, json.loads(r.stdout)["built"][0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-cold", action="store_true")
    args = ap.parse_args()
    rows = []
    if not args.skip_cold:
        home = Path(tempfile.mkdtemp(prefix="cko-imgbench-"))
        shutil.copytree(
            ROOT / "operations", home / "operations", ignore=shutil.ignore_patterns("__pycache__")
        )
        (home / "images").mkdir()
        shutil.copytree(ROOT / "images" / "cpu", home / "images" / "cpu")
        shutil.copy(ROOT / "images" / "requirements-cpu.txt", home / "images")
        shutil.copy(ROOT / ".dockerignore", home)
        dt, entry = build(home, home / "images" / "images.lock")
        rows.append(("cold (debootstrap + wheelhouse + build)", dt, entry["size_bytes"]))
        dt, entry = build(home, home / "images" / "images.lock")
        rows.append(("warm (same inputs, cached base and layers)", dt, entry["size_bytes"]))
        (home / "operations" / "probe.py").write_text(
            (home / "operations" / "probe.py").read_text() + "\n# touched\n"
        )
        dt, entry = build(home, home / "images" / "images.lock")
        rows.append(("warm after an operations/ change", dt, entry["size_bytes"]))
        shutil.rmtree(home, ignore_errors=True)
    else:
        dt, entry = build(ROOT, ROOT / "images" / "images.lock")
        rows.append(("warm (the checkout's cache)", dt, entry["size_bytes"]))
    print(f"{'build':46s} {'seconds':>8s} {'size MB':>8s}")
    for name, dt, size in rows:
        print(f"{name:46s} {dt:8.1f} {size / 1e6:8.0f}")


if __name__ == "__main__":
    main()
