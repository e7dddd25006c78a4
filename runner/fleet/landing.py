"""The controller's side of one fleet invocation in its own store: what it writes, and when.

The controller that submitted an invocation stays the one writer of its store: it writes
request.json as soon as the node announces it (`announce`), imports events.jsonl, result.json and
the objects they name once every hash checks out (`land`), and alone records the terminal state
when a node or worker is lost, after a cleanup task on that node confirms the container is gone
(or says why it cannot).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from .. import images as img
from .. import policy as pol
from ..canonical import canonical_bytes, sha256_bytes, sha256_file
from ..errors import CkoError, Exit, failed
from ..invocation import Events, Outcome, Plan, check_plan, claim, inv_dir, now_iso, refuse
from ..records import InvocationResult
from ..store import Store, check_id, write_new, write_replace
from .node import node_cleanup, object_refs
from .placement import Placement
from .wire import Blobs, CleanupReport, Done, NodeInfo, Ship, StartCall, Started, Wanted, plan_to_wire

CLEANUP_TASK_TIMEOUT_S = 60.0


@dataclass
class FleetRun:
    """One invocation submitted to the fleet: where it ran and how it ended."""

    plan: Plan
    placement: Placement
    node: NodeInfo | None = None
    outcome: Outcome | None = None
    error: CkoError | None = None

    @property
    def id(self) -> str | None:
        if self.outcome is not None:
            return self.outcome.id
        return self.error.detail.get("invocation") if self.error is not None else None

    @property
    def exit_code(self) -> int:
        if self.error is not None:
            return int(self.error.exit_code)
        assert self.outcome is not None
        return self.outcome.exit_code

    def as_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "id": self.id,
            "label": self.plan.label,
            "placement": self.placement.describe(),
            "node": self.node.model_dump() if self.node else None,
            "exit_code": self.exit_code,
        }
        if self.outcome is not None:
            r = self.outcome.result
            doc.update(
                {
                    "state": r.state,
                    "reason": r.reason,
                    "started_at": r.started_at,
                    "ended_at": r.ended_at,
                    "outputs": [o.model_dump(mode="json") for o in r.outputs],
                }
            )
        if self.error is not None:
            doc["error"] = self.error.to_json()
        return doc


@dataclass
class Submission:
    """The controller's state of one invocation while it is on the fleet (one pending actor call)."""

    index: int
    plan: Plan
    placement: Placement
    fleet: str  # the cluster's address, for the Outcome's `where`
    actor: Any = None
    ref: Any = None  # the one pending call on the actor
    phase: str = "start"  # start, finish, objects, close
    todo: list[Wanted] = field(default_factory=list)  # objects still to fetch
    queue_deadline: float = 0.0
    run_deadline: float | None = None
    inv_id: str | None = None
    request: bytes | None = None
    node: NodeInfo | None = None
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    done: Done | None = None
    lost: str | None = None
    timed_out: bool = False
    result: FleetRun | None = None

    @property
    def label(self) -> str:
        return self.plan.label or self.plan.op

    def deadline(self) -> float:
        return self.run_deadline if self.run_deadline is not None else self.queue_deadline

    def where(self) -> dict[str, Any]:
        node = self.node
        return {
            "fleet": self.fleet,
            "node_id": node.node_id if node else None,
            "hostname": node.hostname if node else None,
        }

    def run(self, outcome: Outcome | None = None, error: CkoError | None = None) -> FleetRun:
        return FleetRun(self.plan, self.placement, node=self.node, outcome=outcome, error=error)


def prepare(store: Store, plan: Plan, ship: Ship, devices: list[str]) -> tuple[StartCall, Blobs]:
    """The controller's checks (refusals recorded here, as locally) and what travels to the node."""
    policy, policy_path = pol.load_policy(plan.policy_path)
    local = dataclasses.replace(
        plan, mounts=[dataclasses.replace(m) for m in plan.mounts if ship == "auto" and m.read_only]
    )
    try:
        check_plan(local, policy)  # shipped mounts exist here and are checked here; the others on the node
    except CkoError as err:
        if err.exit_code == Exit.REFUSED:
            res = refuse(store, plan, err)
            err.detail = {"invocation": res.id}
        raise
    wire, blobs = plan_to_wire(plan, ship)
    entry = img.load_lock().images.get(plan.image)
    call = StartCall(
        plan=wire,
        devices=devices,
        policy=Path(policy_path).read_bytes() if policy_path else None,
        pin=entry.image_id if entry else None,
    )
    return call, blobs


def announce(store: Store, s: Submission, msg: Started) -> None:
    """The node wrote request.json: claim the invocation here and write the same request."""
    inv_id = check_id(msg.id, "invocation")
    d = inv_dir(store, inv_id)
    if d.exists():
        raise failed(f"invocation {inv_id} already exists in {store.root}", code="fleet_duplicate")
    s.stack.enter_context(claim(store, inv_id, timeout=5))
    write_new(d / "request.json", msg.request)
    s.inv_id, s.request, s.node = inv_id, msg.request, msg.node
    Events(d / "events.jsonl")("fleet_started", {"node": s.node.model_dump()})


def settle(store: Store, s: Submission, keep_outputs: bool, say: Callable[[str], None]) -> None:
    """The submission's end, whatever it was: its records landed or its loss recorded, in s.result."""
    try:
        if s.done is not None:
            s.node = s.node or s.done.node
            if s.inv_id is None and s.done.request is not None and s.done.id is not None:
                announce(store, s, Started(id=s.done.id, request=s.done.request, node=s.done.node))
            s.result = land(store, s, keep_outputs)
        elif s.inv_id is not None:
            s.result = record_lost(store, s)
        else:
            err = CkoError(
                f"{s.label}: {s.lost}",
                exit_code=Exit.TIMED_OUT if s.timed_out else Exit.UNAVAILABLE,
                code="fleet_queue_timeout" if s.timed_out else "fleet_lost",
                field="fleet",
            )
            s.result = s.run(error=err)
    except CkoError as err:
        s.result = s.run(error=err)
    finally:
        s.stack.close()
    r = s.result
    say(f"{s.label}: {r.id or '-'} {r.outcome.result.state if r.outcome else 'error'}")


def land(store: Store, s: Submission, keep_outputs: bool) -> FleetRun:
    """Import the node's terminal records into the store, once every hash of them checks out."""
    assert s.done is not None
    done = s.done
    error = done.error.error() if done.error else None
    if s.inv_id is None:  # nothing was recorded on the node: nothing to import
        assert error is not None
        return s.run(error=error)
    d = inv_dir(store, s.inv_id)
    problems = check_bundle(store, s, done)
    if problems:
        return record_terminal(
            store,
            s,
            "failed",
            Exit.FAILED,
            "fleet import refused: " + "; ".join(problems[:5]),
            {"container_removed": None},
            event="fleet_import_refused",
        )
    assert done.result is not None
    with store.writer():
        if done.events is not None:
            write_replace(d / "events.jsonl", done.events)
        store.commit_file(d / "result.json", done.result)
    res = InvocationResult.model_validate_json(done.result)
    if error is not None:
        error.detail = {"invocation": s.inv_id}
        return s.run(error=error)
    out_dir = materialise_outputs(store, res) if keep_outputs else None
    return s.run(
        outcome=Outcome(id=s.inv_id, result=res, out_dir=out_dir, meta=done.meta or {}, where=s.where())
    )


def check_bundle(store: Store, s: Submission, done: Done) -> list[str]:
    """Every hash of the node's record checks out before the controller commits it."""
    problems: list[str] = []
    if done.result is None or done.request is None:
        return ["the node sent no result.json"]
    if done.request != s.request:
        problems.append("request.json differs from the one the node announced")
    try:
        res = InvocationResult.model_validate_json(done.result)
    except (ValidationError, ValueError) as exc:
        return [f"result.json is not a valid invocation result: {str(exc).splitlines()[0]}"]
    if res.id != s.inv_id:
        problems.append(f"result.json names {res.id}, not {s.inv_id}")
    if res.request_sha256 != sha256_bytes(done.request):
        problems.append("result.json's request_sha256 does not match request.json")
    if res.events_sha256 is not None and (
        done.events is None or res.events_sha256 != sha256_bytes(done.events)
    ):
        problems.append("result.json's events_sha256 does not match events.jsonl")
    for ref in object_refs(res):
        p = store.object_path(ref.sha256)
        if not p.is_file():
            problems.append(f"object {ref.name or ref.sha256[:16]} did not arrive")
        elif p.stat().st_size != ref.size:
            problems.append(f"object {ref.name or ref.sha256[:16]}: size {p.stat().st_size} != {ref.size}")
    return problems


def materialise_outputs(store: Store, res: InvocationResult) -> Path:
    out = store.scratch(res.id) / "out"
    out.mkdir(parents=True)
    for ref in res.outputs:
        rel = Path(ref.name or ref.sha256)
        if rel.is_absolute() or ".." in rel.parts:
            continue
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(store.read_object(ref.sha256))
    return out


def record_lost(store: Store, s: Submission) -> FleetRun:
    """The worker is gone mid-run: make sure its container is gone too, record the terminal state."""
    assert s.inv_id is not None
    cleanup = cleanup_on_node(s)
    if s.timed_out:
        return record_terminal(
            store, s, "timed_out", Exit.TIMED_OUT, str(s.lost), cleanup, event="fleet_timeout"
        )
    return record_terminal(
        store, s, "abandoned", Exit.FAILED, f"the fleet worker was lost: {s.lost}", cleanup, event="abandoned"
    )


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0][:300]


def cleanup_on_node(s: Submission) -> dict[str, Any]:
    """A cleanup task on the lost invocation's node: its report, or why there is none."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if s.node is None or s.inv_id is None:
        return {"container_removed": None, "reason": "the node is unknown"}
    node = s.node.model_dump()
    ref = (
        ray.remote(node_cleanup)
        .options(
            num_cpus=0,
            max_retries=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(s.node.node_id, soft=False),
        )
        .remote(s.inv_id)
    )
    ready, _ = ray.wait([ref], timeout=CLEANUP_TASK_TIMEOUT_S)
    if not ready:
        ray.cancel(ref, force=True)
        return {
            "container_removed": None,
            "node": node,
            "reason": f"the node did not answer a cleanup task within {CLEANUP_TASK_TIMEOUT_S:g}s "
            "(its watchdog removes the container if the machine is up)",
        }
    try:
        return CleanupReport.model_validate(ray.get(ref)).model_dump()
    except (ray.exceptions.RayError, ValidationError) as exc:
        return {
            "container_removed": None,
            "node": node,
            "reason": f"cleanup task failed: {_first_line(exc)} (the node may be gone; "
            "its watchdog removes the container if the machine is up)",
        }


def record_terminal(
    store: Store,
    s: Submission,
    state: Literal["failed", "timed_out", "abandoned"],
    code: Exit,
    reason: str,
    cleanup: dict[str, Any],
    event: str,
) -> FleetRun:
    """The controller's own terminal record of an invocation the node could not end (or sent wrong)."""
    assert s.inv_id is not None
    d = inv_dir(store, s.inv_id)
    Events(d / "events.jsonl")(event, {"reason": reason, "cleanup": cleanup})
    try:
        op = str(json.loads(d.joinpath("request.json").read_bytes()).get("op", s.plan.op))
    except (OSError, ValueError):
        op = s.plan.op
    res = InvocationResult(
        id=s.inv_id,
        op=op,
        state=state,
        exit_code=int(code),
        reason=reason,
        ended_at=now_iso(),
        cleanup=cleanup,
        request_sha256=sha256_file(d / "request.json"),
        events_sha256=sha256_file(d / "events.jsonl"),
    )
    with store.writer():
        store.commit_file(d / "result.json", canonical_bytes(res))
    return s.run(outcome=Outcome(id=s.inv_id, result=res, out_dir=None, meta={}, where=s.where()))
