"""Fuzz the compiled trace scanner under AddressSanitizer and UndefinedBehaviorSanitizer.

    .venv/bin/python tests/fuzz_trace_scanner.py [--mutants 20000] [--seed 1]

Builds operations/evidence/native/trace_scan.c with -fsanitize=address,undefined into a temporary
directory, re-runs itself with the sanitizer runtimes preloaded, and parses random mutations of
the real H200 trace fixture (tests/test_trace_native.py's `_mutate`) twice: with that build of the
scanner, and on the reference path alone. Any memory error or undefined behaviour aborts with the
sanitizer's report; any difference in facts or refusal fails with the mutant's number. Ends with
the 1M-event trace of benchmarks/parse_speed.py. Not collected by pytest (too slow for
`make test`, which runs 1000 mutants against the normal build); run it after changing the C.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]


def build(dest: Path) -> Path:
    from cko_perf.operations.evidence import trace_native

    digest = hashlib.sha256(trace_native.SOURCE.read_bytes()).hexdigest()
    lib = dest / "trace_scan_asan.so"
    subprocess.run(
        [
            "cc",
            "-O1",
            "-g",
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=undefined",
            "-fno-omit-frame-pointer",
            "-std=c11",
            "-fPIC",
            "-shared",
            f'-DCKO_SOURCE_SHA256="{digest}"',
            "-o",
            str(lib),
            str(trace_native.SOURCE),
            "-lm",
        ],
        check=True,
    )
    return lib


def fuzz(lib: Path, mutants: int, seed: int) -> int:
    import parse_speed
    import test_trace_native as t

    from cko_perf.operations.evidence import torch_trace, trace_native
    from cko_perf.operations.evidence.common import Refusal

    trace_native.LIB = trace_native.load(lib, trace_native.SOURCE)
    assert trace_native.LIB is not None, "the sanitized build did not load"
    rng = random.Random(seed)
    work = Path(tempfile.mkdtemp())
    p = work / "m.json"

    def outcome() -> object:
        try:
            return torch_trace.parse_torch_trace(p).model_dump_json()
        except Refusal as r:
            return (r.code, r.field, r.message)

    saved = torch_trace.msgspec
    taken = 0
    for k in range(mutants):
        data = t._mutate(rng, t.RAW)
        p.write_bytes(data)
        taken += torch_trace.scan_native(data, torch_trace.DEFAULT_MAX_EVENTS) is not None
        got = outcome()
        torch_trace.msgspec = None
        want = outcome()
        torch_trace.msgspec = saved
        if got != want:
            print(f"mutant {k} (seed {seed}): the scanner's outcome differs from the reference path's")
            return 1
    big = work / "big.json"
    parse_speed.big_trace(big, 1_000_000)
    assert torch_trace.scan_native(big.read_bytes(), torch_trace.DEFAULT_MAX_EVENTS) is not None
    print(
        f"{mutants} mutants (seed {seed}): {taken} taken by the scanner, all equal to the reference "
        "path; the 1M-event trace scanned; no sanitizer report"
    )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutants", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--library", help=argparse.SUPPRESS)  # set on the re-run under the sanitizers
    a = ap.parse_args()
    if a.library:
        return fuzz(Path(a.library), a.mutants, a.seed)
    with tempfile.TemporaryDirectory() as tmp:
        lib = build(Path(tmp))
        runtimes = [
            subprocess.run(
                ["cc", f"-print-file-name={n}"], capture_output=True, text=True, check=True
            ).stdout.strip()
            for n in ("libasan.so", "libubsan.so")
        ]
        env = dict(os.environ, LD_PRELOAD=":".join(runtimes), ASAN_OPTIONS="detect_leaks=0")
        # leaks: CPython's own allocations at exit drown the report; the scanner frees on every path
        return subprocess.run(
            [
                sys.executable,
                __file__,
                "--mutants",
                str(a.mutants),
                "--seed",
                str(a.seed),
                "--library",
                str(lib),
            ],
            env=env,
        ).returncode


if __name__ == "__main__":
    sys.exit(main())
