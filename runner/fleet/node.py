"""The node side of the fleet: what runs on a Ray node (the invocation's actor, cleanup, readiness probe).

One invocation is one Ray actor (`NodeRunner`). On its node it runs the ordinary local sandbox
(`invocation.execute`) against a node-local scratch store, so the per-GPU flocks, the Plan's
timeout and the container cleanup all hold there as on one host. The controller stays the one
writer of its own store; the node only answers the calls of `wire.py`.

A worker that dies leaves a container behind on its node: a watchdog process, started in its own
session and tied to the worker by a pipe, removes it (through `reap_orphans` on the node store)
the moment the worker is gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .. import __version__, sandbox
from .. import gpu as gpumod
from .. import images as img
from ..errors import CkoError, Exit, failed, unavailable
from ..invocation import Outcome, Plan, execute, inv_dir, reap_orphans
from ..locks import FileLock, LockTimeout
from ..models import ObjectRef
from ..records import InvocationResult
from ..store import Store, new_id
from .wire import (
    Blobs,
    CleanupReport,
    Done,
    EngineProbe,
    GpuProbe,
    ImageProbe,
    NodeInfo,
    NodeProbe,
    NotStarted,
    ObjectBatch,
    ReadObjects,
    StartCall,
    Started,
    Wanted,
    WireError,
    plan_from_wire,
)

SCRATCH_ENV = "CKO_FLEET_SCRATCH"
STALE_SCRATCH_S = 60.0  # a task dir younger than this is never swept (it may be being created)
TASK_PREFIX = "flt"


def scratch_root() -> Path:
    """Where a node keeps the scratch stores of the tasks it runs (node-local, never shared)."""
    return Path(os.environ.get(SCRATCH_ENV) or Path(tempfile.gettempdir()) / "cko-fleet")


def remove_tree(path: Path) -> None:
    if not path.exists():
        return
    for d in [path, *path.rglob("*")]:
        if d.is_dir() and not d.is_symlink():
            with contextlib.suppress(OSError):
                d.chmod(0o755)
    shutil.rmtree(path, ignore_errors=True)


def _reap_task_dir(task_dir: Path) -> list[str]:
    """Remove the containers a dead task left and record them `abandoned` in its (node) store."""
    reaped: list[str] = []
    store_root = task_dir / "store"
    if store_root.is_dir():
        with contextlib.suppress(CkoError, OSError):
            reaped = reap_orphans(Store(store_root, create=False))
    remove_tree(task_dir)
    return reaped


def sweep(root: Path | None = None, min_age_s: float = STALE_SCRATCH_S) -> list[str]:
    """Reap task dirs on this node whose task is gone (no live holder of their .task lock)."""
    root = root or scratch_root()
    swept: list[str] = []
    if not root.is_dir():
        return swept
    for d in sorted(root.iterdir()):
        if not d.is_dir() or not d.name.startswith(TASK_PREFIX + "-"):
            continue
        with contextlib.suppress(OSError):
            if time.time() - d.stat().st_mtime < min_age_s:
                continue
        lock = FileLock(d / ".task")
        try:
            with lock.hold(timeout=0, what="fleet task dir"):
                _reap_task_dir(d)
        except (LockTimeout, OSError):
            continue
        swept.append(d.name)
    return swept


# -- the watchdog ---------------------------------------------------------------------------


def _start_watchdog(task_dir: Path) -> int:
    """A process in its own session that reaps task_dir once this worker is gone; returns the pipe end."""
    r, w = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(r), str(task_dir)],
            pass_fds=(r,),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        proc.wait(timeout=30)  # it forks the watchdog and exits at once: the watchdog is nobody's child
    finally:
        os.close(r)
    return w


# Fork before any import, so the worker's wait is short; the watchdog then imports cko and waits.
_WATCHDOG = (
    "import os, sys\n"
    "if os.fork() > 0:\n    os._exit(0)\n"
    "from cko_perf.runner.fleet.node import _watchdog_main\n"
    "_watchdog_main(int(sys.argv[1]), sys.argv[2])\n"
)


def _stop_watchdog(w: int) -> None:
    with contextlib.suppress(OSError):
        os.write(w, b"done\n")
    with contextlib.suppress(OSError):
        os.close(w)


def _watchdog_main(fd: int, task_dir_arg: str) -> None:
    """Block on the pipe; EOF without `done` means the worker died: reap its task dir."""
    task_dir = Path(task_dir_arg)
    data = b""
    while True:
        try:
            chunk = os.read(fd, 64)
        except InterruptedError:
            continue
        if not chunk:
            break
        data += chunk
    if b"done" in data:
        return
    with contextlib.suppress(LockTimeout, OSError):
        with FileLock(task_dir / ".task").hold(timeout=60, what="fleet task dir"):
            _reap_task_dir(task_dir)


# -- the invocation's actor -----------------------------------------------------------------


def node_info() -> NodeInfo:
    import ray

    return NodeInfo(
        node_id=ray.get_runtime_context().get_node_id(), pid=os.getpid(), hostname=socket.gethostname()
    )


def object_refs(res: InvocationResult) -> list[ObjectRef]:
    """Every object an invocation's result names: its outputs, stdout, stderr, telemetry."""
    refs = list(res.outputs)
    refs += [r for r in (res.stdout, res.stderr, res.telemetry) if r is not None]
    return refs


def _find_request(store: Store) -> str | None:
    root = store.invocations_dir
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        if (d / "request.json").is_file():
            return d.name
    return None


def _node_plan(task_dir: Path, call: StartCall, blobs: Blobs) -> Plan:
    import ray

    plan = plan_from_wire(call.plan, blobs, task_dir / "in")
    if os.environ.get("CKO_POLICY"):
        plan.policy_path = None  # the node's own policy applies (the controller checked its own)
    elif call.policy is not None:
        (task_dir / "policy.yaml").write_bytes(call.policy)
        plan.policy_path = str(task_dir / "policy.yaml")
    if plan.gpus and call.devices:
        plan.gpus = list(call.devices)  # pinned devices (a later look of one experiment)
    elif plan.gpus:
        ids = [str(g) for g in ray.get_gpu_ids()]
        if len(ids) != len(plan.gpus):
            raise unavailable(
                f"Ray gave this invocation {len(ids)} GPU(s), the plan needs {len(plan.gpus)}",
                code="fleet_gpu_grant",
                field="gpus",
            )
        plan.gpus = ids  # indexes on this node; execute maps them to UUIDs and takes their flocks
    if call.pin is not None:
        _check_pin(plan.image, call.pin)
    return plan


def _check_pin(image: str, pin: str) -> None:
    entry = img.load_lock().images.get(image)
    if entry is None or entry.image_id != pin:
        raise unavailable(
            f"node {socket.gethostname()} pins image {image} as "
            f"{entry.image_id[:19] if entry else 'nothing'}, the controller as {pin[:19]}: "
            "build the same image on every node",
            code="fleet_image_mismatch",
            field="image",
        )


def _read_call(doc: dict[str, Any]) -> StartCall:
    try:
        return StartCall.model_validate(doc)
    except ValidationError as exc:
        raise failed(
            f"the controller's start call is not this node's wire format (a different cko?): "
            f"{str(exc).splitlines()[0]}",
            code="fleet_wire",
        ) from None


class _Invocation(threading.Thread):
    """`execute` in a thread of the actor, so that `start` can answer as soon as request.json exists."""

    def __init__(self, store: Store, plan: Plan) -> None:
        super().__init__(name="cko-invocation", daemon=True)
        self.store, self.plan = store, plan
        self.outcome: Outcome | None = None
        self.error: CkoError | None = None
        self.crash: str | None = None

    def run(self) -> None:
        try:
            self.outcome = execute(self.store, self.plan, keep_outputs=False)
        except CkoError as err:
            self.error = err
        except Exception as exc:  # reported to the controller, never swallowed
            self.crash = f"{type(exc).__name__}: {exc}"

    def wait_for_request(self) -> str | None:
        """The invocation's id once the node wrote its request.json (None: it ended without one)."""
        inv_id = None
        while self.is_alive() and inv_id is None:
            inv_id = _find_request(self.store)
            if inv_id is None:
                self.join(timeout=0.05)
        return inv_id or _find_request(self.store)


class NodeRunner:
    """The Ray actor that runs one invocation on its node; one actor per invocation.

    Called in order: start (returns once request.json exists), finish (waits for the terminal
    state), read_objects (the objects the result names, in batches), close. An actor (not a
    task) so that the same protocol works through Ray Client (ray://), which cannot stream.
    Arguments and answers are the plain data of `wire.py`'s models.
    """

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._task_dir: Path | None = None
        self._watchdog: int | None = None
        self._run: _Invocation | None = None
        self._early: Done | None = None
        self._inv_id: str | None = None
        self._info = node_info()

    def start(self, call: dict[str, Any], blobs: Blobs) -> dict[str, Any]:
        root = scratch_root()
        root.mkdir(parents=True, exist_ok=True)
        sweep(root)
        td = root / new_id(TASK_PREFIX)
        td.mkdir()
        td.chmod(0o755)
        self._task_dir = td
        self._stack.enter_context(FileLock(td / ".task").hold(timeout=5, what="fleet task dir"))
        self._watchdog = _start_watchdog(td)
        try:
            plan = _node_plan(td, _read_call(call), blobs)
        except CkoError as err:
            self._early = Done(node=self._info, error=WireError.of(err))
            return NotStarted(node=self._info).model_dump()
        self._run = _Invocation(Store(td / "store"), plan)
        self._run.start()
        self._inv_id = self._run.wait_for_request()
        if self._inv_id is None:
            return NotStarted(node=self._info).model_dump()
        request = (inv_dir(self._run.store, self._inv_id) / "request.json").read_bytes()
        return Started(id=self._inv_id, request=request, node=self._info).model_dump()

    def finish(self) -> dict[str, Any]:
        if self._early is not None:
            return self._early.model_dump()
        assert self._run is not None
        self._run.join()
        return self._done(self._run).model_dump()

    def _done(self, run: _Invocation) -> Done:
        inv_id = self._inv_id
        error, meta = None, None
        if run.crash is not None:
            error = WireError(
                message=f"the node's invocation crashed: {run.crash}",
                exit_code=int(Exit.FAILED),
                code="fleet_node_crash",
                invocation=inv_id,
            )
        elif run.error is not None:
            error = WireError.of(run.error)
        else:
            assert run.outcome is not None
            meta = run.outcome.meta
        d = inv_dir(run.store, inv_id) if inv_id else None
        if d is None or not (d / "result.json").is_file():
            return Done(node=self._info, id=inv_id, error=error, meta=meta)
        res = InvocationResult.model_validate_json((d / "result.json").read_bytes())
        return Done(
            node=self._info,
            id=inv_id,
            error=error,
            meta=meta,
            objects=[Wanted(sha256=r.sha256, size=r.size) for r in object_refs(res)],
            request=(d / "request.json").read_bytes(),
            events=(d / "events.jsonl").read_bytes() if (d / "events.jsonl").is_file() else None,
            result=(d / "result.json").read_bytes(),
        )

    def read_objects(self, call: dict[str, Any]) -> dict[str, Any]:
        assert self._run is not None
        digests = ReadObjects.model_validate(call).digests
        return ObjectBatch(objects={dg: self._run.store.read_object(dg) for dg in digests}).model_dump()

    def close(self) -> None:
        if self._watchdog is not None:
            _stop_watchdog(self._watchdog)
            self._watchdog = None
        if self._task_dir is not None:
            remove_tree(self._task_dir)
        self._stack.close()


# -- one-off tasks on a node ----------------------------------------------------------------


def node_cleanup(inv_id: str) -> dict[str, Any]:
    """Runs on the node of a lost task: no container of that invocation may be left."""
    info = node_info()
    client = img.docker_client()
    flt = {"label": f"{sandbox.LABEL}.invocation={inv_id}"}
    found = list(client.containers.list(all=True, filters=flt))
    reps = [sandbox.remove_container(client, c.id, grace=1, bound=20).as_dict() for c in found]
    left = list(client.containers.list(all=True, filters=flt))
    sweep()
    return CleanupReport(
        confirmed_by="fleet cleanup task on the node",
        node=info,
        found_containers=len(found),
        container_removed=not left,
        removals=reps,
        leftover=f"{len(left)} container(s) still exist" if left else None,
    ).model_dump()


def _probe_images(client: Any) -> dict[str, ImageProbe]:
    images: dict[str, ImageProbe] = {}
    lock = img.load_lock()
    for name in img.IMAGE_NAMES:
        entry = lock.images.get(name)
        pinned = entry.image_id if entry else None
        if client is None:
            images[name] = ImageProbe(ok=False, image_id=pinned, reason="no engine")
            continue
        try:
            images[name] = ImageProbe(ok=True, image_id=img.resolve(name, client).image_id)
        except CkoError as err:
            images[name] = ImageProbe(ok=False, image_id=pinned, reason=err.message)
    return images


def _probe_scratch(blockers: list[str]) -> bool:
    try:
        scratch_root().mkdir(parents=True, exist_ok=True)
        return os.access(scratch_root(), os.W_OK)
    except OSError as exc:
        blockers.append(f"scratch {scratch_root()}: {exc.strerror}")
        return False


def node_probe() -> dict[str, Any]:
    """Readiness of one node for cko: engine, pinned images, GPUs, scratch (a NodeProbe)."""
    info = node_info()  # first: the probe's own node, even if what follows fails
    blockers: list[str] = []
    try:
        client = img.docker_client()
        engine = EngineProbe(ok=True, version=str(client.version().get("Version")))
    except CkoError as err:
        client = None
        engine = EngineProbe(ok=False, reason=err.message)
        blockers.append(err.message)
    images = _probe_images(client)
    if not any(v.ok for v in images.values()):
        blockers.append("no usable image")
    hg = gpumod.host_gpus()
    gpus = GpuProbe(
        available=hg.available,
        count=len(hg.devices),
        names=sorted({d.name for d in hg.devices}),
        reason=None if hg.available else hg.reason,
    )
    writable = _probe_scratch(blockers)
    return NodeProbe(
        node=info,
        cko_version=__version__,
        python=sys.version.split()[0],
        scratch=str(scratch_root()),
        policy=os.environ.get("CKO_POLICY"),
        engine=engine,
        images=images,
        gpus=gpus,
        scratch_writable=writable,
        ready=not blockers,
        blockers=blockers,
    ).model_dump(exclude_unset=True)
