"""`cko report`: a readable account of a store — Target, baseline and resolution, every experiment
with its verdict and interval, the champion, the environment — as text, JSON, or HTML with plots
(inline SVG: pair ratios, sample distributions, telemetry)."""

from __future__ import annotations

import html
import json
import math
from typing import Any

from .invocation import load_result
from .store import Store
from .workflow.champion import show
from .workflow.experiment import supports
from .workflow.records import Baseline, Experiment, Target


def gather(store: Store) -> dict[str, Any]:
    targets = [store.get_record("targets", i, Target)[0] for i in store.list_records("targets")]
    baselines = [store.get_record("baselines", i, Baseline)[0] for i in store.list_records("baselines")]
    experiments = [store.get_record("experiments", i, Experiment)[0] for i in store.list_records("experiments")]
    return {"targets": targets, "baselines": baselines, "experiments": experiments, "champion": show(store)}


def to_json(data: dict[str, Any]) -> dict[str, Any]:
    return {
        "targets": [t.model_dump(mode="json") for t in data["targets"]],
        "baselines": [b.model_dump(mode="json") for b in data["baselines"]],
        "experiments": [e.model_dump(mode="json") for e in data["experiments"]],
        "champion": data["champion"],
    }


def _ci(p: dict[str, Any]) -> str:
    if p.get("ci_low_pct") is None:
        return "-"
    return f"{p['effect_pct']:+.2f}% [{p['ci_low_pct']:+.2f}, {p['ci_high_pct']:+.2f}]"


def text(data: dict[str, Any]) -> str:
    out = []
    for t in data["targets"]:
        out.append(f"Target {t.id} ({t.name}, {t.mode}, claim layer {t.claim_layer})")
        if t.objective:
            out.append(f"  primary {t.objective.primary.name} [{t.objective.primary.unit}] {t.objective.primary.direction}"
                       f" is better; minimum effect {t.objective.min_effect_pct:g}%")
        if t.identity:
            i = t.identity
            dev = ", ".join(f"{d.name} {d.uuid}" for d in i.devices) or "no GPU"
            out.append(f"  environment: image {i.image.id[:19] if i.image else '-'}, {dev}, driver {i.driver_version}, "
                       f"host {i.host.cpu_model}")
        for b in data["baselines"]:
            if b.target.id == t.id:
                out.append(f"  baseline {b.id}: resolution {b.resolution_pct:.2f}%"
                           + (" (MEASURED UNDER LOAD)" if b.measured_under_load else "") + f" — {b.note}")
        for e in data["experiments"]:
            if e.target.id != t.id:
                continue
            named = f" ({', '.join(e.blocking_constraints)})" if e.blocking_constraints else ""
            out.append(f"  {e.stage:6s} {e.id} vs {e.reference.get('kind')}: stage outcome {e.outcome}{named}"
                       + (" (A/A control)" if e.aa_control else ""))
            out.append(f"      supports: {supports(e.stage, e.outcome, e.claim_layer, e.aa_control)['statement']}")
            for c in e.cases:
                v = c.primary.get("verdict")
                out.append(f"      case {c.case}: {_ci(c.primary)} over {c.pairs} pairs -> case verdict {v}"
                           + ("" if v == e.outcome else f" (stage outcome: {e.outcome})"))
            for r in e.reasons:
                out.append(f"      [{r.code}] {r.message}")
    ch = data["champion"]
    for tid, c in ch["champions"].items():
        p = c["pointer"]
        out.append(f"Champion of {tid}: {(p.get('variant') or {}).get('id') or 'the original'} "
                   f"(selection {p['selection']['id']})")
    if not ch["champions"]:
        out.append("Champion: none selected (the originals stand)")
    return "\n".join(out)


# -- HTML -----------------------------------------------------------------------------------

def _svg_pairs(ratios: list[float], lo: float | None, hi: float | None, min_eff: float, title: str) -> str:
    w, h, pad = 520, 180, 34
    vals = [100 * (math.exp(r) - 1) for r in ratios]
    if not vals:
        return ""
    ymin = min(vals + [lo or 0, 0, -min_eff]) - 2
    ymax = max(vals + [hi or 0, min_eff]) + 2

    def y(v: float) -> float:
        return h - pad - (v - ymin) / (ymax - ymin) * (h - 2 * pad)

    def x(i: int) -> float:
        return pad + i * (w - 2 * pad) / max(1, len(vals) - 1)

    parts = [f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg" font-size="11">',
             f'<text x="{pad}" y="14">{html.escape(title)}</text>']
    if lo is not None and hi is not None:
        parts.append(f'<rect x="{pad}" y="{y(hi):.1f}" width="{w - 2 * pad}" height="{max(1, y(lo) - y(hi)):.1f}" '
                     'fill="#9ecae1" opacity="0.5"><title>confidence interval</title></rect>')
    for v, color, label in ((0, "#444", "0%"), (min_eff, "#2ca02c", f"min {min_eff:g}%")):
        parts.append(f'<line x1="{pad}" x2="{w - pad}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="{color}" '
                     f'stroke-dasharray="4 3"/><text x="{w - pad + 2}" y="{y(v) + 4:.1f}">{label}</text>')
    for i, v in enumerate(vals):
        parts.append(f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="3" fill="#d62728"><title>pair {i}: {v:+.2f}%'
                     '</title></circle>')
    parts.append(f'<text x="{pad}" y="{h - 8}">pair effect, % (positive = better)</text></svg>')
    return "".join(parts)


def _svg_strip(groups: dict[str, list[float]], unit: str, title: str) -> str:
    w, h, pad = 520, 40 + 36 * len(groups), 90
    allv = [v for vs in groups.values() for v in vs]
    if not allv:
        return ""
    lo, hi = min(allv), max(allv)
    span = (hi - lo) or 1.0

    def x(v: float) -> float:
        return pad + (v - lo) / span * (w - pad - 20)

    parts = [f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg" font-size="11">',
             f'<text x="10" y="14">{html.escape(title)} ({html.escape(unit)})</text>']
    for gi, (name, vs) in enumerate(groups.items()):
        yy = 36 + gi * 36
        parts.append(f'<text x="10" y="{yy + 4}">{html.escape(name)}</text>')
        for v in vs:
            parts.append(f'<circle cx="{x(v):.1f}" cy="{yy}" r="3" fill="{"#1f77b4" if gi == 0 else "#ff7f0e"}" '
                         f'opacity="0.7"><title>{v:.4g}</title></circle>')
    parts.append(f'<text x="{pad}" y="{h - 4}">{lo:.4g}</text><text x="{w - 60}" y="{h - 4}">{hi:.4g}</text></svg>')
    return "".join(parts)


def _svg_telemetry(series: dict[str, Any]) -> str:
    samples = series.get("samples") or []
    key = "sm_mhz" if any("sm_mhz" in s for s in samples) else "foreign_cores"
    pts = [(s["t"], s[key]) for s in samples if s.get(key) is not None]
    if len(pts) < 2:
        return ""
    w, h, pad = 520, 140, 34
    t0, t1 = pts[0][0], pts[-1][0]
    vmax = max(v for _, v in pts) or 1.0
    path = " ".join(f"{'M' if i == 0 else 'L'}{pad + (t - t0) / max(1e-9, t1 - t0) * (w - 2 * pad):.1f},"
                    f"{h - pad - v / vmax * (h - 2 * pad):.1f}" for i, (t, v) in enumerate(pts))
    label = "SM clock, MHz" if key == "sm_mhz" else "CPU cores used by other processes"
    return (f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg" font-size="11">'
            f'<text x="{pad}" y="14">telemetry: {label} (max {vmax:.3g})</text>'
            f'<path d="{path}" fill="none" stroke="#9467bd"/></svg>')


def html_report(store: Store, data: dict[str, Any]) -> str:
    esc = html.escape
    body = [f"<h1>cko report</h1><p>store <code>{esc(str(store.root))}</code></p>",
            f"<pre>{esc(text(data))}</pre>"]
    for e in data["experiments"]:
        body.append(f"<h2>{esc(e.stage)} {esc(e.id)}: stage outcome {esc(e.outcome)}</h2>")
        body.append("<ul>" + "".join(f"<li><code>{esc(r.code)}</code> {esc(r.message)}</li>" for r in e.reasons)
                    + "</ul>")
        t = next((t for t in data["targets"] if t.id == e.target.id), None)
        min_eff = t.objective.min_effect_pct if t and t.objective else 0.0
        unit = t.objective.primary.unit if t and t.objective else ""
        metric = t.objective.primary.name if t and t.objective else "time"
        for c in e.cases:
            ratios = c.primary.get("pair_log_ratios") or []
            body.append(_svg_pairs(ratios, c.primary.get("ci_low_pct"), c.primary.get("ci_high_pct"), min_eff,
                                   f"{c.case}: {_ci(c.primary)} -> case verdict {c.primary.get('verdict')} "
                                   f"(stage outcome {e.outcome})"))
        if e.samples is not None:
            try:
                dr = json.loads(store.read_object(e.samples.sha256))
                for case in {s["case"] for s in dr["series"]}:
                    groups = {s["subject"]: s["samples"].get(metric, []) for s in dr["series"] if s["case"] == case}
                    body.append(_svg_strip(groups, unit, f"samples, case {case}"))
            except (OSError, ValueError, KeyError):
                body.append("<p>samples unavailable</p>")
        if e.invocation is not None:
            res = load_result(store, e.invocation.id)
            if res is not None and res.telemetry is not None:
                try:
                    body.append(_svg_telemetry(json.loads(store.read_object(res.telemetry.sha256))))
                except (OSError, ValueError):
                    pass
    css = "body{font-family:sans-serif;max-width:980px;margin:2em auto}svg{display:block;margin:8px 0;border:1px solid #ddd}"
    return f"<!doctype html><html><head><meta charset='utf-8'><title>cko report</title><style>{css}</style></head>" \
           f"<body>{''.join(body)}</body></html>"
