"""`cko stop --reason`: why an optimisation stopped, as an immutable record in the ledger.

The record names what stood at that moment (each Target's champion pointer digest and its last
experiment), so the handoff can say what the work ended on without anyone's memory.
"""

from __future__ import annotations

from typing import Any, Literal

from ..canonical import canonical_bytes
from ..models import Closed, Ref
from ..store import Store, check_id, new_id
from .common import now
from .records import Experiment, Target

KIND_DIR = "terminations"


class TargetState(Closed):
    target: Ref
    champion_pointer_sha256: str | None = None
    champion_variant: str | None = None
    last_experiment: Ref | None = None
    experiments: int = 0


class Termination(Closed):
    kind: Literal["cko/termination-v1"] = "cko/termination-v1"
    id: str
    created_at: str
    reason: str
    by: str | None = None
    scope: Literal["target", "store"]
    targets: list[TargetState]


def _state(store: Store, tid: str) -> TargetState:
    from .champion import read_pointer

    _, tref = store.get_record("targets", tid, Target)
    ptr, digest = read_pointer(store, tid)
    exps = []
    for eid in store.list_records("experiments"):
        e, r = store.get_record("experiments", eid, Experiment)
        if e.target.id == tid:
            exps.append((e.created_at, e.id, r))
    last = Ref(**sorted(exps)[-1][2]) if exps else None
    return TargetState(
        target=Ref(**tref),
        champion_pointer_sha256=digest,
        champion_variant=ptr.variant.id if ptr and ptr.variant else None,
        last_experiment=last,
        experiments=len(exps),
    )


def record_stop(store: Store, reason: str, target: str | None, by: str | None) -> dict[str, Any]:
    if target:
        check_id(target, "target")
    tids = [target] if target else store.list_records("targets")
    states = [_state(store, t) for t in tids]
    rid = new_id("stp")
    rec = Termination(
        id=rid, created_at=now(), reason=reason, by=by, scope="target" if target else "store", targets=states
    )
    with store.writer():
        digest = store.commit_file(store.kind_dir(KIND_DIR) / f"{rid}.json", canonical_bytes(rec))
    return {
        "termination": {"id": rid, "sha256": digest},
        "target": target,
        "reason": reason,
        "targets": [s.model_dump(mode="json") for s in states],
    }


def terminations(store: Store) -> list[Termination]:
    d = store.kind_dir(KIND_DIR)
    out = []
    for p in sorted(d.glob("*.json")) if d.is_dir() else []:
        out.append(Termination.model_validate_json(p.read_bytes()))
    return sorted(out, key=lambda t: (t.created_at, t.id))
