"""Overhead of one sandboxed invocation (issue 3): `cko exec -- true` against `true` in a bare
subprocess and against a bare `docker run --rm` with the same hardening, medians over N runs.
Also: CPU spent by a process waiting on a held lock (it must block in the kernel, not poll).

    .venv/bin/python benchmarks/exec_overhead.py [--runs 20]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cko_perf.runner import images  # noqa: E402
from cko_perf.runner.invocation import Plan, execute  # noqa: E402
from cko_perf.runner.locks import FileLock  # noqa: E402
from cko_perf.runner.store import Store  # noqa: E402


def timed(fn, runs: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    client = images.docker_client()
    image_id = images.resolve("cpu", client).image_id
    store = Store(tempfile.mkdtemp(prefix="cko-bench-"))
    bare = timed(lambda: subprocess.run(["true"], check=True), args.runs)
    docker_cmd = [
        "docker",
        "run",
        "--rm",
        "--network",
        "none",
        "--read-only",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--user",
        "65534:65534",
        "--tmpfs",
        "/tmp",
        "--memory",
        "4g",
        "--pids-limit",
        "1024",
        "--init",
        image_id,
        "true",
    ]
    docker = timed(lambda: subprocess.run(docker_cmd, check=True, capture_output=True), args.runs)
    api = timed(lambda: execute(store, Plan(op="exec", command=["true"], label="bench")), args.runs)
    api_nowrap = timed(
        lambda: execute(store, Plan(op="exec", command=["true"], label="bench", wrap=False)), args.runs
    )
    cli = timed(
        lambda: subprocess.run(
            [sys.executable, "-m", "cko_perf", "exec", "--store", str(store.root), "--", "true"],
            check=True,
            capture_output=True,
            cwd=ROOT,
        ),
        args.runs,
    )
    med = {
        k: statistics.median(v)
        for k, v in {
            "bare subprocess `true`": bare,
            "bare `docker run --rm` (same hardening)": docker,
            "cko invocation, no probe (API)": api_nowrap,
            "cko invocation with probe (API)": api,
            "`cko exec -- true` (CLI, new process)": cli,
        }.items()
    }
    print(f"{'what':48s} {'median s':>9s}   (n={args.runs})")
    for k, v in med.items():
        print(f"{k:48s} {v:9.3f}")
    base = med["bare `docker run --rm` (same hardening)"]
    print(
        f"cko's own overhead over docker run: API no probe {med['cko invocation, no probe (API)'] - base:+.3f} s, "
        f"API with probe {med['cko invocation with probe (API)'] - base:+.3f} s, "
        f"CLI {med['`cko exec -- true` (CLI, new process)'] - base:+.3f} s"
    )
    # An idle wait for a lock: the waiter should use (almost) no CPU.
    lock = FileLock(Path(store.root) / "bench.lock")
    code = (
        f"import sys, time; sys.path.insert(0, {str(ROOT)!r})\n"
        "from cko_perf.runner.locks import FileLock\n"
        f"with FileLock({str(lock.path)!r}).hold(timeout=5, what='x'):\n"
        "    print('held', flush=True); time.sleep(3)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    holder.stdout.readline()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    with lock.hold(timeout=10, what="bench"):
        waited = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    holder.wait()
    print(f"lock wait: waited {waited:.2f} s, CPU used while waiting {cpu * 1000:.1f} ms")
    os.system(f"rm -rf {store.root}")


if __name__ == "__main__":
    main()
