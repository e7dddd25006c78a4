"""How many pairs and how much wall time cko needs to resolve a 2% effect on a real example, against
timing the same workload the way KernelBench-style harnesses do (mean of N runs, no pairing), and
both false-positive rates on A/A data, side by side (issue 5).

It measures real A/A data in the sandbox (`cko readiness` + `cko baseline` on the NumPy example,
many A/A pairs), then resamples those real pairs: a true 2% gain is injected by scaling the
candidate side by 1/1.02 (the noise stays the measured one). cko's rule is its own paired test
(`operations.stats.compare`, min effect 1%); the KernelBench-style rule declares a speed-up when
mean(reference)/mean(candidate) > 1 + threshold over N unpaired runs of each.

    .venv/bin/python benchmarks/resolve_effect.py [--aa-pairs 60] [--trials 300]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cko_perf.operations import stats  # noqa: E402


def cko(*args: str) -> dict:
    r = subprocess.run(
        [sys.executable, "-m", "cko_perf", *args, "--json"], capture_output=True, text=True, cwd=ROOT
    )
    if r.returncode != 0:
        raise SystemExit(f"cko {' '.join(args)} failed: {r.stdout[-1500:]} {r.stderr[-1500:]}")
    return json.loads(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--aa-pairs", type=int, default=60)
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--effect", type=float, default=2.0)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="cko-resolve-"))
    work = tmp / "ex"
    shutil.copytree(ROOT / "examples" / "numpy-softmax", work, ignore=shutil.ignore_patterns("__pycache__"))
    req = json.loads((work / "readiness.json").read_text())
    req["cases"] = [{"id": "r512x2048", "params": {"rows": 512, "cols": 2048}}]
    (work / "readiness.json").write_text(json.dumps(req))
    store = tmp / "store"
    t0 = time.perf_counter()
    tgt = cko("readiness", "--request", str(work / "readiness.json"), "--store", str(store))["target"]["id"]
    (work / "b.json").write_text(
        json.dumps({"samples_per_case": 2 * args.aa_pairs, "aa_pairs": args.aa_pairs, "seed": 1})
    )
    b = cko("baseline", "--request", str(work / "b.json"), "--target", tgt, "--store", str(store))
    measure_s = time.perf_counter() - t0
    rec = json.loads((store / "baselines" / f"{b['baseline']['id']}.json").read_text())
    inv = json.loads((store / "invocations" / rec["invocation"]["id"] / "result.json").read_text())
    dr_ref = next(o for o in inv["outputs"] if o["name"] == "result.json")
    dr = json.loads((store / "objects" / "sha256" / dr_ref["sha256"][:2] / dr_ref["sha256"]).read_text())
    series = {(s["subject"]): s for s in dr["driver_result"]["series"]}
    a = np.array(series["aa-ref"]["samples"]["time"])
    c = np.array(series["aa-cand"]["samples"]["time"])
    solo = np.array(series["original"]["samples"]["time"])
    per_pair_s = float(np.median(np.concatenate([a, c]))) * 2 / 1e3
    rng = np.random.default_rng(0)
    gain = 1 + args.effect / 100
    print(
        f"real A/A data: {len(a)} pairs, median {np.median(a):.3f} ms, pair log-ratio sd "
        f"{np.std(np.log(a / c)):.4f}, unpaired sd {np.std(np.log(solo)):.4f} (measured in {measure_s:.0f} s)"
    )
    print(
        f"{'pairs/runs N':>12s} | {'cko accept (true +2%)':>22s} {'cko FP (A/A)':>13s} | "
        f"{'mean-of-N speedup>1.0':>22s} {'FP (A/A)':>9s} | {'speedup>1.02 FP':>15s}"
    )
    need = None
    for n in (6, 10, 15, 20, 30, 45, 60):
        if n > len(a):
            break
        acc = fp = kb = kb_fp = kb2_fp = 0
        for trial in range(args.trials):
            idx = rng.choice(len(a), size=n, replace=True)
            ra, rc = a[idx], c[idx]
            acc += (
                stats.compare(
                    ra, rc / gain, direction="lower", min_effect_pct=1.0, seed=trial, resamples=500
                ).verdict
                == "accepted"
            )
            fp += (
                stats.compare(
                    ra, rc, direction="lower", min_effect_pct=1.0, seed=trial, resamples=500
                ).verdict
                == "accepted"
            )
            ua, uc = rng.choice(solo, size=n), rng.choice(solo, size=n)
            kb += ua.mean() / (uc / gain).mean() > 1.0
            kb_fp += ua.mean() / uc.mean() > 1.0
            kb2_fp += ua.mean() / uc.mean() > 1.02
        T = args.trials
        print(
            f"{n:12d} | {acc / T:22.2f} {fp / T:13.3f} | {kb / T:22.2f} {kb_fp / T:9.2f} | {kb2_fp / T:15.2f}"
        )
        if need is None and acc / T >= 0.8:
            need = n
    if need:
        print(
            f"cko resolves a {args.effect:g}% gain with >= 80% power at {need} pairs: about "
            f"{need * per_pair_s:.1f} s of workload time (+ one container start)"
        )
    else:
        print(f"cko needs more than {len(a)} pairs for {args.effect:g}% on this machine (noise above)")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
