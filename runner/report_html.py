"""The HTML report: one self-contained page (inline SVG from matplotlib, inline CSS, no script, no network).

Why matplotlib rather than hand-written SVG: axes, ticks, units, legends and label placement are
what the hand-written plots got wrong (overlapping "0%" and minimum-effect labels, no axes, colours
swapping between cases); matplotlib is well kept, renders offline to SVG with text as paths (no
font needed by the viewer), and its legend and tick machinery solve exactly those problems.

Colours are fixed per subject for the whole page (reference blue, candidate orange, A/A grey), bands
are labelled in legends (minimum effect, confidence interval, A/A resolution, foreign-load ceiling),
and every title keeps the stage outcome apart from the case verdict.
"""

from __future__ import annotations

import html
import io
import json
import math
from typing import Any

from .invocation import load_result
from .report import text
from .store import Store
from .workflow.experiment import supports
from .workflow.records import Baseline, Experiment, Target

COLOURS = {
    "reference": "#1f77b4",
    "candidate": "#ff7f0e",
    "original": "#1f77b4",
    "aa-ref": "#7f7f7f",
    "aa-cand": "#bcbd22",
}
CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}th,td{border:1px solid #ccc;padding:3px 7px;
text-align:left;vertical-align:top}th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
.accepted{color:#1a7f37;font-weight:600}.regressed,.constraint_violated,.rejected{color:#b42318;font-weight:600}
.void,.failed_run,.failed_accuracy,.integrity_violation{color:#8a2be2;font-weight:600}
code{background:#f5f5f5;padding:0 3px;word-break:break-all}pre{white-space:pre-wrap;overflow-wrap:anywhere;
background:#fafafa;border:1px solid #eee;padding:.6em;font-size:12px}figure{margin:.5em 0}svg{max-width:100%;
height:auto}.muted{color:#666}"""


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "cko", "font.size": 9, "axes.grid": True, "grid.alpha": 0.3})
    return plt


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    _plt().close(fig)
    out = buf.getvalue()
    return out[out.index("<svg") :]


def _pct(v: float | None, sign: bool = True) -> str:
    return "-" if v is None else (f"{v:+.2f}" if sign else f"{v:.2f}")


def _cls(v: Any) -> str:
    return html.escape(str(v))


def pairs_figure(e: Experiment, min_eff: float) -> str:
    """Per case: each pair's effect (%) by pair index, the CI and the minimum effect as labelled bands."""
    plt = _plt()
    cases = [c for c in e.cases if c.primary.get("pair_log_ratios")]
    if not cases:
        return ""
    fig, axes = plt.subplots(1, len(cases), figsize=(4.2 * len(cases), 3.0), squeeze=False)
    for ax, c in zip(axes[0], cases, strict=True):
        vals = [100 * (math.exp(r) - 1) for r in c.primary["pair_log_ratios"]]
        ax.axhspan(
            -min_eff, min_eff, color="#d9d9d9", alpha=0.6, label=f"within ±{min_eff:g}% (minimum effect)"
        )
        lo, hi = c.primary.get("ci_low_pct"), c.primary.get("ci_high_pct")
        if lo is not None and hi is not None:
            ax.axhspan(lo, hi, color=COLOURS["candidate"], alpha=0.25, label=f"CI [{lo:+.2f}, {hi:+.2f}]%")
        ax.axhline(0, color="#444", lw=0.8)
        ax.plot(range(1, len(vals) + 1), vals, "o", ms=3.5, color=COLOURS["candidate"], label="pair effect")
        ax.set_xlabel("pair")
        ax.set_ylabel("effect, % (positive = candidate better)")
        ax.set_title(f"case {c.case}: case verdict {c.primary.get('verdict')}", fontsize=9)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"{e.stage} {e.id} — stage outcome {e.outcome}", fontsize=10, y=1.05)
    return _svg(fig)


def samples_figure(groups: dict[str, dict[str, list[float]]], unit: str, metric: str, title: str) -> str:
    """Per case, the samples of each subject (one colour per subject across the page) with medians."""
    plt = _plt()
    cases = [k for k, g in groups.items() if any(g.values())]
    if not cases:
        return ""
    fig, axes = plt.subplots(1, len(cases), figsize=(4.2 * len(cases), 2.6), squeeze=False)
    for ax, case in zip(axes[0], cases, strict=True):
        for i, (subject, vs) in enumerate(sorted(groups[case].items())):
            if not vs:
                continue
            ax.plot(
                vs, [i] * len(vs), "|", ms=12, color=COLOURS.get(subject, "#555"), alpha=0.7, label=subject
            )
            med = sorted(vs)[len(vs) // 2]
            ax.plot([med], [i], "D", ms=6, color="black")
        ax.set_yticks(range(len(groups[case])), sorted(groups[case]))
        ax.set_ylim(-0.7, len(groups[case]) - 0.3)
        ax.set_xlabel(f"{metric} [{unit}]")
        ax.set_title(f"case {case} (◆ median)", fontsize=9)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(title, fontsize=10, y=1.06)
    return _svg(fig)


def telemetry_figure(series: dict[str, Any], ceiling_cores: float | None, title: str) -> str:
    """Foreign CPU cores (or SM clock) over the window, with the ceiling that would void the verdict."""
    samples = series.get("samples") or []
    key = "foreign_cores" if any(s.get("foreign_cores") is not None for s in samples) else "sm_mhz"
    pts = [(s["t"], s[key]) for s in samples if s.get(key) is not None and s.get("t") is not None]
    if len(pts) < 2:
        return ""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 2.4))
    t0 = pts[0][0]
    ax.plot(
        [t - t0 for t, _ in pts],
        [v for _, v in pts],
        color="#9467bd",
        lw=1.2,
        label="CPU cores used by other processes" if key == "foreign_cores" else "SM clock",
    )
    if key == "foreign_cores" and ceiling_cores is not None:
        ax.axhline(
            ceiling_cores,
            color="#b42318",
            ls="--",
            lw=1,
            label=f"foreign-load ceiling ({ceiling_cores:.3g} cores)",
        )
    ax.set_xlabel("time since start [s]")
    ax.set_ylabel("cores" if key == "foreign_cores" else "MHz")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="best")
    return _svg(fig)


def resolution_figure(b: Baseline) -> str:
    """The A/A resolution of each case against the minimum effect: can this environment confirm it?"""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(3.5, 1.4 * len(b.cases) + 2), 2.6))
    names = [c.case for c in b.cases]
    ax.bar(names, [c.resolution_pct for c in b.cases], color=COLOURS["aa-ref"], label="A/A resolution")
    ax.axhline(
        b.min_effect_pct, color="#1a7f37", ls="--", lw=1.2, label=f"minimum effect {b.min_effect_pct:g}%"
    )
    ax.set_ylabel("% (smallest effect resolvable)")
    ax.set_xlabel("case")
    ax.set_title(
        f"baseline {b.id}: resolution" + (" (measured under load)" if b.measured_under_load else ""),
        fontsize=9,
    )
    ax.legend(fontsize=7, loc="best")
    return _svg(fig)


def _ratio(direction: str, ref: float | None, cand: float | None) -> str:
    from .ci import ratio

    r = ratio(direction, ref, cand)
    return "-" if r is None else f"{r:.3f}×"


def summary_table(data: dict[str, Any]) -> str:
    """One row per experiment case: absolute medians, ratio, gain, CI, verdicts and coded reasons."""
    targets = {t.id: t for t in data["targets"]}
    rows = []
    for e in data["experiments"]:
        t = targets.get(e.target.id)
        unit = t.objective.primary.unit if t and t.objective else ""
        direction = t.objective.primary.direction if t and t.objective else "lower"
        v = data.get("variants", {}).get(e.variant.id) if e.variant else None
        for c in e.cases or [None]:
            p = c.primary if c else {}
            ci = (
                f"[{_pct(p.get('ci_low_pct'))}, {_pct(p.get('ci_high_pct'))}]"
                if p.get("ci_low_pct") is not None
                else "-"
            )
            rows.append(
                f"<tr><td><code>{_cls(e.id)}</code><br>{_cls(e.stage)}</td>"
                f"<td><code>{_cls(e.variant.id if e.variant else '-')}</code><br><span class='muted'>"
                f"{_cls(v.claim if v else '')}</span></td><td>{_cls(e.mechanism_key or '-')}</td>"
                f"<td>{_cls(c.case if c else '-')}</td>"
                f"<td class='num'>{_fmt(c.reference_median if c else None)} {_cls(unit)}</td>"
                f"<td class='num'>{_fmt(c.candidate_median if c else None)} {_cls(unit)}</td>"
                f"<td class='num'>{_ratio(direction, c.reference_median, c.candidate_median) if c else '-'}</td>"
                f"<td class='num'>{_pct(p.get('effect_pct'))}</td><td class='num'>{ci}</td>"
                f"<td class='{_cls(p.get('verdict'))}'>{_cls(p.get('verdict') or '-')}</td>"
                f"<td class='{_cls(e.outcome)}'>{_cls(e.outcome)}</td>"
                f"<td>{', '.join(f'<code>{_cls(r.code)}</code>' for r in e.reasons) or '-'}</td></tr>"
            )
    head = (
        "<tr><th>experiment</th><th>candidate, claim</th><th>mechanism</th><th>case</th><th>reference median</th>"
        "<th>candidate median</th><th>ratio</th><th>gain %</th><th>CI %</th><th>case verdict</th>"
        "<th>stage outcome</th><th>reasons</th></tr>"
    )
    return f"<h2>Summary</h2><table>{head}{''.join(rows)}</table>" if rows else "<p>No experiment yet.</p>"


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def target_section(store: Store, t: Target, data: dict[str, Any]) -> str:
    obj = t.objective
    out = [f"<h2>Target <code>{_cls(t.id)}</code> — {_cls(t.name)}</h2><table>"]
    rows = [("mode / claim layer", f"{t.mode} / {t.claim_layer}")]
    if obj:
        rows += [
            ("primary metric", f"{obj.primary.name} [{obj.primary.unit}], {obj.primary.direction} is better"),
            ("minimum effect", f"{obj.min_effect_pct:g}%"),
            (
                "constraints",
                ", ".join(f"{c.metric.name} ≤ {c.max_regression_pct:g}% regression" for c in obj.constraints)
                or "none",
            ),
        ]
    if t.identity:
        i = t.identity
        rows += [
            (
                "environment",
                f"image {i.image.id[:19] if i.image else '-'}; "
                + (", ".join(f"{d.name} {d.uuid}" for d in i.devices) or "no GPU")
                + f"; driver {i.driver_version or '-'}; host {i.host.cpu_model}",
            )
        ]
    out += [f"<tr><th>{_cls(k)}</th><td>{_cls(v)}</td></tr>" for k, v in rows] + ["</table>"]
    for b in data["baselines"]:
        if b.target.id == t.id:
            out.append(baseline_section(b, obj.primary.unit if obj else "", obj.primary.name if obj else ""))
    out.append(history_section(t, data))
    return "".join(out)


def baseline_section(b: Baseline, unit: str, metric: str) -> str:
    groups = {c.case: {"original": c.samples} for c in b.cases}
    return (
        f"<h3>Baseline <code>{_cls(b.id)}</code></h3><p>{_cls(b.note)}</p>"
        f"<figure>{resolution_figure(b)}</figure>"
        f"<figure>{samples_figure(groups, unit, metric, f'baseline {b.id}: samples of the original')}</figure>"
    )


def history_section(t: Target, data: dict[str, Any]) -> str:
    """Each candidate's stages in order, with why it ran (hypothesis, falsifier) and what it cost."""
    by_variant: dict[str, list[Experiment]] = {}
    for e in data["experiments"]:
        if e.target.id == t.id:
            by_variant.setdefault(e.variant.id if e.variant else "(champion audit)", []).append(e)
    if not by_variant:
        return ""
    out = [
        "<h3>Candidates and their stages</h3><table><tr><th>candidate</th><th>claim</th><th>stages (oldest "
        "first)</th><th>hypothesis / cheapest falsifier</th><th>cost (estimated → actual)</th></tr>"
    ]
    for vid, exps in by_variant.items():
        v = data.get("variants", {}).get(vid)
        stages = "<br>".join(
            f"{_cls(e.created_at)} {_cls(e.stage)} <code>{_cls(e.id)}</code>: "
            f"<span class='{_cls(e.outcome)}'>{_cls(e.outcome)}</span>"
            for e in sorted(exps, key=lambda x: (x.created_at, x.id))
        )
        why = "<br>".join(
            _cls(
                f"{e.stage}: {e.hypothesis or '(no hypothesis)'}; falsifier: "
                f"{json.dumps(e.cheapest_falsifier) if e.cheapest_falsifier else '(none given)'}"
            )
            for e in exps
        )
        cost = "<br>".join(_cls(_cost_text(e)) for e in exps)
        out.append(
            f"<tr><td><code>{_cls(vid)}</code></td><td>{_cls(v.claim if v else '-')}</td><td>{stages}</td>"
            f"<td>{why}</td><td>{cost}</td></tr>"
        )
    return "".join(out) + "</table>"


def _cost_text(e: Experiment) -> str:
    c = e.cost or {}
    est, act = c.get("estimated"), c.get("actual") or {}
    left = f"p50 {est['p50_s']:g} s / p90 {est['p90_s']:g} s" if est else "no estimate"
    return f"{e.stage}: {left} → {act.get('seconds', '-')} s ({c.get('vs_estimate', '-')})"


def experiment_section(store: Store, e: Experiment, t: Target | None) -> str:
    min_eff = t.objective.min_effect_pct if t and t.objective else 0.0
    unit = t.objective.primary.unit if t and t.objective else ""
    metric = t.objective.primary.name if t and t.objective else "time"
    sup = supports(e.stage, e.outcome, e.claim_layer, e.aa_control)["statement"]
    out = [
        f"<h3>{_cls(e.stage)} <code>{_cls(e.id)}</code>: stage outcome <span class='{_cls(e.outcome)}'>"
        f"{_cls(e.outcome)}</span></h3><p>candidate <code>{_cls(e.variant.id if e.variant else '-')}</code> vs "
        f"{_cls(e.reference.get('kind'))}; supports: {_cls(sup)}"
        + (f"; claims: {_cls('; '.join(e.claims))}" if e.claims else "")
        + "</p><ul>"
    ]
    out += [f"<li><code>{_cls(r.code)}</code> {_cls(r.message)}</li>" for r in e.reasons]
    out.append("</ul>")
    out.append(f"<figure>{pairs_figure(e, min_eff)}</figure>")
    if e.samples is not None:
        try:
            dr = json.loads(store.read_object(e.samples.sha256))
            groups: dict[str, dict[str, list[float]]] = {}
            for s in dr["series"]:
                groups.setdefault(s["case"], {})[s["subject"]] = s["samples"].get(metric, [])
            out.append(
                f"<figure>{samples_figure(groups, unit, metric, f'{e.stage} {e.id}: samples')}</figure>"
            )
        except (OSError, ValueError, KeyError):
            out.append("<p class='muted'>samples unavailable</p>")
    out.append(_telemetry(store, e))
    return "".join(out)


def _telemetry(store: Store, e: Experiment) -> str:
    if e.invocation is None:
        return ""
    res = load_result(store, e.invocation.id)
    if res is None or res.telemetry is None:
        return ""
    ceiling = None
    if e.decision_plan is not None and e.load_input is not None and e.load_input.host_cpus:
        ceiling = e.decision_plan.ceiling.max_foreign_cpu_share * e.load_input.host_cpus
    try:
        series = json.loads(store.read_object(res.telemetry.sha256))
    except (OSError, ValueError):
        return ""
    return f"<figure>{telemetry_figure(series, ceiling, f'{e.stage} {e.id}: foreign load during the window')}</figure>"


def render(store: Store, data: dict[str, Any]) -> str:
    targets = {t.id: t for t in data["targets"]}
    body = [
        f"<h1>cko report</h1><p class='muted'>store <code>{_cls(store.root)}</code>; every figure and number "
        "below is read from the store's records.</p>",
        summary_table(data),
    ]
    for t in data["targets"]:
        body.append(target_section(store, t, data))
    body.append("<h2>Experiments</h2>")
    for e in data["experiments"]:
        body.append(experiment_section(store, e, targets.get(e.target.id)))
    for term in data.get("terminations", []):
        body.append(
            f"<h2>Stopped</h2><p>{_cls(term.created_at)} <code>{_cls(term.id)}</code>: {_cls(term.reason)}"
            + (f" (by {_cls(term.by)})" if term.by else "")
            + "</p>"
        )
    body.append(f"<h2>Text summary</h2><pre>{_cls(text(data))}</pre>")
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>cko report</title>"
        f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>"
    )
