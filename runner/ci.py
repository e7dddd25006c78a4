"""CI exports of one experiment stage: hyperfine-style JSON and Markdown, JUnit, and --fail-on.

Rows carry absolute medians of both subjects in the primary metric's unit, the ratio (x, > 1 is
better whatever the direction), the gain % (the median per-pair effect, positive = better), its
interval and the case verdict. `--fail-on` is opt-in: without it the exit code stays the CLI's
(0 whatever the verdict).
"""

from __future__ import annotations

from typing import Any
from xml.etree import ElementTree as ET

from .errors import bad_request

FAIL_ON_VALUES = frozenset(
    {
        "regressed",
        "inconclusive",
        "below_minimum",
        "void",
        "constraint_violated",
        "constraint_inconclusive",
        "failed_run",
        "failed_accuracy",
        "integrity_violation",
        "rejected",
        "open",
        "promising",
    }
)


def parse_fail_on(text: str | None) -> list[str]:
    if not text:
        return []
    vals = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in vals if v not in FAIL_ON_VALUES]
    if bad:
        raise bad_request(
            f"fail_on: unknown outcome {', '.join(bad)}; known: {', '.join(sorted(FAIL_ON_VALUES))}",
            field="fail_on",
        )
    return vals


def fail_on_matches(doc: dict[str, Any], wanted: list[str]) -> list[str]:
    """The outcomes asked for that the stage outcome or a case verdict shows."""
    seen = {doc["stage_outcome"]} | {c["case_verdict"] for c in doc["cases"] if c.get("case_verdict")}
    return [w for w in wanted if w in seen]


def ratio(direction: str, ref: float | None, cand: float | None) -> float | None:
    if not ref or not cand:
        return None
    return ref / cand if direction == "lower" else cand / ref


def rows(doc: dict[str, Any], unit: str, direction: str) -> list[dict[str, Any]]:
    out = []
    for c in doc["cases"]:
        out.append(
            {
                "case": c["case"],
                "pairs": c["pairs"],
                "unit": unit,
                "direction": direction,
                "reference_median": c.get("reference_median"),
                "candidate_median": c.get("candidate_median"),
                "ratio": ratio(direction, c.get("reference_median"), c.get("candidate_median")),
                "gain_pct": c.get("effect_pct"),
                "ci_low_pct": c.get("ci_low_pct"),
                "ci_high_pct": c.get("ci_high_pct"),
                "case_verdict": c.get("case_verdict"),
            }
        )
    return out


def export_json(doc: dict[str, Any], unit: str, direction: str) -> dict[str, Any]:
    return {
        "experiment": doc["experiment"],
        "stage": doc["stage"],
        "stage_outcome": doc["stage_outcome"],
        "reason_codes": doc["reason_codes"],
        "results": rows(doc, unit, direction),
        "cost": doc.get("cost"),
    }


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def export_markdown(doc: dict[str, Any], unit: str, direction: str) -> str:
    lines = [
        f"### {doc['stage']} {doc['experiment']['id']}: stage outcome `{doc['stage_outcome']}`",
        "",
        f"| case | reference median [{unit}] | candidate median [{unit}] | ratio (x) | gain % | CI % | "
        "case verdict |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for r in rows(doc, unit, direction):
        ci = f"[{r['ci_low_pct']:+.2f}, {r['ci_high_pct']:+.2f}]" if r["ci_low_pct"] is not None else "-"
        lines.append(
            f"| {r['case']} | {_f(r['reference_median'], '.4g')} | {_f(r['candidate_median'], '.4g')} | "
            f"{_f(r['ratio'], '.3f')} | {_f(r['gain_pct'], '+.2f')} | {ci} | {r['case_verdict']} |"
        )
    lines += ["", "Reasons: " + (", ".join(f"`{c}`" for c in doc["reason_codes"]) or "none"), ""]
    return "\n".join(lines)


def junit(doc: dict[str, Any], fail_on: list[str]) -> bytes:
    """One test case per case; time = the stage's wall time shared by pairs. A case verdict in
    --fail-on (default: regressed) is a failure; a stage that decided nothing is an error."""
    wanted = set(fail_on or ["regressed"])
    seconds = ((doc.get("cost") or {}).get("actual") or {}).get("seconds") or 0.0
    total = sum(c["pairs"] for c in doc["cases"]) or 1
    undecided = doc["stage_outcome"] in ("failed_run", "failed_accuracy", "integrity_violation", "void")
    suite = ET.Element(
        "testsuite",
        name=f"cko {doc['stage']} {doc['experiment']['id']}",
        tests=str(len(doc["cases"]) or 1),
        time=f"{seconds:.3f}",
    )
    failures = errors = 0
    for c in doc["cases"] or [{"case": "stage", "pairs": 0, "case_verdict": doc["stage_outcome"]}]:
        tc = ET.SubElement(
            suite,
            "testcase",
            classname=f"cko.{doc['stage']}",
            name=str(c["case"]),
            time=f"{seconds * c['pairs'] / total:.3f}",
        )
        msg = f"case verdict {c.get('case_verdict')} (stage outcome {doc['stage_outcome']})"
        if undecided:
            errors += 1
            ET.SubElement(tc, "error", message=msg, type=doc["stage_outcome"]).text = "; ".join(
                doc["reason_codes"]
            )
        elif c.get("case_verdict") in wanted or doc["stage_outcome"] in wanted:
            failures += 1
            ET.SubElement(tc, "failure", message=msg, type=str(c.get("case_verdict")))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    xml: bytes = ET.tostring(suite, encoding="utf-8", xml_declaration=True)
    return xml
