"""`cko audit`: for CI. Verify every hash and every recorded verdict, then re-run the original
against each Target's champion in the pinned image and answer one of three:

- `holds` (exit 0): every champion is still accepted against its original;
- `does_not_hold` (exit 1): the store fails verification, a pointer dangles, or a re-run decided
  against the champion (regressed, below minimum, inconclusive, a constraint, accuracy);
- `could_not_check` (exit 5): a re-run could not measure (image or environment unavailable, a
  void stage: contamination, unbalanced load, environment mismatch, failed run).
Each check carries a reason code; the JUnit file agrees (failure / error).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal
from xml.etree import ElementTree as ET

from .. import images as img
from ..errors import CkoError, Exit
from ..executor import LOCAL, Executor
from ..imagemove import fetch_into_engine
from ..store import Store
from ..verify import verify_store
from .champion import pointer_problems, pointer_targets, read_pointer
from .common import Progress
from .decide import VOID_OUTCOMES
from .experiment import experiment
from .records import Experiment, Selection, Target
from .requests import ExperimentRequest

Answer = Literal["holds", "does_not_hold", "could_not_check"]
EXIT = {"holds": Exit.DONE, "does_not_hold": Exit.FAILED, "could_not_check": Exit.UNAVAILABLE}
STATUS = {"holds": "ok", "does_not_hold": "failure", "could_not_check": "error"}


def _check(name: str, answer: Answer, code: str, detail: str) -> dict[str, Any]:
    return {
        "name": name,
        "answer": answer,
        "status": STATUS[answer],
        "ok": answer == "holds",
        "code": code,
        "detail": detail,
    }


def overall(checks: list[dict[str, Any]]) -> Answer:
    answers = {c["answer"] for c in checks}
    return (
        "does_not_hold"
        if "does_not_hold" in answers
        else ("could_not_check" if "could_not_check" in answers else "holds")
    )


def audit(
    store: Store,
    progress: Progress,
    pairs: int | None = None,
    seed: int | None = None,
    executor: Executor = LOCAL,
) -> dict[str, Any]:
    rep = verify_store(store)
    ok = rep["ok"]
    checks = [
        _check(
            "store hashes and recorded verdicts",
            "holds" if ok else "does_not_hold",
            "verified" if ok else "store_not_verified",
            f"{rep['checked']['objects']} objects, {rep['checked']['records']} records"
            if ok
            else "; ".join(f"{p['path']}: {p['problem']}" for p in rep["problems"][:10]),
        )
    ]
    doc: dict[str, Any] = {"verify": rep, "checks": checks, "targets": {}}
    if ok:
        for tid in pointer_targets(store):
            checks += _audit_target(store, tid, progress, pairs, seed, executor, doc["targets"])
    answer = overall(checks)
    doc["answer"] = answer
    doc["holds"] = answer == "holds"
    doc["exit_code"] = int(EXIT[answer])
    doc["summary"] = {
        "holds": "every recorded conclusion holds"
        if len(checks) > 1
        else "no champion selected: hashes and verdicts verified, nothing to re-run",
        "does_not_hold": "a recorded conclusion does not hold: "
        + "; ".join(f"{c['name']}: {c['code']}" for c in checks if c["answer"] == "does_not_hold"),
        "could_not_check": "could not check: "
        + "; ".join(f"{c['name']}: {c['code']}" for c in checks if c["answer"] == "could_not_check"),
    }[answer]
    return doc


def _audit_target(
    store: Store,
    tid: str,
    progress: Progress,
    pairs: int | None,
    seed: int | None,
    executor: Executor,
    out: dict[str, Any],
) -> list[dict[str, Any]]:
    problems = pointer_problems(store, tid)
    if problems:
        return [_check(f"champion of {tid}", "does_not_hold", "dangling_champion", "; ".join(problems))]
    ptr, _ = read_pointer(store, tid)
    assert ptr is not None
    if ptr.variant is None:
        return [_check(f"champion of {tid}", "holds", "original", "the champion is the original (restored)")]
    sel = Selection.model_validate_json((store.selection_path(ptr.selection.id)).read_bytes())
    recorded = None
    if sel.experiment is not None:
        recorded, _ = store.get_record(
            "experiments", sel.experiment.id, Experiment, sha256=sel.experiment.sha256
        )
    t, _ = store.get_record("targets", tid, Target, sha256=ptr.target.sha256)
    req = ExperimentRequest(
        target=t.id,
        stage="audit",
        reference="original",
        pairs=pairs or (recorded.plan.get("pairs") if recorded else None),
        seed=seed if seed is not None else ((recorded.plan.get("seed", 0) + 1) if recorded else 1),
    )
    name = f"champion of {tid} ({ptr.variant.id}) against the original"
    try:
        with _targets_image(store, t, executor, progress):
            res, _ = experiment(store, req, progress, executor)
    except CkoError as exc:
        if exc.exit_code in (Exit.UNAVAILABLE, Exit.TIMED_OUT):
            return [_check(name, "could_not_check", exc.code, exc.message)]
        raise
    out[tid] = {"audit_experiment": res, "recorded": recorded.id if recorded else None}
    outcome = res["stage_outcome"]
    codes = ", ".join(res["reason_codes"])
    if outcome == "accepted":
        return [_check(name, "holds", "accepted", _cases(res))]
    answer: Answer = "could_not_check" if outcome in VOID_OUTCOMES else "does_not_hold"
    code = next((r["code"] for r in res["reasons"]), outcome) if answer == "could_not_check" else outcome
    return [
        _check(
            name,
            answer,
            code,
            f"audit {res['experiment']['id']}: {res['stage_outcome_text']}"
            + (f" [{codes}]" if codes else "")
            + "; "
            + _cases(res),
        )
    ]


@contextlib.contextmanager
def _targets_image(store: Store, t: Target, executor: Executor, progress: Progress) -> Iterator[None]:
    """Run in the Target's exact image (not whatever the lock names now): loaded from the store's
    archive, the cache or a registry when the engine lacks it, else could_not_check naming it."""
    image_id = t.identity.image.id if t.identity and t.identity.image else None
    if image_id is None or executor is not LOCAL:  # a fleet node checks its own image (runner/fleet/node.py)
        yield
        return
    client = img.docker_client()
    notes: list[str] = []
    if not img.image_present(client, image_id):
        if not fetch_into_engine(client, image_id, name=t.image, store_root=store.root, notes=notes):
            raise CkoError(
                f"the Target's image {t.image} {image_id} is not in the engine, the store "
                f"({store.root / 'images'}), the cache or a registry"
                + (f" ({'; '.join(notes)})" if notes else "")
                + "; keep it with `cko images save` or set CKO_REGISTRY",
                exit_code=Exit.UNAVAILABLE,
                code="image_missing",
                field="image",
            )
        progress(f"image {t.image} {image_id[:19]}: {notes[-1]}")
    with img.pinned(t.image, image_id):
        yield


def _cases(res: dict[str, Any]) -> str:
    return (
        "; ".join(
            f"case {c['case']}: effect {c['effect_pct']:+.2f}% CI [{c['ci_low_pct']:+.2f}, "
            f"{c['ci_high_pct']:+.2f}] -> {c['case_verdict']}"
            if c.get("effect_pct") is not None
            else f"case {c['case']}: {c['case_verdict']}"
            for c in res["cases"]
        )
        or "no cases measured"
    )


def junit(doc: dict[str, Any]) -> bytes:
    """does_not_hold is a <failure>, could_not_check an <error>: CI tells them apart."""
    checks = doc["checks"]
    suite = ET.Element(
        "testsuite",
        name="cko audit",
        tests=str(len(checks)),
        failures=str(sum(1 for c in checks if c["status"] == "failure")),
        errors=str(sum(1 for c in checks if c["status"] == "error")),
    )
    for c in checks:
        case = ET.SubElement(suite, "testcase", classname="cko.audit", name=c["name"])
        if c["status"] != "ok":
            el = ET.SubElement(case, c["status"], message=f"{c['answer']}: {c['code']}", type=c["code"])
            el.text = c["detail"]
        else:
            ET.SubElement(case, "system-out").text = c["detail"]
    root = ET.Element("testsuites")
    root.append(suite)
    xml: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return xml
