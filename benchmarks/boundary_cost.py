"""What the supervisor/worker boundary costs per sample, against the harness-trusted path.

Runs the same A/A target stage (the original against an identical variant) of an example twice
through the CLI: as cko runs it (`driver.kind: helper` — a supervisor container and one worker
container per subject, frozen outside their windows), and as a hand-written driver would
(`harness_trusted` — every subject in the harness's process, the design before the boundary). For
each it prints the invocation's wall, the boundary's fixed start (workers' hello and calibration),
the loop's wall, the time inside the timed windows, and the overhead per sample outside them.

    python benchmarks/boundary_cost.py                       # numpy-softmax on the CPU (512x4096)
    python benchmarks/boundary_cost.py torch-layernorm       # on a GPU host, after the cuda image build
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = {
    "numpy-softmax": {"id": "r512x4096", "params": {"rows": 512, "cols": 4096}},
    "torch-layernorm": {"id": "bf16_4096x4096", "params": {"rows": 4096, "cols": 4096, "dtype": "bf16"}},
}
PAIRS = 20


def cko(*args: str) -> dict:
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    }
    p = subprocess.run(
        [sys.executable, "-m", "cko_perf", *args, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    try:
        return json.loads(p.stdout)
    except ValueError:
        raise SystemExit(
            f"cko {' '.join(args[:2])} failed ({p.returncode}): {p.stdout[-800:]} {p.stderr[-800:]}"
        ) from None


def object_json(store: Path, sha: str) -> dict:
    return json.loads((store / "objects" / "sha256" / sha[:2] / sha).read_text())


def run(example: str, kind: str, tmp: Path) -> dict:
    work = tmp / f"{example}-{kind}"
    shutil.copytree(ROOT / "examples" / example, work, ignore=shutil.ignore_patterns("__pycache__"))
    req = json.loads((work / "readiness.json").read_text())
    req["cases"] = [CASES[example]]
    req["driver"]["kind"] = kind
    req["plan"]["target_pairs"] = PAIRS
    (work / "readiness.json").write_text(json.dumps(req))
    shutil.rmtree(work / "candidate", ignore_errors=True)
    (tmp / f"aa-{kind}").mkdir()  # a variant holds the files it may change: the original's kernel again
    shutil.copy2(work / "kernel.py", tmp / f"aa-{kind}" / "kernel.py")
    store = tmp / f"store-{kind}"
    tgt = cko("readiness", "--request", str(work / "readiness.json"), "--store", str(store))["target"]["id"]
    (work / "aa.json").write_text(
        json.dumps({"path": str(tmp / f"aa-{kind}"), "claim": "A/A: the original again"})
    )
    var = cko("variant", "--request", str(work / "aa.json"), "--target", tgt, "--store", str(store))[
        "variant"
    ]["id"]
    doc = cko(
        "experiment",
        "--request",
        str(work / "target.json"),
        "--target",
        tgt,
        "--variant",
        var,
        "--store",
        str(store),
    )
    exp = json.loads((store / "experiments" / f"{doc['experiment']['id']}.json").read_text())
    inv = json.loads((store / "invocations" / exp["invocation"]["id"] / "result.json").read_text())
    dr = object_json(store, exp["samples"]["sha256"])
    n = sum(len(s["reps"]) for s in dr["series"])
    windows = sum(v * 1e-9 for s in dr["series"] for v in (s["bracket_ns"] or s["wall_ns"]))
    cal = dr.get("calibration") or {}
    loop = cal.get("loop_s")
    return {
        "kind": kind,
        "wall_s": inv["duration_s"],
        "setup_s": cal.get("setup_s"),
        "loop_s": loop,
        "blocks": n,
        "windows_s": windows,
        "outcome": doc.get("stage_outcome"),
        "per_sample_ms": None if loop is None else 1e3 * (loop - windows) / n,
        "effect_pct": doc["cases"][0].get("effect_pct") if doc.get("cases") else None,
        "block_parts_s": cal.get("block_parts_s") or {},
    }


def main() -> None:
    example = sys.argv[1] if len(sys.argv) > 1 else "numpy-softmax"
    with tempfile.TemporaryDirectory() as d:
        rows = [run(example, kind, Path(d)) for kind in ("helper", "harness_trusted")]
    print(f"{example}, {CASES[example]['id']}, A/A target stage of {PAIRS} pairs ({2 * PAIRS} timed blocks)")
    print(
        f"{'path':<16}{'wall s':>8}{'start s':>9}{'loop s':>8}{'windows s':>11}{'ms/sample outside':>19}{'effect %':>10}"
    )
    for r in rows:

        def f(v: object, fmt: str) -> str:
            return format(v, fmt) if isinstance(v, int | float) else "-"

        print(
            f"{r['kind']:<16}{f(r['wall_s'], '8.2f')}{f(r['setup_s'], '9.2f')}{f(r['loop_s'], '8.2f')}"
            f"{f(r['windows_s'], '11.3f')}{f(r['per_sample_ms'], '19.2f')}{f(r['effect_pct'], '+10.2f')}"
        )
    w, t = rows
    parts = w["block_parts_s"]
    print("the boundary's loop by part of a block, ms per sample: " + ", ".join(
        f"{k} {1e3 * v / w['blocks']:.2f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])
    ))  # fmt: skip
    print(
        f"invocation wall: boundary {w['wall_s']:.2f} s against {t['wall_s']:.2f} s harness-trusted "
        f"(+{w['wall_s'] - t['wall_s']:.2f} s); outside the windows the boundary spends "
        f"{w['per_sample_ms']:.2f} ms per sample"
    )


if __name__ == "__main__":
    main()
