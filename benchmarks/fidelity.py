"""Is a gain cko reads the kernel's? cko's worker clock against ncu and do_bench (needs a CUDA GPU).

    python3 benchmarks/fidelity.py [--blocks 30] [--out fidelity.json] [--no-ncu]

For pairs of subjects (an original and a faster candidate, or an identical control) from ~3 us to
~1 ms per call, this times each call three ways, in one process and one call of the device:

* cko: `operations.timing.TorchCuda.time_block`, the worker's own clock, in `cold` mode (L2
  flushed outside the window, one run per block) and `hot` mode (back-to-back runs, the block sized
  to at least ~1 ms, per-run time = block / runs), each run on inputs of its own and the collector
  off inside each block as the worker does; the median of --blocks blocks;
* cko in `graph` mode: the block's runs captured once as a CUDA graph (outside the window, as the
  worker does per block) and one replay timed: the CPU's launch cost drops out of the window;
* do_bench: `triton.testing.do_bench(..., return_mode="median")`;
* ncu: the same calls in a child process under `ncu --clock-control none --metrics
  gpu__time_duration.sum`, a marker kernel launched before every call: the kernels between two
  markers are one call's, their durations summed (median of 5 calls).

It prints, per pair and mode, each tool's gain g = t_original / t_candidate - 1 and the ratio
ln(1 + g_cko) / ln(1 + g_ncu) (1.0: cko reads exactly the kernels' gain). The issue's goals: the
same sign as ncu everywhere; the ratio within [0.9, 1.1] for calls of 20 us and more, within
[0.75, 1.25] for 5-20 us. Exits 0 (figures, not a gate); 2 where there is no GPU.
"""

from __future__ import annotations

import argparse
import csv
import functools
import gc
import io
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from cko_perf.operations.evidence.ncu import UNITS_2025  # noqa: E402

HOT_BLOCK_S = 1e-3  # a hot block lasts at least this long (per-run time = block / runs)
NCU_CALLS = 5


Pair = tuple[Callable[[], Any], Callable[[Any], Any], Callable[[Any], Any]]


def _pairs() -> dict[str, Pair]:
    """name -> (make a set of inputs on the GPU, original(inputs), candidate(inputs))."""
    import torch
    import torch.nn.functional as F

    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape: int, dtype: Any = torch.float32) -> Any:
        return torch.randn(*shape, device=dev, generator=g, dtype=dtype)

    wl, bl = rnd(4096), rnd(4096)

    def manual_softmax(x: Any) -> Any:
        e = (x - x.max(dim=1, keepdim=True).values).exp()
        return e / e.sum(dim=1, keepdim=True)

    def manual_layernorm(x: Any) -> Any:
        mu = x.mean(dim=-1, keepdim=True)
        var = ((x - mu) ** 2).mean(dim=-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + 1e-5) * wl + bl

    compiled = torch.compile(manual_layernorm)
    tri = _triton_softmax()
    half = torch.float16
    return {
        "vadd 256k (2 kernels vs 1)": (
            lambda: (rnd(1 << 18), rnd(1 << 18)),
            lambda i: i[0] * 2.0 + i[1],
            lambda i: torch.add(i[1], i[0], alpha=2.0),
        ),
        "softmax 16x16384 (5 vs 1)": (
            lambda: rnd(16, 16384),
            manual_softmax,
            lambda x: torch.softmax(x, dim=1),
        ),
        "triton softmax 16x16384": (lambda: rnd(16, 16384), manual_softmax, tri),
        "gemm+epilogue 256x512x512 fp16": (
            lambda: (rnd(256, 512, dtype=half), rnd(512, 512, dtype=half), rnd(512, dtype=half)),
            lambda i: torch.relu(i[0] @ i[1] + i[2]),
            lambda i: F.relu(torch.addmm(i[2], i[0], i[1]), inplace=True),
        ),
        "torch.compile layernorm 4096^2": (lambda: rnd(4096, 4096), manual_layernorm, compiled),
        "reduction 64M (control: same)": (lambda: rnd(1 << 26), lambda x: x.sum(), lambda x: x.sum()),
    }


def _triton_softmax() -> Callable[[Any], Any]:
    import torch
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[misc]
    def kernel(x_ptr, y_ptr, n, block: tl.constexpr):  # type: ignore[no-untyped-def]  # triton reads no typing globals
        row = tl.program_id(0)
        cols = tl.arange(0, block)
        x = tl.load(x_ptr + row * n + cols, mask=cols < n, other=-float("inf"))
        e = tl.exp(x - tl.max(x, axis=0))
        tl.store(y_ptr + row * n + cols, e / tl.sum(e, axis=0), mask=cols < n)

    def run(x: Any) -> Any:
        y = torch.empty_like(x)
        kernel[(x.shape[0],)](x, y, x.shape[1], block=triton.next_power_of_2(x.shape[1]), num_warps=16)
        return y

    return run


def _block(clock: Any, make: Callable[[], Any], fn: Callable[[Any], Any], runs: int, mode: str) -> list[Any]:
    """What one block's window runs: `runs` runs, each on inputs of its own (as the worker stages
    them); graph mode captures them once, as the worker does per block, and the window replays it."""
    fns = [functools.partial(fn, make()) for _ in range(runs)]
    if mode != "graph":
        return fns
    replay, _ = clock.capture(fns)
    return [replay]


def cko_time(make: Callable[[], Any], fn: Callable[[Any], Any], mode: str, blocks: int) -> float:
    """Median per-run ms over `blocks` blocks of the worker's clock, as the worker times them."""
    from cko_perf.operations.timing import TorchCuda

    clock = TorchCuda()
    warm = make()
    for _ in range(3):
        fn(warm)
    clock.sync()
    runs = 1
    if mode in ("hot", "graph"):  # double the block until it lasts HOT_BLOCK_S: a one-run block carries
        # the window's fixed ~100-150 us (synchronise, events), so sizing from it leaves blocks too short
        while runs < 1 << 16:
            _, t_ns, _ = clock.time_block(_block(clock, make, fn, runs, mode), mode)
            if t_ns * 1e-9 >= HOT_BLOCK_S:
                break
            runs *= 2
    out = []
    for _ in range(blocks):
        gc.collect()
        body = _block(clock, make, fn, runs, mode)  # graph: captured outside the window, as in the worker
        if mode == "cold":
            clock.flush_l2()
        clock.sync()
        gc.disable()
        try:
            _, t_ns, _ = clock.time_block(body, mode)
        finally:
            gc.enable()
        del body
        out.append(t_ns / runs / 1e6)
    return statistics.median(out)


def bench_time(fn: Callable[[], Any]) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


MARKER = "fid_marker"
# ncu 2025 prints ns/us/ms, older releases nsecond/usecond/msecond; `--print-units base` asks for ns,
# and a unit outside these fails loudly (an unknown unit read as ns would shrink a call 1000x)
NS_PER = {**UNITS_2025.time, "nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9}


def _marker() -> Callable[[], Any]:
    """A one-thread kernel with a name no subject launches: it cuts the profiled stream into calls."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[misc]
    def fid_marker(p):  # type: ignore[no-untyped-def]
        tl.store(p, 1)

    buf = torch.zeros(1, device="cuda", dtype=torch.int32)
    return lambda: fid_marker[(1,)](buf)


def ncu_child(order_path: Path) -> None:
    """Under ncu: a marker kernel before every call and one after the last, so the kernels between
    two markers are exactly one call's, however many it launches and from whatever library (a name
    or an NVTX range is not: the range attribution counted one kernel per call). The calls' order
    and this process's id go to `order_path`. Slot i = -1 is each subject's warm-up (not counted)."""
    import torch

    mark = _marker()
    order: list[list[Any]] = []
    for name, (make, orig, cand) in _pairs().items():
        inputs = make()
        for which, fn in (("original", orig), ("candidate", cand)):
            for i in range(-1, NCU_CALLS):
                mark()
                fn(inputs)
                torch.cuda.synchronize()
                order.append([name, which, i])
    mark()
    torch.cuda.synchronize()
    order_path.write_text(json.dumps({"pid": os.getpid(), "order": order}))


def ncu_times(timeout_s: float, cache: str) -> dict[tuple[str, str], float]:
    """(pair, which) -> median over calls of the summed kernel durations, ms. cache "all": ncu's
    default, caches flushed before every kernel (what a cold call sees); "none": left as the last
    kernel left them (what back-to-back runs see: hot and graph blocks, do_bench)."""
    with tempfile.TemporaryDirectory() as d:
        order_path = Path(d) / "order.json"
        cmd = [
            "ncu", "--clock-control", "none", "--cache-control", cache,
            "--metrics", "gpu__time_duration.sum", "--csv", "--print-units", "base",
            "--target-processes", "all",
            sys.executable, str(Path(__file__).resolve()), "--ncu-child", str(order_path),
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        if not order_path.exists():
            print(f"ncu child did not finish (exit {proc.returncode}): {proc.stderr[-800:]}", file=sys.stderr)
            return {}
        child = json.loads(order_path.read_text())
    per_call = _split_at_markers(_kernel_rows(proc.stdout, child["pid"]), child["order"])
    out: dict[tuple[str, str], list[float]] = {}
    for (name, which, _i), v in per_call.items():
        out.setdefault((name, which), []).append(v)
    return {k: statistics.median(v) for k, v in out.items()}


def _kernel_rows(stdout: str, pid: int) -> list[tuple[str, float]]:
    """(kernel name, ms) of the child's kernels, in launch order (ncu's ID)."""
    rows = []
    for row in csv.DictReader(io.StringIO(stdout[stdout.find('"ID"') :])):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        if row.get("Process ID") not in (None, "", str(pid)):
            continue
        unit = row.get("Metric Unit", "")
        if unit not in NS_PER:
            raise ValueError(f"ncu printed a duration in {unit!r}, a unit this benchmark does not know")
        value = float((row.get("Metric Value") or "0").replace(",", "")) * NS_PER[unit] * 1e-6
        rows.append((int(row["ID"]), row.get("Kernel Name") or "", value))
    return [(name, v) for _, name, v in sorted(rows)]


def _split_at_markers(
    rows: list[tuple[str, float]], order: list[list[Any]]
) -> dict[tuple[str, str, int], float]:
    """Sum each call's kernels: those after the k-th marker and before the next are order[k]'s."""
    per_call: dict[tuple[str, str, int], float] = {}
    slot = -1
    for name, value in rows:
        if name.startswith(MARKER):
            slot += 1
            continue
        if 0 <= slot < len(order) and order[slot][2] >= 0:
            key = (order[slot][0], order[slot][1], order[slot][2])
            per_call[key] = per_call.get(key, 0.0) + value
    if slot != len(order):
        print(f"ncu: {slot + 1} markers profiled, {len(order) + 1} launched", file=sys.stderr)
    return per_call


def gain(t_orig: float | None, t_cand: float | None) -> float | None:
    return None if not t_orig or not t_cand else t_orig / t_cand - 1.0


def ratio(g: float | None, ref: float | None) -> float | None:
    if g is None or ref is None or abs(math.log1p(ref)) < 1e-9:
        return None
    return math.log1p(g) / math.log1p(ref)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--no-ncu", action="store_true")
    ap.add_argument("--ncu-timeout", type=float, default=240.0)
    ap.add_argument("--ncu-child", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to measure", file=sys.stderr)
        return 2
    if args.ncu_child is not None:
        ncu_child(args.ncu_child)
        return 0
    rows = measure(args.blocks)
    ncu = {} if args.no_ncu else {c: ncu_times(args.ncu_timeout, c) for c in ("all", "none")}
    report(rows, ncu, args.out)
    return 0


def measure(blocks: int) -> dict[str, dict[str, dict[str, float]]]:
    rows: dict[str, dict[str, dict[str, float]]] = {}
    for name, (make, orig, cand) in _pairs().items():
        rows[name] = {}
        inputs = make()  # do_bench times one set, over and over, as it is used
        for which, fn in (("original", orig), ("candidate", cand)):
            rows[name][which] = {
                "cold": cko_time(make, fn, "cold", blocks),
                "hot": cko_time(make, fn, "hot", blocks),
                "graph": cko_time(make, fn, "graph", blocks),
                "do_bench": bench_time(functools.partial(fn, inputs)),
            }
        print(f"measured {name}", file=sys.stderr, flush=True)
    return rows


def report(
    rows: dict[str, dict[str, dict[str, float]]],
    ncu: dict[str, dict[tuple[str, str], float]],
    out: Path | None,
) -> None:
    """Per pair: each tool's gain, and each cko mode's ratio to ncu's gain under the cache state the
    mode runs in (cold: ncu's flushed caches; hot and graph: ncu's caches left warm)."""
    doc = []
    print(
        f"{'pair':34} {'us ncu':>7} {'g ncu cold':>10} {'g ncu warm':>10} {'g do_bench':>10} "
        f"{'g cold':>7} {'r':>5} {'g hot':>7} {'r':>5} {'g graph':>7} {'r':>5}"
    )
    for name, r in rows.items():
        o, c = r["original"], r["candidate"]
        kernels = {k: [v.get((name, "original")), v.get((name, "candidate"))] for k, v in ncu.items()}
        g_ncu = {k: gain(*v) for k, v in kernels.items()}
        g = {m: gain(o[m], c[m]) for m in ("cold", "hot", "graph", "do_bench")}
        ref = {"cold": g_ncu.get("all"), "hot": g_ncu.get("none"), "graph": g_ncu.get("none")}
        line = {
            "pair": name, "original_ms": o, "candidate_ms": c, "ncu_ms": kernels,
            "gain": {"ncu_cold": g_ncu.get("all"), "ncu_warm": g_ncu.get("none"), **g},
            "ratio": {m: ratio(g[m], ref[m]) for m in ("cold", "hot", "graph")},
        }  # fmt: skip
        doc.append(line)

        def f(v: float | None, fmt: str) -> str:
            return "-" if v is None else format(v, fmt)

        us = (kernels.get("all") or [None])[0]
        print(
            f"{name:34} {f(us * 1e3 if us else None, '7.1f')} {f(g_ncu.get('all'), '+10.1%')} "
            f"{f(g_ncu.get('none'), '+10.1%')} {f(g['do_bench'], '+10.1%')} "
            + " ".join(f"{f(g[m], '+7.1%')} {f(line['ratio'][m], '5.2f')}" for m in ("cold", "hot", "graph"))
        )
    if out is not None:
        out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/cko-fidelity-inductor")
    raise SystemExit(main())
