"""Print the acceptance figures from the JSON files the GPU run wrote (a short table).

Usage: python3 tests/gpu/summarize.py /tmp/acc   (what acceptance.sh leaves there; missing parts are named)
"""

import collections
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])


def load(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError):
        return None


ceil = load("ceilings.json") or {}
bw = ceil.get("copy_bytes_per_s", float("nan"))
if ceil:
    print(
        f"ceilings: copy {bw / 1e12:.2f} TB/s (read+write), bf16 matmul {ceil.get('bf16_flops_per_s', float('nan')) / 1e12:.0f} TFLOP/s"
    )
MIN_BYTES = {
    "torch-layernorm": lambda p: 2 * (2 * p["rows"] * p["cols"] + 2 * p["cols"]),
    "cuda-reduce": lambda p: 4 * (p["rows"] * p["cols"] + p["rows"]),
}
for ex, bytes_fn in MIN_BYTES.items():
    ready, base, tgt, sel, audit = (
        load(f"{ex}.{k}.json") for k in ("readiness", "baseline", "target", "select", "audit")
    )
    if not ready or "target" not in ready:
        print(f"{ex}: readiness incomplete: {(ready or {}).get('message') or (ready or {}).get('blockers')}")
        continue
    ident = ready.get("identity") or {}
    dev = (ident.get("devices") or [{}])[0]
    print(
        f"{ex}: target {ready['target']['id']} gpu {dev.get('name')} {dev.get('uuid')} driver "
        f"{ident.get('driver_version')} image {(ident.get('image') or {}).get('id', '')[:19]}"
    )
    if not base or "cases" not in base:
        print(f"  baseline incomplete: {(base or {}).get('message')}")
        continue
    print(
        f"  baseline median {base['cases'][0]['median']:.4f} ms; A/A resolution {base['resolution_pct']:.2f}%"
    )
    if not tgt or not tgt.get("cases"):
        print(
            f"  target stage incomplete: {(tgt or {}).get('outcome')} {(tgt or {}).get('reasons') or (tgt or {}).get('message')}"
        )
        continue
    params = json.loads(Path(f"examples/{ex}/readiness.json").read_text())["cases"][0]["params"]
    b = bytes_fn(params)
    c = tgt["cases"][0]
    for who in ("reference", "candidate"):
        ms = c.get(f"{who}_median")
        if ms:
            print(
                f"  {who:9} {ms:.4f} ms = {b / (ms / 1e3) / 1e12:.2f} TB/s = {b / (ms / 1e3) / bw:.1%} of the copy ceiling"
            )
    print(
        f"  gain {c['effect_pct']:+.1f}% CI [{c['ci_low_pct']:+.1f}, {c['ci_high_pct']:+.1f}] over {c['pairs']} pairs: "
        f"{tgt['outcome']}; champion selected: {bool(sel and sel.get('selection'))}; "
        f"audit holds: {(audit or {}).get('holds')}"
    )
ov = load("overhead-driver.json")
if ov:
    print(
        f"overhead: driver bare {ov['bare']['wall_s']} s, in cko exec {ov['cko_exec']['wall_s']} s "
        f"({ov['overhead_s']:+.2f} s); kernel median {ov['bare']['median_ms']:.4f} vs {ov['cko_exec']['median_ms']:.4f} ms"
    )
for report, who in (("ncu-collect.json", "original"), ("ncu-collect-candidate.json", "candidate")):
    ncu = load(report)
    if not ncu:
        continue
    facts = ncu.get("facts") or {}
    launches = facts.get("launches") or []
    print(
        f"ncu --collect ({who}): state {ncu.get('state')}, limitation {ncu.get('limitation') or facts.get('limitation')}, "
        f"{len(launches)} launch(es) {ncu.get('message') or ''}".strip()
    )
    # the subject's kernels first: the harness's own (torch's randn, copies, the float64 reference) follow
    for la in sorted(launches, key=lambda la: "at::" in str(la.get("name")))[:4]:
        print(
            f"  {str(la.get('name'))[:40]:40} {la.get('duration_ns')} ns, DRAM {la.get('dram_throughput_pct')}%, "
            f"occupancy {la.get('achieved_occupancy_pct')}%, {la.get('registers_per_thread')} regs"
        )
sass = load("sass.json")
if sass:
    fs = ((sass.get("facts") or {}).get("sass") or {}).get("functions") or []
    print(f"sass --binary: {len(fs)} function(s) {sass.get('message') or ''}".strip())
    for f in fs[:3]:
        print(
            f"  {str(f.get('name'))[-40:]}: {f.get('instructions')} instructions, LDG widths {f.get('global_load_widths')}, local {f.get('uses_local_memory')}"
        )
if (out / "parse.txt").exists():
    print("parse speed, one core of the GPU host:")
    for line in (out / "parse.txt").read_text().splitlines():
        if "/s" in line:
            print("  " + line.rstrip())
for name, what in (("adversarial.txt", "GPU adversarial"), ("pytest-gpu.txt", "pytest -m gpu")):
    if (out / name).exists():
        print(f"{what}: " + ((out / name).read_text().strip().splitlines() or ["(no output)"])[-1])
aa = out / "aa.jsonl"
if aa.exists():
    rows = [json.loads(x) for x in aa.read_text().splitlines() if x.strip()]
    acc = sum(1 for r in rows if r.get("outcome") == "accepted")
    effects = sorted(
        c["effect_pct"] for r in rows for c in (r.get("cases") or []) if c.get("effect_pct") is not None
    )
    span = f"; effects {effects[0]:+.2f} .. {effects[-1]:+.2f}%" if effects else ""
    outcomes = collections.Counter(str(r.get("outcome")) for r in rows)
    verdicts = collections.Counter(str(c.get("verdict")) for r in rows for c in (r.get("cases") or []))
    secs = sorted(r["seconds"] for r in rows if isinstance(r.get("seconds"), (int, float)))
    took = f"; {secs[len(secs) // 2]:.0f} s each (median)" if secs else ""
    print(f"A/A experiments: {acc}/{len(rows)} accepted (false positives){span}{took}")
    print(f"  outcomes {dict(outcomes)}; per-case verdicts {dict(verdicts)}")
