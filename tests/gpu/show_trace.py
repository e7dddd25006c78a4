"""Summarise a `cko profile torch --collect --json` answer: what the trace says and what it is bound to.

    python3 tests/gpu/show_trace.py collect.json

Prints the binding (Target, subject snapshot, image, report object), the five longest kernels, how
many GPU events are correlated with their launch call, the launch delay (GPU start minus the launch
call's start) and the GPU's idle gaps between consecutive kernels, the CPU side's share of the time.
"""

from __future__ import annotations

import json
import statistics
import sys


def main(path: str) -> int:
    doc = json.load(open(path))
    if "facts" not in doc:
        print(json.dumps(doc)[:2000])
        return 1
    f = doc["facts"]
    print("bound:", json.dumps(f.get("bound_to"))[:400])
    print("report:", json.dumps(doc.get("report"))[:300])
    print(f"events {f['events']}, GPU events {f['gpu_events']}, correlated {f['gpu_events_correlated']}")
    print("kernels (count, total us, name):")
    for k in sorted(f["kernel_summary"], key=lambda k: -k["total_ns"])[:5]:
        print(f"  {k['count']:5d} {k['total_ns'] / 1e3:10.1f}  {k['name'][:90]}")
    kernels = sorted((e for e in f["gpu"] if e["category"] == "kernel"), key=lambda e: e["start_ns"])
    delays = [e["launch_delay_ns"] for e in kernels if e["launch_delay_ns"] is not None]
    gaps = [
        b["start_ns"] - (a["start_ns"] + a["duration_ns"]) for a, b in zip(kernels, kernels[1:], strict=False)
    ]
    busy = sum(e["duration_ns"] for e in kernels)
    if delays:
        print(f"launch delay us: median {statistics.median(delays) / 1e3:.1f}, max {max(delays) / 1e3:.1f}")
    if gaps and kernels:
        span = kernels[-1]["start_ns"] + kernels[-1]["duration_ns"] - kernels[0]["start_ns"]
        print(
            f"GPU gaps between kernels us: median {statistics.median(gaps) / 1e3:.1f}, max {max(gaps) / 1e3:.1f}; "
            f"kernels busy {busy / 1e3:.1f} of {span / 1e3:.1f} us ({100 * busy / span:.0f}%)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
