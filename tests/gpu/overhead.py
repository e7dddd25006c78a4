"""The cost of the sandbox on the GPU: one driver request run bare on the host and as a cko invocation.

The same torch-layernorm driver, the same request (original only, 5 warm-up runs, 20 timed
repetitions of the 32768x4096 bf16 case), once with the host's python3 and once through
`cko exec --image cuda --gpus 0` (hardened container, GPU passthrough, probe and grant check).
Prints, for each, the wall time of the whole run and the median of the kernel times the driver
measured: the first says what a containerised invocation costs, the second that the container does
not change what is measured. Usage (GPU machine, after prepare.sh): python3 tests/gpu/overhead.py [OUT.json]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples" / "torch-layernorm"
REPS = 20


def request(subject_path: str, result_path: str) -> dict:
    case = {"id": "bf16_32768x4096", "params": {"rows": 32768, "cols": 4096, "dtype": "bf16"}}
    return {
        "protocol": "cko/driver-v1",
        "mode": "measure",
        "device": "cuda",
        "entry": "kernel.py",
        "seed": 7,
        "warmup": 5,
        "subjects": [{"id": "original", "path": subject_path}],
        "cases": [case],
        "schedule": [{"subject": "original", "case": case["id"], "rep": r} for r in range(REPS)],
        "metrics": [{"name": "time", "unit": "ms"}],
        "accuracy": {"rel_l2": 1e-2, "check_fraction": 0.25},
        "result_path": result_path,
    }


def medians(result: dict) -> float:
    return statistics.median(result["series"][0]["samples"]["time"])


def main() -> int:
    out_path = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    with tempfile.TemporaryDirectory(prefix="cko-overhead-") as tmp:
        work = Path(tmp)
        shutil.copytree(EX, work / "ex", ignore=shutil.ignore_patterns("candidate", "*.json", "__pycache__"))
        os.chmod(work, 0o755)
        (work / "bare.json").write_text(json.dumps(request(str(work / "ex"), str(work / "bare-result.json"))))
        (work / "boxed.json").write_text(json.dumps(request("/cko/in/ex", "/tmp/result.json")))
        env = os.environ | {"PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}

        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, str(work / "ex" / "driver.py"), str(work / "bare.json")], check=True, env=env
        )
        bare_s = time.perf_counter() - t0
        bare = json.loads((work / "bare-result.json").read_text())

        show = (
            "import json, statistics; r = json.load(open('/tmp/result.json')); "
            "print(json.dumps({'median_ms': statistics.median(r['series'][0]['samples']['time']), "
            "'integrity': r['integrity'], 'passed': r['series'][0]['accuracy']['passed']}))"
        )
        t0 = time.perf_counter()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "cko_perf",
                "exec",
                "--image",
                "cuda",
                "--gpus",
                "0",
                "--memory",
                "16g",
                "--json",
                "--store",
                str(work / "store"),
                "--mount",
                f"{work}:/cko/in",
                "--",
                "sh",
                "-c",
                f'python /cko/in/ex/driver.py /cko/in/boxed.json && python -c "{show}"',
            ],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        boxed_s = time.perf_counter() - t0
        doc = json.loads(proc.stdout)
        if doc.get("state") != "succeeded":
            print(json.dumps(doc)[:3000], file=sys.stderr)
            return 1
        boxed = json.loads(doc["stdout_tail"].strip().splitlines()[-1])

    figures = {
        "reps": REPS,
        "bare": {
            "wall_s": round(bare_s, 3),
            "median_ms": medians(bare),
            "integrity": bare["integrity"],
            "passed": bare["series"][0]["accuracy"]["passed"],
        },
        "cko_exec": {"wall_s": round(boxed_s, 3), "container_s": doc.get("duration_s"), **boxed},
    }
    figures["overhead_s"] = round(boxed_s - bare_s, 3)
    figures["median_diff_pct"] = round(100 * (boxed["median_ms"] / figures["bare"]["median_ms"] - 1), 3)
    if out_path:
        out_path.write_text(json.dumps(figures, indent=1))
    print(f"driver bare: {bare_s:.2f} s wall, median {figures['bare']['median_ms']:.4f} ms")
    print(
        f"driver in cko exec: {boxed_s:.2f} s wall (container {doc.get('duration_s')} s), "
        f"median {boxed['median_ms']:.4f} ms"
    )
    print(
        f"overhead {figures['overhead_s']:+.2f} s per invocation; kernel median differs by {figures['median_diff_pct']:+.2f}%"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
