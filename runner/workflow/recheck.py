"""Recompute a recorded verdict from the stored samples and the frozen plan (select, verify).

A record whose verdict the stored samples do not give (an experiment record edited by hand, or a
plan that differs from its Target's) is refused, naming what differs.
"""

from __future__ import annotations

from typing import Any

from cko_perf.operations.protocol import DriverResult

from ..errors import CkoError
from ..store import Store
from .decide import decide
from .records import Experiment, Target
from .snapshot import content_key
from .verdicts import Decision, Telemetry


def recompute(store: Store, e: Experiment) -> tuple[Decision | None, list[str]]:
    """(the decision the stored inputs give, every way the record disagrees with it)."""
    if e.decision_plan is None:
        return None, ["recorded without its decision inputs: the verdict cannot be recomputed"]
    try:
        t, _ = store.get_record("targets", e.target.id, Target, sha256=e.target.sha256)
        samples = (
            DriverResult.model_validate(store.read_json_object(e.samples.sha256))
            if e.samples is not None
            else None
        )
        aa = content_key(store, e.reference["snapshot"]) == content_key(store, e.candidate_snapshot)
    except (CkoError, ValueError, KeyError) as exc:
        return None, [f"its inputs cannot be read: {getattr(exc, 'message', exc)}"]
    p = e.decision_plan
    diffs = []
    if p.objective != t.objective or p.stats != t.plan:
        diffs.append("its plan differs from its Target's objective or statistics plan")
    if p.stage != e.stage or p.aa_control != aa or e.aa_control != aa:
        diffs.append("its stage or A/A flag differs from what its snapshots say")
    d = decide(samples, p, e.load_input or Telemetry(), e.failure)
    diffs += disagreements(e, d)
    return d, diffs


def disagreements(e: Experiment, d: Decision) -> list[str]:
    out = []
    pairs: list[tuple[str, Any, Any]] = [
        ("stage outcome", e.outcome, d.stage_outcome),
        ("primary verdict", e.primary_verdict, d.primary_verdict),
        ("constraint verdicts", e.constraint_verdicts, d.constraint_verdicts),
        ("blocking constraints", e.blocking_constraints, d.blocking_constraints),
        ("reason codes", [r.code for r in e.reasons], d.codes),
        (
            "case verdicts",
            [c.primary.get("verdict") for c in e.cases],
            [c.primary.get("verdict") for c in d.cases],
        ),
        (
            "case intervals",
            [(c.primary.get("ci_low_pct"), c.primary.get("ci_high_pct")) for c in e.cases],
            [(c.primary.get("ci_low_pct"), c.primary.get("ci_high_pct")) for c in d.cases],
        ),
    ]
    for what, recorded, again in pairs:
        if recorded != again:
            out.append(f"{what}: recorded {recorded!r}, the stored samples give {again!r}")
    return out


def recheck_store(store: Store) -> list[dict[str, str]]:
    """verify's semantic pass: every experiment's verdict recomputed; every champion pointer resolved."""
    from .champion import pointer_problems, pointer_targets

    problems = []
    for eid in store.list_records("experiments"):
        rel = f"experiments/{eid}.json"
        try:
            e, _ = store.get_record("experiments", eid, Experiment)
        except CkoError as exc:
            problems.append({"path": rel, "problem": exc.message})
            continue
        if e.decision_plan is None:
            continue  # recorded before verdicts were recomputable: hashes only (verify_store)
        _, diffs = recompute(store, e)
        problems += [{"path": rel, "problem": f"verdict_mismatch: {x}"} for x in diffs]
    problems += _recheck_stack_audits(store)
    for tid in pointer_targets(store):
        problems += [
            {"path": f"champion/{tid}.json", "problem": f"dangling_champion: {x}"}
            for x in pointer_problems(store, tid)
        ]
    return problems


def _recheck_stack_audits(store: Store) -> list[dict[str, str]]:
    from .stackaudit import recheck
    from .stackrecord import StackAudit

    problems = []
    for sid in store.list_records("stackaudits"):
        rel = f"stackaudits/{sid}.json"
        try:
            rec, _ = store.get_record("stackaudits", sid, StackAudit)
        except CkoError as exc:
            problems.append({"path": rel, "problem": exc.message})
            continue
        problems += [{"path": rel, "problem": f"verdict_mismatch: {x}"} for x in recheck(store, rec)]
    return problems
