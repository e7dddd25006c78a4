"""`cko champion show|select|restore`: one champion pointer per Target, replaced by compare-and-swap.

The pointer of Target T is champion/T.json (the only mutable files in a store). A pointer whose
target, selection or variant is missing or altered is dangling: an error everywhere (show, select,
audit, verify), never read as "no champion".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..canonical import canonical_bytes, sha256_bytes, sha256_file
from ..errors import CkoError, Exit, bad_request, failed
from ..models import Ref
from ..store import ID_RE, Store, check_id, new_id, write_replace
from .common import get_target, now
from .recheck import recompute
from .records import ChampionPointer, Experiment, Selection, StageEntry, Target, Variant
from .verdicts import Reason


def pointer_path(store: Store, tid: str) -> Path:
    return store.pointer_path(check_id(tid, "target"))


def pointer_targets(store: Store) -> list[str]:
    return sorted(p.stem for p in store.pointers_dir.glob("*.json") if ID_RE.match(p.stem))


def _load_pointer(store: Store, tid: str) -> ChampionPointer | None:
    p = pointer_path(store, tid)
    if not p.is_file():
        return None
    try:
        return ChampionPointer.model_validate_json(p.read_bytes())
    except ValidationError as exc:
        raise failed(
            f"champion pointer of {tid} is not a valid pointer: {exc.errors()[0]['msg']}",
            code="dangling_champion",
            field="champion",
        ) from None


def _same(store: Store, path: Path, ref: Ref, what: str) -> str | None:
    if not path.is_file():
        return f"its {what} {ref.id} is missing"
    if sha256_file(path) != ref.sha256:
        return f"its {what} {ref.id} was altered (sha256 differs from the pointer's)"
    return None


def pointer_problems(store: Store, tid: str) -> list[str]:
    """Every way the pointer of `tid` fails to resolve to the records it names."""
    try:
        ptr = _load_pointer(store, tid)
    except CkoError as exc:
        return [exc.message]
    if ptr is None:
        return []
    out = [] if ptr.target.id == tid else [f"it names target {ptr.target.id}, not {tid}"]
    checks = [
        (store.record_path("targets", ptr.target.id), ptr.target, "target"),
        (store.selection_path(ptr.selection.id), ptr.selection, "selection"),
    ]
    if ptr.variant is not None:
        checks.append((store.record_path("variants", ptr.variant.id), ptr.variant, "variant"))
    out += [m for path, ref, what in checks if (m := _same(store, path, ref, what))]
    if out:
        return out
    if ptr.variant is not None:
        v = Variant.model_validate_json((store.record_path("variants", ptr.variant.id)).read_bytes())
        if v.snapshot.sha256 != ptr.snapshot:
            out.append(f"its snapshot {ptr.snapshot[:16]} is not its variant's")
    else:
        t = Target.model_validate_json((store.record_path("targets", ptr.target.id)).read_bytes())
        if t.original is None or t.original.sha256 != ptr.snapshot:
            out.append(f"its snapshot {ptr.snapshot[:16]} is not the original's")
    return out


def read_pointer(store: Store, tid: str) -> tuple[ChampionPointer | None, str | None]:
    """(the pointer of `tid`, its digest), or (None, None); a dangling pointer is exit 1."""
    problems = pointer_problems(store, tid)
    if problems:
        raise failed(
            f"the champion pointer of target {tid} is dangling: " + "; ".join(problems),
            code="dangling_champion",
            field="champion",
        )
    ptr = _load_pointer(store, tid)
    return (ptr, sha256_file(pointer_path(store, tid))) if ptr else (None, None)


def swap(store: Store, tid: str, expected: str | None, ptr: ChampionPointer) -> None:
    """Compare-and-swap on the pointer's digest; the caller holds the store's writer lock."""
    p = pointer_path(store, tid)
    current = sha256_file(p) if p.is_file() else None
    if current != expected:
        raise CkoError(
            f"the champion of {tid} changed since it was read (expected {expected}, found {current})",
            exit_code=Exit.FAILED,
            code="champion_conflict",
            field="champion",
        )
    write_replace(p, canonical_bytes(ptr))


def _commit_selection(store: Store, sel: Selection, expected: str | None) -> dict[str, Any]:
    data = canonical_bytes(sel)
    store.commit_file(store.selection_path(sel.id), data)
    ptr = ChampionPointer(
        target=sel.target,
        selection=Ref(id=sel.id, sha256=sha256_bytes(data)),
        variant=sel.variant,
        snapshot=sel.snapshot,
    )
    swap(store, sel.target.id, expected, ptr)
    return {
        "selection": {"id": sel.id, "sha256": sha256_bytes(data)},
        "champion": ptr.model_dump(mode="json"),
        "target": sel.target.id,
    }


def _ledger_problem(store: Store, kind: str, rid: str) -> str | None:
    rel = f"{kind}/{rid}.json"
    entries = [x for x in store.ledger() if x.get("path") == rel]
    if not entries:
        return f"{rel} is not in the store's ledger (written outside cko)"
    if entries[-1].get("sha256") != sha256_file(store.at(rel)):
        return f"{rel} does not match its ledger entry (edited after it was written)"
    return None


def boundary_of(store: Store, e: Experiment) -> str:
    """How the stage's subjects were measured: "workers" (the trust boundary) or "harness_trusted"
    (records without the field predate the boundary: every subject shared the harness's process)."""
    if e.samples is None:
        return "harness_trusted"
    try:
        return str(json.loads(store.read_object(e.samples.sha256)).get("boundary", "harness_trusted"))
    except (OSError, ValueError):
        return "harness_trusted"


def _evidence_problems(store: Store, e: Experiment, t: Target) -> list[Reason]:
    """Why `e` cannot make its candidate the champion (empty: it can)."""
    from .experiment import formal_target, stages_of

    out: list[Reason] = []
    if e.stage != "target":
        out.append(
            Reason(
                code="not_target_stage",
                message=f"experiment {e.id} is a {e.stage} stage; only a target stage can be chosen",
            )
        )
    _, diffs = recompute(store, e)
    out += [
        Reason(code="verdict_mismatch", message=f"the stored samples do not give the recorded verdict: {x}")
        for x in diffs
    ]
    if (lp := _ledger_problem(store, "experiments", e.id)) is not None:
        out.append(Reason(code="altered_record", message=lp))
    formal = formal_target(stages_of(store, t.id, e.reference.get("snapshot", ""), e.candidate_snapshot))
    if e.stage == "target" and formal is not None and formal[0].id != e.id:
        out.append(
            Reason(
                code="not_formal_stage",
                message=f"target stage {formal[0].id} ({formal[0].outcome}) is the "
                "formal one for this candidate and reference; later attempts do not count",
            )
        )
    if e.outcome != "accepted":
        code = e.outcome if e.outcome.startswith("constraint_") else "not_accepted"
        named = f" ({', '.join(e.blocking_constraints)})" if e.blocking_constraints else ""
        out.append(Reason(code=code, message=f"its stage outcome is {e.outcome}{named}, not accepted"))
    if not e.accuracy or any(not a.get("passed") for subj in e.accuracy.values() for a in subj.values()):
        out.append(
            Reason(
                code="accuracy_not_passed",
                message="its accuracy gate did not pass for every subject and case",
            )
        )
    if e.aa_control:
        out.append(
            Reason(
                code="aa_control", message="it is an A/A control (the candidate is its reference by content)"
            )
        )
    if boundary_of(store, e) == "harness_trusted":
        out.append(
            Reason(
                code="harness_trusted",
                message="its candidate shared the harness's process (a hand-written "
                "driver): nothing kept it from steering the verdict; select with --allow-harness-trusted "
                "to take it anyway (recorded)",
            )
        )
    if e.variant is None:
        out.append(Reason(code="no_variant", message="it names no variant"))
    return out


def _reference_problems(store: Store, e: Experiment, t: Target, current: str | None) -> list[Reason]:
    kind = e.reference.get("kind")
    if kind == "champion" and e.reference.get("champion_pointer_sha256") != current:
        return [
            Reason(
                code="champion_changed",
                message="the champion changed since this experiment measured against it (re-measure)",
            )
        ]
    ptr, _ = read_pointer(store, t.id)
    if kind == "original" and ptr is not None and ptr.snapshot != (t.original.sha256 if t.original else None):
        return [
            Reason(
                code="champion_already_selected",
                message="a champion is already selected: the new "
                "candidate must beat it (run the experiment with reference champion)",
            )
        ]
    return []


def select(
    store: Store, experiment_id: str, reason: str, allow_harness_trusted: bool = False
) -> tuple[dict[str, Any], int]:
    from .experiment import stages_of, supports

    check_id(experiment_id, "experiment")
    e, eref_d = store.get_record("experiments", experiment_id, Experiment)
    t, tref = store.get_record("targets", e.target.id, Target, sha256=e.target.sha256)
    missing = _evidence_problems(store, e, t)
    if allow_harness_trusted and any(m.code == "harness_trusted" for m in missing):
        missing = [m for m in missing if m.code != "harness_trusted"]
        reason = f"harness-trusted evidence taken by the caller's choice: {reason}"
    with store.writer():
        _, current = read_pointer(store, t.id)
        missing += _reference_problems(store, e, t, current)
        if missing:
            raise CkoError(
                "cannot select: " + "; ".join(m.message for m in missing),
                exit_code=Exit.FAILED,
                code=missing[0].code,
                field="experiment",
                detail={"missing": [m.model_dump() for m in missing]},
            )
        assert e.variant is not None
        v, vref = store.get_record("variants", e.variant.id, Variant, sha256=e.variant.sha256)
        stages = [
            StageEntry(experiment=r, stage=x.stage, outcome=x.outcome, created_at=x.created_at)
            for x, r in stages_of(store, t.id, e.reference.get("snapshot", ""), e.candidate_snapshot)
        ]
        sel = Selection(
            id=new_id("sel"),
            target=Ref(**tref),
            action="select",
            experiment=Ref(**eref_d),
            variant=Ref(**vref),
            snapshot=v.snapshot.sha256,
            previous_pointer_sha256=current,
            created_at=now(),
            reason=reason,
            stages=stages,
            claim_layer=e.claim_layer,
            evidence="target_stage",
        )
        doc = _commit_selection(store, sel, current)
    doc["stages"] = [s.model_dump() for s in stages]
    doc["supports"] = supports(e.stage, e.outcome, e.claim_layer, e.aa_control)
    return doc, 0


def _rejecting_audit(store: Store, audit_id: str, t: Target, snapshot: str) -> Ref:
    from .decide import VOID_OUTCOMES

    check_id(audit_id, "audit")
    a, aref = store.get_record("experiments", audit_id, Experiment)
    why = []
    if a.stage != "audit" or a.target.id != t.id or a.candidate_snapshot != snapshot:
        why.append(f"experiment {a.id} is not an audit of this target's current champion")
    elif a.outcome == "accepted" or a.outcome in VOID_OUTCOMES:
        why.append(f"audit {a.id} ended {a.outcome}: it does not reject the champion")
    why += recompute(store, a)[1]
    if why:
        raise CkoError(
            "cannot restore: " + "; ".join(why),
            exit_code=Exit.FAILED,
            code="audit_does_not_reject",
            field="audit",
        )
    return Ref(**aref)


def restore(
    store: Store, target_id: str | None, reason: str | None, audit_id: str | None = None
) -> tuple[dict[str, Any], int]:
    """Point the champion back at the original: on a rejecting audit, or an explicit operator reason."""
    t, tref = get_target(store, target_id)
    assert t.original
    if not audit_id and not (reason and reason.strip()):
        raise bad_request(
            "reason: restoring needs evidence: --audit EXPERIMENT (an audit that did not hold) or "
            "--reason TEXT (recorded as the operator's reason, not as measured evidence)",
            field="reason",
            code="restore_needs_evidence",
        )
    with store.writer():
        ptr, current = read_pointer(store, t.id)
        if ptr is None or ptr.variant is None:
            raise bad_request(f"target: {t.id} has no champion variant to restore from", field="target")
        aref = _rejecting_audit(store, audit_id, t, ptr.snapshot) if audit_id else None
        sel = Selection(
            id=new_id("sel"),
            target=tref,
            action="restore",
            snapshot=t.original.sha256,
            previous_pointer_sha256=current,
            created_at=now(),
            reason=reason or f"audit {audit_id} did not hold",
            audit=aref,
            evidence="rejecting_audit" if aref else "operator_reason",
        )
        doc = _commit_selection(store, sel, current)
    doc["evidence"] = sel.evidence
    return doc, 0


def show(store: Store, target_id: str | None = None) -> dict[str, Any]:
    """Every Target's champion (or one), and the history of selections; a dangling pointer is exit 1."""
    tids = [check_id(target_id, "target")] if target_id else pointer_targets(store)
    champions = {}
    for tid in tids:
        ptr, digest = read_pointer(store, tid)
        if ptr is not None:
            champions[tid] = {"pointer": ptr.model_dump(mode="json"), "pointer_sha256": digest}
    history = []
    for f in sorted(store.selections_dir.glob("*.json")):
        s = Selection.model_validate_json(f.read_bytes())
        if target_id and s.target.id != target_id:
            continue
        history.append(
            {
                "id": s.id,
                "target": s.target.id,
                "action": s.action,
                "created_at": s.created_at,
                "experiment": s.experiment.id if s.experiment else None,
                "variant": s.variant.id if s.variant else None,
                "snapshot": s.snapshot,
                "reason": s.reason,
                "evidence": s.evidence,
                "claim_layer": s.claim_layer,
                "stages": [
                    {"experiment": x.experiment.id, "stage": x.stage, "outcome": x.outcome} for x in s.stages
                ],
            }
        )
    one = champions[tids[0]]["pointer"] if len(tids) == 1 and tids[0] in champions else None
    return {"champions": champions, "champion": one, "history": history}
