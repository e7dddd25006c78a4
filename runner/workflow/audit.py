"""`cko audit`: for CI. Verify every hash, then re-run the original against the champion in the
pinned image and say whether the recorded conclusion still holds."""

from __future__ import annotations

from typing import Any
from xml.etree import ElementTree as ET

from ..executor import LOCAL, Executor
from ..store import Store
from ..verify import verify_store
from . import ops
from .records import ChampionPointer, Experiment, Selection, Target
from .requests import ExperimentRequest


def audit(store: Store, progress: ops.Progress, pairs: int | None = None, seed: int | None = None,
          executor: Executor = LOCAL) -> dict[str, Any]:
    checks: list[dict[str, Any]] = []
    rep = verify_store(store)
    checks.append({"name": "store hashes", "ok": rep["ok"],
                   "detail": f"{rep['checked']['objects']} objects, {rep['checked']['records']} records"
                   if rep["ok"] else "; ".join(f"{p['path']}: {p['problem']}" for p in rep["problems"][:10])})
    doc: dict[str, Any] = {"verify": rep, "checks": checks}
    if not rep["ok"]:
        doc["holds"] = False
        doc["summary"] = "the store failed verification: nothing can be trusted, nothing was re-run"
        return doc
    if not store.champion_path.is_file():
        doc["holds"] = True
        doc["summary"] = "no champion selected: hashes verified, nothing to re-run"
        return doc
    ptr = ChampionPointer.model_validate_json(store.champion_path.read_bytes())
    sel = _selection(store, ptr.selection.id, ptr.selection.sha256)
    t, _ = store.get_record("targets", ptr.target.id, Target, sha256=ptr.target.sha256)
    if sel.action == "restore" or ptr.variant is None:
        doc["holds"] = True
        doc["summary"] = "the champion is the original (restored): hashes verified, nothing to re-run"
        return doc
    recorded = None
    if sel.experiment is not None:
        recorded, _ = store.get_record("experiments", sel.experiment.id, Experiment, sha256=sel.experiment.sha256)
    req = ExperimentRequest(target=t.id, stage="audit", reference="original",
                            pairs=pairs or (recorded.plan.get("pairs") if recorded else None),
                            seed=seed if seed is not None else ((recorded.plan.get("seed", 0) + 1) if recorded else 1))
    res, code = ops.experiment(store, req, progress, executor)
    doc["audit_experiment"] = res
    acc_ok = code == 0 and res["outcome"] not in ("failed_accuracy", "integrity_violation", "failed_run")
    checks.append({"name": "accuracy and integrity of the champion", "ok": acc_ok,
                   "detail": "; ".join(res["reasons"])[:500] or res["outcome"]})
    holds = acc_ok and res["primary_verdict"] == "accepted"
    rec_v = recorded.primary_verdict if recorded else "unknown"
    for c in res["cases"]:
        checks.append({"name": f"case {c['case']}: {rec_v} still holds", "ok": c["verdict"] == "accepted",
                       "detail": f"effect {c['effect_pct']:+.2f}% CI [{c['ci_low_pct']:+.2f}, {c['ci_high_pct']:+.2f}] "
                                 f"-> {c['verdict']}" if c.get("effect_pct") is not None else str(c["verdict"])})
    doc["recorded"] = {"experiment": sel.experiment.model_dump() if sel.experiment else None, "verdict": rec_v,
                       "cases": [{"case": c.case, "effect_pct": c.primary.get("effect_pct"),
                                  "ci_low_pct": c.primary.get("ci_low_pct"), "ci_high_pct": c.primary.get("ci_high_pct")}
                                 for c in (recorded.cases if recorded else [])]}
    doc["holds"] = holds
    doc["summary"] = ("the recorded conclusion holds: the champion is still accepted against the original"
                      if holds else f"the recorded conclusion does not hold: audit verdict {res['primary_verdict']}")
    return doc


def _selection(store: Store, sid: str, sha: str) -> Selection:
    from ..canonical import sha256_bytes
    from ..errors import failed

    p = store.root / "champion" / "selections" / f"{sid}.json"
    if not p.is_file():
        raise failed(f"selection {sid} is missing", code="missing_record")
    data = p.read_bytes()
    if sha256_bytes(data) != sha:
        raise failed(f"selection {sid} was altered", code="altered_record")
    return Selection.model_validate_json(data)


def junit(doc: dict[str, Any]) -> bytes:
    checks = doc["checks"]
    suite = ET.Element("testsuite", name="cko audit", tests=str(len(checks)),
                       failures=str(sum(1 for c in checks if not c["ok"])))
    for c in checks:
        case = ET.SubElement(suite, "testcase", classname="cko.audit", name=c["name"])
        if not c["ok"]:
            f = ET.SubElement(case, "failure", message=c["detail"][:200])
            f.text = c["detail"]
        else:
            ET.SubElement(case, "system-out").text = c["detail"]
    root = ET.Element("testsuites")
    root.append(suite)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)
