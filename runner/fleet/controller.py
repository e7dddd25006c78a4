"""The fleet's controller: a connection to a Ray cluster, its status, and invocations driven on it.

Ray does the placing and the resource accounting; cko adds nothing of a scheduler. One invocation
is one Ray actor (`node.NodeRunner`), placed by `placement.Placement`; the controller makes its
calls in order (start, finish, read_objects in batches, close: `wire.py`), one pending call per
invocation, many invocations at once, each bounded by a deadline: a queue deadline until it
starts, then the Plan's timeout plus a margin, then a transfer bound. What the controller writes
to its store, and when, is `landing.py`. An actor rather than a streaming task because Ray Client
(ray://) cannot stream.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from ..canonical import sha256_bytes
from ..errors import CkoError, bad_request, unavailable
from ..executor import LOCAL, Executor
from ..invocation import Plan, reap_orphans
from ..store import Store
from .executor import FleetExecutor
from .landing import FleetRun, Submission, announce, prepare, settle
from .node import NodeRunner, node_probe
from .placement import Placement, placement_for
from .wire import START_REPLY, Done, NodeProbe, ObjectBatch, ReadObjects, Ship, Started

NAMESPACE = "cko"
START_MARGIN_S = 120.0  # image resolution, reaping, collection: on top of the Plan's own bounds
QUEUE_TIMEOUT_S = 600.0  # waiting for a node that has the resources
TRANSFER_TIMEOUT_S = 600.0  # fetching one invocation's records and objects from its node
TRANSFER_BATCH_BYTES = 64 << 20
Say = Callable[[str], None]


def _check_reachable(address: str) -> None:
    """Fail fast on an address nobody listens at (ray.init would retry for minutes)."""
    if address == "auto":
        return
    hostport = address.removeprefix("ray://").rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise bad_request(f"--fleet: {address!r} is not host:port, ray://host:port or auto", field="fleet")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as exc:
        raise unavailable(
            f"no Ray cluster answers at {address}: {exc.strerror or exc}",
            code="fleet_unreachable",
            field="fleet",
        ) from None


@contextlib.contextmanager
def cli_session(address: str | None) -> Iterator[Fleet]:
    """A Fleet for a command whose stdout carries one JSON document.

    Ray's driver prints notices (a worker died, ...) on stdout from a thread of its own; while
    connected, stdout points at stderr, and Ray is shut down (that thread joined) before the
    command prints its document.
    """
    with contextlib.redirect_stdout(sys.stderr):
        fl = Fleet.connect(address)
        try:
            yield fl
        finally:
            fl.close()


@contextlib.contextmanager
def open_executor(fleet: str | None, gpu_model: str | None = None) -> Iterator[Executor]:
    """The executor a command's --fleet/--gpu-model ask for, connected for the whole command.

    Without --fleet, this host (`executor.LOCAL`), and Ray is never imported. One FleetExecutor
    per command: it is sticky, so every invocation of one experiment (its sequential looks) runs
    on the node, and the GPUs, of its first.
    """
    if gpu_model and not fleet:
        raise bad_request("--gpu-model: only with --fleet", field="gpu_model")
    if not fleet:
        yield LOCAL
        return
    with cli_session(fleet) as fl:
        yield fl.executor(gpu_model=gpu_model)


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:300]


def _kill(actor: Any) -> None:
    import ray

    if actor is not None:
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)


def _margin(plan: Plan) -> float:
    return plan.lock_timeout_s + plan.stop_grace_s + plan.cleanup_timeout_s + START_MARGIN_S


def _public_resources(res: Mapping[str, float]) -> dict[str, float]:
    """Ray's resources without its internal per-node and memory entries."""
    return {
        k: float(v)
        for k, v in sorted(res.items())
        if not k.startswith("node:") and k not in ("memory", "object_store_memory")
    }


def _ray_init(address: str) -> None:
    import ray

    # Ray Client's proxy starts a server process per client; on a busy head that start can miss
    # its deadline ("Initialization failure from server") though the cluster is fine: try again.
    attempts = 3 if address.startswith("ray://") else 1
    for attempt in range(1, attempts + 1):
        try:
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.ERROR)
            return
        except (ConnectionError, RuntimeError, ValueError) as exc:
            if attempt < attempts and "Initialization failure" in str(exc):
                with contextlib.suppress(Exception):  # whatever the failed attempt left behind
                    ray.shutdown()
                time.sleep(2.0 * attempt)
                continue
            raise unavailable(
                f"no Ray cluster answers at {address}: {_first_line(exc)}",
                code="fleet_unreachable",
                field="fleet",
            ) from None


# -- status ---------------------------------------------------------------------------------


def _nodes() -> list[dict[str, Any]]:
    """Every node Ray knows, alive or not, with its public resources (total and available)."""
    import ray

    avail: dict[str, dict[str, float]] = {}
    with contextlib.suppress(Exception):
        from ray._private.state import available_resources_per_node

        avail = available_resources_per_node()
    return [
        {
            "node_id": n["NodeID"],
            "alive": bool(n["Alive"]),
            "address": n.get("NodeManagerAddress"),
            "hostname": n.get("NodeManagerHostname"),
            "resources": _public_resources(n.get("Resources") or {}),
            "available": _public_resources(avail.get(n["NodeID"], {})) if n["Alive"] else {},
        }
        for n in ray.nodes()
    ]


def _probe(nodes: list[dict[str, Any]], timeout_s: float) -> None:
    """Run the readiness probe on every live node at once; each node's answer goes in its "cko"."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    fn = ray.remote(node_probe)
    refs = {
        n["node_id"]: fn.options(
            num_cpus=0,
            max_retries=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["node_id"], soft=False),
        ).remote()
        for n in nodes
        if n["alive"]
    }
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    ready_set = set(ready)
    for n in nodes:
        ref = refs.get(n["node_id"])
        if ref is None:
            n["cko"] = {"ready": False, "blockers": ["node is not alive"]}
        elif ref not in ready_set:
            ray.cancel(ref, force=True)
            n["cko"] = {"ready": False, "blockers": [f"probe did not answer within {timeout_s:g}s"]}
        else:
            try:
                n["cko"] = NodeProbe.model_validate(ray.get(ref)).model_dump(exclude_unset=True)
            except (ray.exceptions.RayError, ValidationError) as exc:
                n["cko"] = {"ready": False, "blockers": [f"probe failed: {_first_line(exc)}"]}


# -- the Fleet ------------------------------------------------------------------------------


class Fleet:
    """A connection to a Ray cluster that runs cko invocations. `address`: host:port, ray://..., auto."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._connect()

    @classmethod
    def connect(cls, address: str | None) -> Fleet:
        addr = address or os.environ.get("CKO_FLEET") or os.environ.get("RAY_ADDRESS") or "auto"
        return cls(addr)

    def _connect(self) -> None:
        try:
            import ray
        except ImportError:
            raise unavailable(
                "the fleet backend needs Ray: install the optional ray extra of cko (Ray 2.9 or later)",
                code="ray_missing",
                field="fleet",
            ) from None
        if ray.is_initialized():
            return
        _check_reachable(self.address)
        _ray_init(self.address)

    def close(self) -> None:
        """Disconnect from the cluster (stops Ray's driver threads)."""
        import ray

        if ray.is_initialized():
            ray.shutdown()

    def status(self, probe: bool = True, timeout_s: float = 60.0) -> dict[str, Any]:
        """The cluster's nodes and resources; with probe, each live node's readiness for cko."""
        import ray

        nodes = _nodes()
        if probe:
            _probe(nodes, timeout_s)
        return {
            "address": self.address,
            "ray_version": ray.__version__,
            "nodes": nodes,
            "totals": _public_resources(ray.cluster_resources()),
        }

    def executor(
        self,
        placement: Placement | None = None,
        ship: Ship = "auto",
        sticky: bool = True,
        gpu_model: str | None = None,
    ) -> FleetExecutor:
        """A drop-in for `invocation.execute(store, plan, progress=, keep_outputs=)` that runs on the fleet.

        placement: the same for every Plan; by default each Plan's own (`placement_for`, with
        gpu_model). sticky: see FleetExecutor.
        """
        return FleetExecutor(self, placement=placement, ship=ship, sticky=sticky, gpu_model=gpu_model)

    def run_many(
        self,
        store: Store,
        items: Sequence[Plan | tuple[Plan, Placement]],
        progress: Say | None = None,
        keep_outputs: bool = False,
        ship: Ship = "auto",
        queue_timeout_s: float = QUEUE_TIMEOUT_S,
    ) -> list[FleetRun]:
        """Run several invocations at once (Ray places them); import each into `store` as it ends."""
        say = progress or (lambda _m: None)
        reap_orphans(store)
        subs = [
            Submission(i, plan, placement, self.address)
            for i, (plan, placement) in enumerate(
                item if isinstance(item, tuple) else (item, placement_for(item)) for item in items
            )
        ]
        driver = _Driver(store, keep_outputs, say, queue_timeout_s)
        try:
            for s in subs:
                driver.submit(s, ship)
            driver.wait_all()
        finally:
            for s in subs:
                driver.abandon(s)
        return [s.result for s in subs if s.result is not None]


# -- driving the actors ---------------------------------------------------------------------


class _Driver:
    """The actors of one run_many: each one's pending call, deadline and next call, until all end."""

    def __init__(self, store: Store, keep_outputs: bool, say: Say, queue_timeout_s: float) -> None:
        import ray

        self.store, self.keep_outputs, self.say = store, keep_outputs, say
        self.queue_timeout_s = queue_timeout_s
        self.pending: dict[str, Submission] = {}  # by the hex of its pending call's ref
        self.runner = ray.remote(NodeRunner)

    def submit(self, s: Submission, ship: Ship) -> None:
        """Check the Plan here, start its actor and its start call (or record why it cannot start)."""
        import ray

        try:
            opts = s.placement.ray_options()
            call, blobs = prepare(self.store, s.plan, ship, list(s.placement.devices))
        except CkoError as err:
            s.result = s.run(error=err)
            return
        s.actor = self.runner.options(**opts).remote()
        s.ref = s.actor.start.remote(call.model_dump(), ray.put(blobs))
        s.queue_deadline = time.monotonic() + self.queue_timeout_s
        self.pending[s.ref.hex()] = s
        self.say(f"{s.label}: submitted to the fleet ({s.placement.describe()})")

    def wait_all(self) -> None:
        import ray

        while self.pending:
            self._expire()
            if not self.pending:
                break
            wait_s = max(0.0, min(s.deadline() for s in self.pending.values()) - time.monotonic())
            refs = [s.ref for s in self.pending.values()]
            ready, _ = ray.wait(refs, num_returns=1, timeout=min(wait_s, 5.0))
            for ref in ready:
                s = self.pending.pop(ref.hex())
                if self._step(s, ref):
                    settle(self.store, s, self.keep_outputs, self.say)
                else:
                    self.pending[s.ref.hex()] = s

    def _expire(self) -> None:
        """Kill the actors past their deadline and record why, by the phase each was in."""
        now = time.monotonic()
        for s in [s for s in self.pending.values() if s.deadline() <= now]:
            del self.pending[s.ref.hex()]
            _kill(s.actor)
            s.timed_out = True
            s.lost = {
                "start": f"no node had the resources within {self.queue_timeout_s:g}s; cancelled",
                "finish": "it ran past the plan's timeout plus the fleet margin; its actor was killed",
            }.get(s.phase, f"fetching its records took more than {TRANSFER_TIMEOUT_S:g}s")
            settle(self.store, s, self.keep_outputs, self.say)

    def abandon(self, s: Submission) -> None:
        """After the run (or an interruption): stop what still runs and record it as lost."""
        if s.result is None:
            _kill(s.actor)
            s.lost = s.lost or "the controller stopped waiting for it"
            with contextlib.suppress(Exception):
                settle(self.store, s, self.keep_outputs, self.say)
        s.stack.close()

    def _lose(self, s: Submission, why: str) -> bool:
        s.lost = why
        _kill(s.actor)
        return True

    def _step(self, s: Submission, ref: Any) -> bool:
        """Take the answer of the actor's pending call, make the next; True when nothing more comes."""
        import ray

        try:
            msg = ray.get(ref)
        except ray.exceptions.RayError as exc:
            return self._lose(s, f"the fleet lost its worker: {type(exc).__name__}: {_first_line(exc)}")
        try:
            if s.phase == "start":
                return self._on_start(s, msg)
            if s.phase == "finish":
                self._on_finish(s, msg)
            elif s.phase == "objects":
                self._on_objects(msg)
            elif s.phase == "close":
                _kill(s.actor)
                return True
        except ValidationError as exc:
            return self._lose(
                s, f"the node's {s.phase} answer is not this controller's wire format: {_first_line(exc)}"
            )
        self._next_call(s)
        return False

    def _on_start(self, s: Submission, msg: Any) -> bool:
        reply = START_REPLY.validate_python(msg)
        s.node = reply.node
        if isinstance(reply, Started):
            try:
                announce(self.store, s, reply)
            except CkoError as err:
                return self._lose(s, err.message)
            self.say(f"{s.label}: {s.inv_id} running on {s.node.hostname}")
        s.run_deadline = time.monotonic() + s.plan.timeout_s + _margin(s.plan)
        s.phase, s.ref = "finish", s.actor.finish.remote()
        return False

    def _on_finish(self, s: Submission, msg: Any) -> None:
        s.done = Done.model_validate(msg)
        s.todo = [o for o in s.done.objects if not self.store.object_path(o.sha256).is_file()]
        s.run_deadline = time.monotonic() + TRANSFER_TIMEOUT_S

    def _on_objects(self, msg: Any) -> None:
        for digest, data in ObjectBatch.model_validate(msg).objects.items():
            if sha256_bytes(data) == digest:  # an altered one stays missing: the import refuses it
                self.store.put_bytes(data)

    def _next_call(self, s: Submission) -> None:
        """The next batch of objects to fetch (within TRANSFER_BATCH_BYTES), or close."""
        if not s.todo:
            s.phase, s.ref = "close", s.actor.close.remote()
            return
        batch: list[str] = []
        size = 0
        while s.todo and (not batch or size + s.todo[0].size <= TRANSFER_BATCH_BYTES):
            o = s.todo.pop(0)
            batch.append(o.sha256)
            size += o.size
        s.phase, s.ref = "objects", s.actor.read_objects.remote(ReadObjects(digests=batch).model_dump())
