"""`cko report`: a readable account of a store — Target, baseline and resolution, every experiment
with its verdict and interval, the champion, the environment — as text, JSON, or HTML with plots
(runner/report_html.py), and the handoff summary (runner/handoff.py)."""

from __future__ import annotations

from typing import Any

from .store import Store
from .workflow.champion import show
from .workflow.experiment import supports
from .workflow.records import Baseline, Experiment, Target, Variant


def gather(store: Store) -> dict[str, Any]:
    targets = [store.get_record("targets", i, Target)[0] for i in store.list_records("targets")]
    baselines = [store.get_record("baselines", i, Baseline)[0] for i in store.list_records("baselines")]
    experiments = [
        store.get_record("experiments", i, Experiment)[0] for i in store.list_records("experiments")
    ]
    from .workflow.termination import terminations

    return {
        "targets": targets,
        "baselines": baselines,
        "experiments": experiments,
        "champion": show(store),
        "variants": {i: store.get_record("variants", i, Variant)[0] for i in store.list_records("variants")},
        "terminations": terminations(store),
    }


def to_json(data: dict[str, Any]) -> dict[str, Any]:
    return {
        "targets": [t.model_dump(mode="json") for t in data["targets"]],
        "baselines": [b.model_dump(mode="json") for b in data["baselines"]],
        "experiments": [e.model_dump(mode="json") for e in data["experiments"]],
        "champion": data["champion"],
        "terminations": [t.model_dump(mode="json") for t in data.get("terminations", [])],
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
            out.append(
                f"  primary {t.objective.primary.name} [{t.objective.primary.unit}] {t.objective.primary.direction}"
                f" is better; minimum effect {t.objective.min_effect_pct:g}%"
            )
        if t.identity:
            i = t.identity
            dev = ", ".join(f"{d.name} {d.uuid}" for d in i.devices) or "no GPU"
            out.append(
                f"  environment: image {i.image.id[:19] if i.image else '-'}, {dev}, driver {i.driver_version}, "
                f"host {i.host.cpu_model}"
            )
        for b in data["baselines"]:
            if b.target.id == t.id:
                out.append(
                    f"  baseline {b.id}: resolution {b.resolution_pct:.2f}%"
                    + (" (MEASURED UNDER LOAD)" if b.measured_under_load else "")
                    + f" — {b.note}"
                )
        for e in data["experiments"]:
            if e.target.id != t.id:
                continue
            named = f" ({', '.join(e.blocking_constraints)})" if e.blocking_constraints else ""
            out.append(
                f"  {e.stage:6s} {e.id} vs {e.reference.get('kind')}: stage outcome {e.outcome}{named}"
                + (" (A/A control)" if e.aa_control else "")
            )
            out.append(
                f"      supports: {supports(e.stage, e.outcome, e.claim_layer, e.aa_control)['statement']}"
            )
            for c in e.cases:
                v = c.primary.get("verdict")
                out.append(
                    f"      case {c.case}: {_ci(c.primary)} over {c.pairs} pairs -> case verdict {v}"
                    + ("" if v == e.outcome else f" (stage outcome: {e.outcome})")
                )
            for r in e.reasons:
                out.append(f"      [{r.code}] {r.message}")
    ch = data["champion"]
    for tid, c in ch["champions"].items():
        p = c["pointer"]
        out.append(
            f"Champion of {tid}: {(p.get('variant') or {}).get('id') or 'the original'} "
            f"(selection {p['selection']['id']})"
        )
    if not ch["champions"]:
        out.append("Champion: none selected (the originals stand)")
    return "\n".join(out)


def html_report(store: Store, data: dict[str, Any]) -> str:
    from .report_html import render

    return render(store, data)
