"""Print the acceptance figures from the JSON files the GPU run wrote (a short table)."""

import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
ceil = json.loads((out / "ceilings.json").read_text()) if (out / "ceilings.json").exists() else {}
for ex, bytes_fn in (("torch-layernorm", lambda p: 2 * (2 * p["rows"] * p["cols"] + 2 * p["cols"])),
                     ("cuda-reduce", lambda p: 4 * (p["rows"] * p["cols"] + p["rows"]))):
    st = out / ex
    try:
        ready = json.loads((Path(f"{st}.readiness.json")).read_text())
        base = json.loads((Path(f"{st}.baseline.json")).read_text())
        tgt = json.loads((Path(f"{st}.target.json")).read_text())
        audit = json.loads((Path(f"{st}.audit.json")).read_text())
    except (OSError, ValueError) as exc:
        print(f"{ex}: incomplete ({exc})")
        continue
    if "cases" not in base or "cases" not in tgt:
        print(f"{ex}: incomplete (baseline: {base.get('message')}, target: {tgt.get('message')})")
        continue
    rd = ready
    params = json.loads(Path(f"examples/{ex}/readiness.json").read_text())["cases"][0]["params"]
    med_ms = base["cases"][0]["median"]
    c = tgt["cases"][0]
    cand_ms = med_ms / (1 + c["effect_pct"] / 100) if c.get("effect_pct") is not None else float("nan")
    b = bytes_fn(params)
    bw = ceil.get("copy_bytes_per_s", float("nan"))
    ident = (rd.get("identity") or {})
    dev = (ident.get("devices") or [{}])[0]
    print(f"{ex}: gpu {dev.get('name')} {dev.get('uuid')} driver {ident.get('driver_version')} "
          f"image {(ident.get('image') or {}).get('id', '')[:19]}")
    print(f"  original {med_ms:.3f} ms = {b / (med_ms / 1e3) / 1e12:.2f} TB/s ({b / (med_ms / 1e3) / bw:.0%} of copy ceiling); "
          f"candidate ~{cand_ms:.3f} ms = {b / (cand_ms / 1e3) / 1e12:.2f} TB/s ({b / (cand_ms / 1e3) / bw:.0%})")
    print(f"  gain {c['effect_pct']:+.1f}% CI [{c['ci_low_pct']:+.1f}, {c['ci_high_pct']:+.1f}] over {c['pairs']} pairs: "
          f"{tgt['outcome']}; A/A resolution {base['resolution_pct']:.2f}%; audit holds: {audit.get('holds')}")
aa = out / "aa.jsonl"
if aa.exists():
    rows = [json.loads(x) for x in aa.read_text().splitlines() if x.strip()]
    acc = sum(1 for r in rows if r.get("outcome") == "accepted")
    print(f"A/A experiments: {acc}/{len(rows)} accepted (false positives)")
