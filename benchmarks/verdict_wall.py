"""What a verdict costs on the GPU: the wall of a screen + target stage, against do_bench's wall for
the same number of samples (issue 18, "Show it"). Needs a CUDA GPU and the cuda image.

    python3 benchmarks/verdict_wall.py [--mode cold|hot|graph] [--rows 4096 --cols 4096]

Through the CLI, on torch-layernorm and its Triton candidate: readiness (not counted), then a screen
and a target experiment. Per stage it reads every invocation's record: the container's wall
(`duration_s`) and the supervisor's calibration (`setup_s`: workers' hello and calibration inside
the container; `loop_s`: the measuring loop). The fixed start is the wall outside the loop
(container, imports, CUDA contexts, warm-up, calibration); the measuring wall is the loop.

Then, bare in this process (after the stages: its CUDA context must not be a foreign one during
them), `triton.testing.do_bench(return_mode="all")` on the same inputs gives do_bench's wall per
sample for each subject; its wall for the stage's blocks is blocks/2 x (original + candidate).
Issue 18's goals: measuring wall within 3x of do_bench's; the fixed start under 3 s on a warm machine.
Prints figures; exits 0 (not a gate), 2 without a GPU.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.boundary_cost import cko, object_json  # noqa: E402
from tests.gpu.run_subject import load_module  # noqa: E402

EX = ROOT / "examples" / "torch-layernorm"


def stages(work: Path, store: Path, mode: str) -> list[dict[str, Any]]:
    tgt = cko("readiness", "--request", str(work / "readiness.json"), "--store", str(store))["target"]["id"]
    var = cko("variant", "--request", str(work / "variant.json"), "--target", tgt, "--store", str(store))
    rows = []
    for stage in ("screen", "target"):
        t0 = time.monotonic()
        doc = cko(
            "experiment", "--request", str(work / f"{stage}.json"), "--target", tgt,
            "--variant", var["variant"]["id"], "--store", str(store),
        )  # fmt: skip
        wall = time.monotonic() - t0
        exp = json.loads((store / "experiments" / f"{doc['experiment']['id']}.json").read_text())
        rows.append({"stage": stage, "mode": mode, "cli_wall_s": wall, "outcome": doc.get("stage_outcome"),
                     "effect_pct": (doc.get("cases") or [{}])[0].get("effect_pct"),
                     "reasons": [f"{r['code']}: {r['message'][:300]}" for r in doc.get("reasons") or []],
                     **_invocations(store, exp)})  # fmt: skip
    return rows


def _invocations(store: Path, exp: dict[str, Any]) -> dict[str, Any]:
    """The stage's walls, summed over its invocations, and where its fixed start and loop went."""
    tot = dict.fromkeys(("container_s", "loop_s", "blocks", *PARTS, *HOST_PARTS, *INSIDE), 0.0)
    parts: dict[str, float] = {}
    untimed: dict[str, float] = {}
    voids: dict[str, dict[str, int]] = {}
    for ref in exp["plan"]["invocations"]:
        inv = json.loads((store / "invocations" / ref["id"] / "result.json").read_text())
        out = next(o for o in inv["outputs"] if o["name"] == "result.json")
        doc = object_json(store, out["sha256"])
        res = doc["driver_result"]
        cal = res.get("calibration") or {}
        container, before, setup, loop = (
            inv["duration_s"] or 0.0,
            cal.get("before_s") or 0.0,
            cal.get("setup_s") or 0.0,
            cal.get("loop_s") or 0.0,
        )
        driver_wall = sum(p.get("wall_s") or 0.0 for p in doc.get("processes") or [])
        for k, v in (
            ("container_s", container),
            ("loop_s", loop),
            ("blocks", cal.get("blocks") or 0),
            ("wrapper_s", container - driver_wall),
            ("driver_start_s", before),
            ("setup_s", setup),
            ("after_loop_s", driver_wall - before - setup - loop),
            *_breakdown(store / "invocations" / ref["id"] / "events.jsonl", res).items(),
        ):
            tot[k] += v
        _tally_voids(res, voids)
        for src, dst in ((cal.get("block_parts_s"), parts), (cal.get("untimed_parts_s"), untimed)):
            for part, v in (src or {}).items():
                dst[part] = dst.get(part, 0.0) + v
    fixed = tot["container_s"] - tot["loop_s"]
    return tot | {"fixed_s": fixed, "block_parts_s": parts, "untimed_parts_s": untimed, "voids": voids}


def _tally_voids(res: dict[str, Any], voids: dict[str, dict[str, int]]) -> None:
    """Voided blocks per subject by the start of their reason, checked ones apart."""
    for s in res.get("series") or []:
        checked = set((s.get("accuracy") or {}).get("checked_reps") or [])
        mine = voids.setdefault(s["subject"], {})
        for rep, why in zip(s.get("reps") or [], s.get("void") or [], strict=False):
            if why:
                key = ("checked: " if rep in checked else "") + re.sub(r"[\d.]+", "#", why)[:70]
                mine[key] = mine.get(key, 0) + 1


# the fixed start, the container's run less the loop, in order: the operation's wrapper around the
# driver process (the in-container probe, its imports, its own result); the driver process's start
# (interpreter, imports) up to the supervisor's clock; the supervisor's setup (the workers' containers
# started, their load: Python, the harness, the subject, its CUDA context; its calibration); after the
# loop (checks, the result written). Informative, inside setup: the workers' start and slowest load.
PARTS = ("wrapper_s", "driver_start_s", "setup_s", "after_loop_s")
INSIDE = ("workers_start_s", "worker_load_s", "bracket_s", "staging_s")
# outside the container's run, on the host: its creation and start, its and the workers' removal
HOST_PARTS = ("create_s", "teardown_s")


def _breakdown(events: Path, res: dict[str, Any]) -> dict[str, float]:
    t = {}
    for line in events.read_text().splitlines():
        e = json.loads(line)
        t.setdefault(e["event"], datetime.fromisoformat(e["t"]).timestamp())
        if e["event"] in ("worker_started", "terminal"):
            t[e["event"]] = datetime.fromisoformat(e["t"]).timestamp()  # the last one
    series = res.get("series") or []
    started = t.get("container_started", 0.0)
    return {
        "create_s": started - t.get("created", 0.0),
        "teardown_s": t.get("terminal", 0.0) - t.get("exited", t.get("terminal", 0.0)),
        "workers_start_s": t.get("worker_started", started) - started,
        "worker_load_s": max((w.get("load_s") or 0.0 for w in res.get("workers") or []), default=0.0),
        "bracket_s": sum(sum(s.get("bracket_ns") or []) for s in series) / 1e9,
        "staging_s": sum(sum(s.get("stage_ns") or []) for s in series) / 1e9,
    }


def do_bench_per_sample(params: dict[str, Any]) -> dict[str, float]:
    """Seconds of do_bench's wall per sample, per subject, on the harness's own inputs."""
    import numpy as np
    from triton.testing import do_bench

    driver = load_module(EX / "driver.py", "cko_lnorm_driver")
    inputs = driver.make_inputs(params, np.random.default_rng(0), "cuda")
    out = {}
    for which, path in (("original", EX / "kernel.py"), ("candidate", EX / "candidate" / "kernel.py")):
        impl = load_module(path, f"cko_lnorm_{which}")
        t0 = time.perf_counter()
        times = do_bench(lambda impl=impl: driver.run(impl, inputs), warmup=25, rep=200, return_mode="all")
        out[which] = (time.perf_counter() - t0) / len(times)
    return out


def bare_start_s(repeat: int = 3) -> dict[str, float]:
    """The floor under any fixed start that runs torch: a fresh interpreter's `import torch` and its first
    CUDA op, bare on this host (no container), best of `repeat`. Every stage starts three such processes
    (the supervisor and two workers) side by side."""
    code = (
        "import time; t0 = time.perf_counter(); import torch; t1 = time.perf_counter(); "
        "torch.zeros(1, device='cuda'); torch.cuda.synchronize(); "
        "print(t1 - t0, time.perf_counter() - t1)"
    )
    best = {"process_s": float("inf"), "import_s": float("inf"), "first_op_s": float("inf")}
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        imp, first = (float(x) for x in out.split())
        now = {"process_s": time.perf_counter() - t0, "import_s": imp, "first_op_s": first}
        best = {k: min(best[k], now[k]) for k in best}
    return best


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("cold", "hot", "graph"), default="cold")
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if shutil.which("nvidia-smi") is None:
        print("no NVIDIA GPU: nothing to measure", file=sys.stderr)
        return 2
    params = {"rows": args.rows, "cols": args.cols, "dtype": "bf16"}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d) / "torch-layernorm"
        shutil.copytree(EX, work, ignore=shutil.ignore_patterns("__pycache__"))
        req = json.loads((work / "readiness.json").read_text())
        req["cases"] = [{"id": f"bf16_{args.rows}x{args.cols}", "params": params}]
        req["plan"]["timing"] = {"mode": args.mode}
        (work / "readiness.json").write_text(json.dumps(req))
        rows = stages(work, Path(d) / "store", args.mode)
    floor = bare_start_s()
    per = do_bench_per_sample(params)
    print(f"torch-layernorm bf16 {args.rows}x{args.cols}, {args.mode} mode; do_bench s/sample: "
          f"original {per['original']:.6f}, candidate {per['candidate']:.6f}")  # fmt: skip
    print(f"{'stage':8}{'blocks':>7}{'outcome':>14}{'effect %':>10}{'cli s':>8}{'fixed s':>9}{'loop s':>8}"
          f"{'warm-up s':>10}{'do_bench s':>11}{'loop/do_bench':>14}{'(loop-warm-up)/do_bench':>25}")  # fmt: skip
    for r in rows:
        r["do_bench_s"] = r["blocks"] / 2 * (per["original"] + per["candidate"])
        # the subjects' warm-up (first calls: JIT compiles, autotuning) is once per subject and case,
        # like a fixed start; do_bench's own first calls are inside its wall
        r["warm_up_s"] = r["block_parts_s"].get("warm-up", 0.0)
        r["ratio"] = r["loop_s"] / r["do_bench_s"] if r["do_bench_s"] else None
        r["ratio_measuring"] = (r["loop_s"] - r["warm_up_s"]) / r["do_bench_s"] if r["do_bench_s"] else None
        eff = r["effect_pct"]
        print(f"{r['stage']:8}{r['blocks']:>7}{r['outcome'] or '-':>14}{'-' if eff is None else f'{eff:+.1f}':>10}"
              f"{r['cli_wall_s']:8.2f}{r['fixed_s']:9.2f}{r['loop_s']:8.2f}{r['warm_up_s']:10.2f}"
              f"{r['do_bench_s']:11.3f}{_f(r['ratio']):>14}{_f(r['ratio_measuring']):>25}")  # fmt: skip
    print(
        "where it went, s. fixed: the operation's wrapper, the driver's start, the supervisor's setup "
        "(of it the workers' start and slowest load), after the loop; host: create, teardown; loop: by "
        "part of a block, and inside the untimed commands after the window"
    )
    for r in rows:
        print(f"{r['stage']:8}fixed " + " ".join(f"{k[:-2]}={r[k]:.3f}" for k in PARTS)
              + " (" + " ".join(f"{k[:-2]}={r[k]:.3f}" for k in INSIDE) + ")"
              + "; host " + " ".join(f"{k[:-2]}={r[k]:.3f}" for k in HOST_PARTS))  # fmt: skip
        print(f"{'':8}loop: " + ", ".join(
            f"{k} {v:.3f}" for k, v in sorted(r["block_parts_s"].items(), key=lambda kv: -kv[1])
        ))  # fmt: skip
        print(f"{'':8}untimed: " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(r["untimed_parts_s"].items())))
        print(f"{'':8}voided blocks: {json.dumps(r['voids'])}")
        if r["outcome"] not in ("accepted", "promising"):
            print(f"{'':8}reasons: {r['reasons']}")
    print(f"bare on this host, best of 3: a fresh process importing torch and running its first CUDA op "
          f"{floor['process_s']:.2f} s (import {floor['import_s']:.2f}, first op {floor['first_op_s']:.2f})")  # fmt: skip
    if args.out is not None:
        doc = {"do_bench_s_per_sample": per, "bare_torch_start_s": floor, "stages": rows}
        args.out.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
