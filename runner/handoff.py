"""`cko report --handoff`: the handoff summary, built from the records only (facts, no advice).

Sections: conclusions (each Target's champion and the stage it rests on), kept changes, rejected
directions, open directions, gain ranges, environment, evidence gaps, and why the work stopped.
Every line names the record it comes from, so a reader can check it with `cko verify`.
"""

from __future__ import annotations

from typing import Any

from .workflow.records import Experiment, Target

REJECTED = frozenset({"rejected", "regressed", "below_minimum", "constraint_violated", "failed_accuracy"})


def _ci(e: Experiment) -> str:
    parts = []
    for c in e.cases:
        p = c.primary
        if p.get("ci_low_pct") is not None:
            parts.append(
                f"{c.case} {p['effect_pct']:+.2f}% [{p['ci_low_pct']:+.2f}, {p['ci_high_pct']:+.2f}]"
            )
    return "; ".join(parts) or "no interval"


def _who(e: Experiment, data: dict[str, Any]) -> str:
    v = data["variants"].get(e.variant.id) if e.variant else None
    key = f", mechanism `{e.mechanism_key}`" if e.mechanism_key else ""
    return f"`{e.variant.id if e.variant else '-'}` ({v.claim if v else 'no claim'}{key})"


def _conclusions(t: Target, exps: list[Experiment], data: dict[str, Any]) -> list[str]:
    champ = data["champion"]["champions"].get(t.id)
    if not champ:
        return [f"- `{t.id}` ({t.name}): no champion selected; the original stands."]
    ptr = champ["pointer"]
    vid = (ptr.get("variant") or {}).get("id")
    formal = [
        e
        for e in exps
        if e.variant and e.variant.id == vid and e.stage == "target" and e.outcome == "accepted"
    ]
    rest = f"; rests on target stage `{formal[0].id}`: {_ci(formal[0])}" if formal else ""
    return [
        f"- `{t.id}` ({t.name}): champion `{vid or 'the original'}` (selection `{ptr['selection']['id']}`){rest}."
    ]


def _gaps(t: Target, exps: list[Experiment], data: dict[str, Any]) -> list[str]:
    gaps = []
    bases = [b for b in data["baselines"] if b.target.id == t.id]
    if not bases:
        gaps.append(f"- `{t.id}`: no baseline, so no A/A resolution on record.")
    for b in bases:
        if not b.min_effect_resolvable:
            gaps.append(
                f"- baseline `{b.id}`: minimum effect {b.min_effect_pct:g}% is not above the A/A resolution "
                f"{b.resolution_pct:.2f}%."
            )
        if b.measured_under_load:
            gaps.append(f"- baseline `{b.id}`: resolution measured under foreign load.")
    for e in exps:
        if e.outcome in ("void", "failed_run", "integrity_violation"):
            gaps.append(f"- {e.stage} `{e.id}`: {e.outcome} ({', '.join(r.code for r in e.reasons)}).")
        missing = [
            n
            for n, v in (
                ("hypothesis", e.hypothesis),
                ("cheapest_falsifier", e.cheapest_falsifier),
                ("estimated_cost", (e.cost or {}).get("estimated")),
            )
            if not v
        ]
        if missing:
            gaps.append(f"- {e.stage} `{e.id}`: no {', '.join(missing)} recorded.")
    if not any(e.stage == "audit" for e in exps) and data["champion"]["champions"].get(t.id):
        gaps.append(f"- `{t.id}`: the champion has no audit stage on record.")
    if not any(e.aa_control for e in exps):
        gaps.append(f"- `{t.id}`: no A/A control experiment on record.")
    return gaps


def _environment(t: Target) -> str:
    i = t.identity
    if i is None:
        return f"- `{t.id}`: no identity recorded."
    devs = ", ".join(f"{d.name} ({d.uuid})" for d in i.devices) or "no GPU"
    img = i.image.id[:19] if i.image else "-"
    return f"- `{t.id}`: image {img}; {devs}; driver {i.driver_version or '-'}; CPU {i.host.cpu_model}."


def handoff(data: dict[str, Any]) -> str:
    sec: dict[str, list[str]] = {
        k: []
        for k in (
            "Conclusions",
            "Kept changes",
            "Rejected directions",
            "Open directions",
            "Gain ranges",
            "Environment",
            "Evidence gaps",
        )
    }
    for t in data["targets"]:
        exps = sorted(
            (e for e in data["experiments"] if e.target.id == t.id), key=lambda e: (e.created_at, e.id)
        )
        sec["Conclusions"] += _conclusions(t, exps, data)
        champ = (data["champion"]["champions"].get(t.id) or {}).get("pointer") or {}
        kept = (champ.get("variant") or {}).get("id")
        for e in exps:
            line = f"- {e.stage} `{e.id}` on {_who(e, data)}: {e.outcome}; {_ci(e)}"
            if e.variant and e.variant.id == kept and e.stage == "target":
                sec["Kept changes"].append(line + (f"; hypothesis: {e.hypothesis}" if e.hypothesis else ""))
            elif e.outcome in REJECTED:
                sec["Rejected directions"].append(
                    line + (f"; hypothesis: {e.hypothesis}" if e.hypothesis else "")
                )
            elif e.outcome in ("promising", "open", "inconclusive", "constraint_inconclusive"):
                sec["Open directions"].append(line)
            if e.stage in ("target", "audit") and e.outcome == "accepted":
                sec["Gain ranges"].append(f"- `{e.id}` ({e.stage}, {e.claim_layer} level): {_ci(e)}")
        sec["Environment"].append(_environment(t))
        sec["Evidence gaps"] += _gaps(t, exps, data)
    out = ["# Handoff (built by cko from the records; facts only)", ""]
    for name, lines in sec.items():
        out += [f"## {name}", *(lines or ["- none"]), ""]
    stops = data.get("terminations", [])
    out += [
        "## Why it stopped",
        *(
            [f"- {s.created_at} `{s.id}`: {s.reason}" + (f" (by {s.by})" if s.by else "") for s in stops]
            or ["- no termination recorded (cko stop --reason)"]
        ),
        "",
    ]
    return "\n".join(out)
