"""Parse speed of the profiler parsers on one core, on large inputs made from the real fixtures.

    .venv/bin/python benchmarks/parse_speed.py [--ncu-mb 100] [--trace-events 1000000] [--repeat 3]

* ncu details page: the H200 fixture's launches repeated under new IDs to --ncu-mb; rows/s.
* ncu raw page (full set, ~2,200 metrics a row): the same; rows/s and values/s.
* PyTorch trace: the H200 fixture's events repeated (shifted in time, new correlation ids) to
  --trace-events; events/s for the whole parse (read, hash, scan, facts) as it runs by default,
  with the compiled scanner (operations/evidence/native), and that scan alone; then the whole
  parse on the Python fast path (as where the scanner is not built), with its decode (msgspec
  into structs) and event loop apart; then the same three for the reference path
  (pydantic-core's whole-document decode and the checking loop), which parses what the faster
  paths decline and everything where msgspec is not installed.

Goals: >= 100k ncu rows/s (details page) and >= 1M trace events/s. The process is pinned to
one CPU where the OS allows it; each figure is the best of --repeat runs (the machine may be
shared). Prints a table; exits 0 (figures, not a gate).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cko_perf.operations.evidence import torch_trace, trace_native  # noqa: E402
from cko_perf.operations.evidence.common import no_gc  # noqa: E402
from cko_perf.operations.evidence.ncu import parse_ncu_csv  # noqa: E402

FIX = ROOT / "tests" / "fixtures"
VERSION = (FIX / "ncu" / "ncu_version.txt").read_text()


def big_ncu(src: Path, dest: Path, megabytes: float, units_row: bool) -> int:
    lines = src.read_text().splitlines(keepends=True)
    h = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    start = h + (2 if units_row else 1)
    head, body = lines[:start], lines[start:]
    ids = len({line.split('","', 1)[0] for line in body})
    rows = copies = 0
    size = sum(len(x) for x in head)
    with open(dest, "w") as out:
        out.writelines(head)
        while size < megabytes * 1e6:
            for line in body:
                rid, rest = line.split('","', 1)
                new = f'"{int(rid[1:]) + copies * ids}","{rest}'
                out.write(new)
                size += len(new)
                rows += 1
            copies += 1
    return rows


def big_trace(dest: Path, events: int) -> int:
    doc = json.loads((FIX / "torch" / "torch_trace.json").read_text())
    base = doc["traceEvents"]
    span = max(e.get("ts", 0) + e.get("dur", 0) for e in base) - min(e["ts"] for e in base if "ts" in e)
    out: list[dict] = []
    k = 0
    while len(out) < events:
        for e in base:
            e2 = dict(e)
            if "ts" in e2:
                e2["ts"] = e2["ts"] + k * (span + 10)
            if isinstance(e2.get("args"), dict):
                a = dict(e2["args"])
                for key in ("correlation", "External id"):
                    if isinstance(a.get(key), int):
                        a[key] += k * 100000
                e2["args"] = a
            out.append(e2)
        k += 1
    doc["traceEvents"] = out
    dest.write_text(json.dumps(doc))
    return len(out)


def timed(fn: Callable[[], Any], repeat: int = 1) -> tuple[Any, float]:
    """(last result, best wall time of `repeat` runs)."""
    best = float("inf")
    result = None
    for _ in range(repeat):
        result = None  # the previous result is freed before the next run, not during it
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return result, best


@contextlib.contextmanager
def python_fast_path() -> Iterator[None]:
    """The parser as where the compiled scanner is not built."""
    saved = trace_native.LIB
    trace_native.LIB = None
    try:
        yield
    finally:
        trace_native.LIB = saved


@contextlib.contextmanager
def reference_path() -> Iterator[None]:
    """The parser as in an environment without msgspec: the reference path alone."""
    saved = torch_trace.msgspec
    torch_trace.msgspec = None  # type: ignore[assignment]
    try:
        yield
    finally:
        torch_trace.msgspec = saved


def trace_parts(data: bytes, decode: Callable[[bytes], Any], loop: Callable[[Any], Any], repeat: int):
    """Best decode and loop times, each run as the parser runs it (no cyclic GC)."""
    s_dec = s_loop = float("inf")
    for _ in range(repeat):
        with no_gc():
            t0 = time.perf_counter()
            doc = decode(data)
            t1 = time.perf_counter()
            assert doc is not None, "the fast path handed this trace to the reference path"
            out = loop(doc)
            t2 = time.perf_counter()
            assert out is not None, "the fast path handed this trace to the reference path"
            del doc, out
        s_dec, s_loop = min(s_dec, t1 - t0), min(s_loop, t2 - t1)
    return s_dec, s_loop


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ncu-mb", type=float, default=100.0)
    ap.add_argument("--trace-events", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
        except OSError:
            pass
    rows_out: list[tuple[str, str, str, str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "details.csv"
        n = big_ncu(FIX / "ncu" / "kernels_details_full.csv", d, a.ncu_mb, units_row=False)
        f, s = timed(lambda: parse_ncu_csv(d, version_text=VERSION), a.repeat)
        rows_out.append(
            (
                "ncu details page",
                f"{d.stat().st_size / 1e6:.0f} MB, {n} rows, {len(f.launches)} launches",
                f"{s:.2f} s",
                f"{n / s:,.0f} rows/s",
                ">= 100,000 rows/s",
            )
        )
        d.unlink()
        r = Path(tmp) / "raw.csv"
        n = big_ncu(FIX / "ncu" / "kernels_raw_full.csv", r, a.ncu_mb, units_row=True)
        f, s = timed(lambda: parse_ncu_csv(r, version_text=VERSION), a.repeat)
        cols = len(f.units)
        rows_out.append(
            (
                "ncu raw page (full set)",
                f"{r.stat().st_size / 1e6:.0f} MB, {n} rows x {cols} metrics",
                f"{s:.2f} s",
                f"{n / s:,.0f} rows/s ({n * cols / s / 1e6:.1f} M values/s)",
                "-",
            )
        )
        r.unlink()
        t = Path(tmp) / "trace.json"
        n = big_trace(t, a.trace_events)
        data = t.read_bytes()
        what = f"{len(data) / 1e6:.0f} MB, {n} events"
        goal = ">= 1,000,000 events/s"
        if trace_native.available():
            _f, s = timed(lambda: torch_trace.parse_torch_trace(t), a.repeat)
            del _f
            rows_out.append(
                ("torch trace (compiled scanner)", what, f"{s:.2f} s", f"{n / s:,.0f} events/s", goal)
            )
            what = goal = ""
            _f, s = timed(lambda: torch_trace.scan_native(data, torch_trace.DEFAULT_MAX_EVENTS), a.repeat)
            assert _f is not None, "the compiled scanner declined this trace"
            del _f
            rows_out.append(("  scan only", "", f"{s:.2f} s", f"{n / s:,.0f} events/s", ""))
        else:
            rows_out.append(("torch trace (compiled scanner)", "not built (make native)", "-", "-", goal))
        fast = (torch_trace.decode_fast, torch_trace.scan_decoded)
        reference = (torch_trace.decode_trace, torch_trace.scan_events)
        for label, mode, (decode, loop) in (
            ("torch trace, Python fast path", python_fast_path, fast),
            ("torch trace, reference path", reference_path, reference),
        ):
            with mode():
                _f, s = timed(lambda: torch_trace.parse_torch_trace(t), a.repeat)
            del _f
            s_dec, s_loop = trace_parts(data, decode, loop, a.repeat)
            rows_out.append((label, what, f"{s:.2f} s", f"{n / s:,.0f} events/s", goal if what else "-"))
            what = goal = ""
            rows_out.append(("  decode only", "", f"{s_dec:.2f} s", f"{n / s_dec:,.0f} events/s", ""))
            rows_out.append(("  event loop only", "", f"{s_loop:.2f} s", f"{n / s_loop:,.0f} events/s", ""))
    widths = [max(len(str(r[i])) for r in rows_out) for i in range(5)]
    dec = f"msgspec {torch_trace.msgspec.__version__}" if torch_trace.msgspec else "no msgspec"
    scanner = "built" if trace_native.available() else "not built"
    print(f"parse speed, one core ({os.cpu_count()} CPUs on the machine; trace scanner {scanner}; {dec})")
    for row in rows_out:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
