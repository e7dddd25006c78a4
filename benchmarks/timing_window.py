"""What the helper's GPU timing window adds to a kernel's own time (needs a CUDA GPU, torch and nvcc).

    python3 benchmarks/timing_window.py [--reps 50] [--rows 32768] [--cols 4096] [--sched auto|spin|yield|blocking]

The helper (operations/driver.py, `_TorchCuda.time`) times a run as: whole-device synchronise,
event, the run, whole-device synchronise, event, wait. The second synchronise is what makes work
left on other streams count, and it puts the host round trip (the launch call, the synchronise
returning, the end event's submission) inside the window. This prints, per subject of the
cuda-reduce example (original and candidate, built by the example's own driver) and for an empty
run, the median over --reps of:

* `window`: the helper's own `time()`, as an experiment measures;
* `events`: start event, launch, end event, then wait (no synchronise inside: the kernel alone
  plus the launch gap on the stream);
* `stream x20`: twenty launches back to back between two events, divided by twenty (the kernel's
  throughput time, launch gaps hidden).

`window - events` is the fixed cost the window adds to every sample. It leaves a paired difference
unchanged, but it is in both medians of a relative effect, so a short kernel's gain reads lower than
its kernel-only gain. Prints a table; exits 0 (figures, not a gate); exits 2 where there is no GPU.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3  # ms -> us


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--rows", type=int, default=32768)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument(
        "--sched",
        choices=["auto", "spin", "yield", "blocking"],
        default="auto",
        help="the primary context's host wait (cuDevicePrimaryCtxSetFlags, before torch makes it)",
    )
    a = ap.parse_args(argv)
    if a.sched != "auto":
        import ctypes

        try:
            cu = ctypes.CDLL("libcuda.so.1")
        except OSError:
            print("no libcuda.so.1: no NVIDIA driver")
            return 2
        flag = {"spin": 1, "yield": 2, "blocking": 4}[a.sched]  # CU_CTX_SCHED_*
        dev = ctypes.c_int()
        if cu.cuInit(0) or cu.cuDeviceGet(ctypes.byref(dev), 0) or cu.cuDevicePrimaryCtxSetFlags(dev, flag):
            print("cuDevicePrimaryCtxSetFlags failed")
            return 2
    try:
        import torch
    except ImportError:
        print("torch is not installed")
        return 2
    if not torch.cuda.is_available():
        print("no CUDA GPU")
        return 2
    from cko_perf.operations.driver import _TorchCuda

    spec = importlib.util.spec_from_file_location(
        "reduce_driver", ROOT / "examples" / "cuda-reduce" / "driver.py"
    )
    assert spec and spec.loader
    drv: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(drv)
    build = tempfile.TemporaryDirectory(prefix="cko-window-")
    drv.BUILD_ROOT = Path(build.name)  # the subjects' nvcc builds; removed with `build` at exit
    clock = _TorchCuda()
    x = torch.randn(a.rows, a.cols, device="cuda", dtype=torch.float32)
    out = torch.empty(a.rows, device="cuda", dtype=torch.float32)
    inputs = {"x": x, "out": out, "rows": a.rows, "cols": a.cols}
    ex = ROOT / "examples" / "cuda-reduce"
    runs: dict[str, Callable[[], object]] = {"empty run": lambda: None}
    for sid, path in (("original", ex), ("candidate", ex / "candidate")):
        runs[sid] = functools.partial(drv.run, drv.load(sid, path, "kernel.cu"), inputs)
    gb = drv.min_bytes({"rows": a.rows, "cols": a.cols}) / 1e9
    print(
        f"timing window on {torch.cuda.get_device_name()} (host wait: {a.sched}): cuda-reduce {a.rows}x{a.cols} f32 "
        f"({gb:.3f} GB moved), median of {a.reps}"
    )
    print(
        f"{'subject':12} {'window us':>10} {'events us':>10} {'stream x20 us':>14} {'window - events':>16} "
        f"{'TB/s (x20)':>11}"
    )
    for name, fn in runs.items():
        for _ in range(3):  # warm: build, first launch, clocks
            clock.time(fn)
        window = [clock.time(fn)[1] / 1e6 for _ in range(a.reps)]
        ev, x20 = [], []
        for _ in range(a.reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            s.record()
            fn()
            e.record()
            e.synchronize()
            ev.append(s.elapsed_time(e))
            torch.cuda.synchronize()
            s.record()
            for _ in range(20):
                fn()
            e.record()
            e.synchronize()
            x20.append(s.elapsed_time(e) / 20)
        w, v, t = _median_us(window), _median_us(ev), _median_us(x20)
        rate = f"{gb / (t * 1e-6) / 1e3:11.2f}" if name != "empty run" else f"{'-':>11}"
        print(f"{name:12} {w:10.1f} {v:10.1f} {t:14.1f} {w - v:16.1f} {rate}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
