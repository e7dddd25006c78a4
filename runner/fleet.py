"""The fleet backend: invocations placed on the nodes of a Ray cluster (DESIGN.md, Beyond one machine).

Ray does the placing and the resource accounting; cko adds nothing of a scheduler. One invocation
is one Ray actor (`NodeRunner`: a task with a few calls), placed by resources: `num_gpus` plus one
custom resource per GPU model (`gpu:H200`), or one `cko_slot` for CPU work. On its node it runs the
ordinary local sandbox (`invocation.execute`) against a node-local scratch store, so the per-GPU
flocks, the Plan's timeout and the container cleanup all hold there as on one host. The controller
that submitted it stays the one writer of its store: it writes request.json as soon as the node
announces it, and imports events.jsonl, result.json and the objects they name once every hash
checks out; it alone records the terminal state when a node or worker is lost.

How a Plan travels: a Plan is plain data plus Mount paths. Its fields go as they are; a read-only
mount (harness, subjects, a request file) is shipped as bytes by default (`ship="auto"`) and
materialised read-only on the node, verified against its hash; a read-write mount is never
shipped and its path must exist on the node (`ship="none"` makes every mount such a path).
Outputs never travel through a mount: the container writes /cko/out and those files come back as
objects of the invocation.

The calls on the actor, in order: `start` (returns once the node wrote request.json), `finish`
(the terminal records), `read_objects` (the objects the result names, in batches), `close`. An
actor rather than a streaming task because Ray Client (ray://) cannot stream. A worker that dies
leaves a container behind on its node: a watchdog process, started in its own session and tied to
the worker by a pipe, removes it (through `reap_orphans` on the node store) the moment the worker
is gone; the controller runs a cleanup task on that node to confirm it, and records `abandoned`
with that report (unconfirmed when the node itself is gone).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from . import __version__, sandbox
from . import images as img
from . import policy as pol
from .canonical import sha256_bytes, sha256_file
from .errors import CkoError, Exit, bad_request, failed, unavailable
from .identity import MATTERS, EnvironmentIdentity, _field_values
from .invocation import (
    Events,
    Outcome,
    Plan,
    check_plan,
    claim,
    execute,
    inv_dir,
    now_iso,
    reap_orphans,
    refuse,
)
from .locks import FileLock, LockTimeout
from .models import Closed, ObjectRef
from .records import InvocationResult
from .store import Store, check_id, new_id, write_new, write_replace
from .workers import WorkerLaunch

SCRATCH_ENV = "CKO_FLEET_SCRATCH"
SLOT = "cko_slot"  # the custom resource CPU invocations take, one each
GPU_MODEL_PREFIX = "gpu:"  # one custom resource per GPU model: gpu:H200
NAMESPACE = "cko"
MAX_SHIP_BYTES = 1 << 30  # inputs shipped with one invocation
START_MARGIN_S = 120.0  # image resolution, reaping, collection: on top of the Plan's own bounds
QUEUE_TIMEOUT_S = 600.0  # waiting for a node that has the resources
CLEANUP_TASK_TIMEOUT_S = 60.0
TRANSFER_TIMEOUT_S = 600.0  # fetching one invocation's records and objects from its node
TRANSFER_BATCH_BYTES = 64 << 20
STALE_SCRATCH_S = 60.0  # a task dir younger than this is never swept (it may be being created)
TASK_PREFIX = "flt"
Ship = Literal["auto", "none"]


# -- placement ------------------------------------------------------------------------------


@dataclass
class Placement:
    """Which resources one invocation takes on the fleet; Ray finds the node."""

    num_gpus: int = 0
    gpu_model: str | None = None  # adds the custom resource gpu:<model> per GPU
    resources: dict[str, float] = field(default_factory=dict)  # any other custom resources
    slots: float | None = None  # cko_slot; default: 1 for CPU work, 0 for GPU work
    node_id: str | None = None  # pin to one Ray node (hard affinity)
    devices: list[str] = field(default_factory=list)  # with node_id: these GPU UUIDs of that node

    def resource_request(self) -> dict[str, float]:
        res = {k: float(v) for k, v in self.resources.items()}
        if self.gpu_model:
            if self.num_gpus < 1:
                raise bad_request("gpu_model: needs at least one GPU (num_gpus >= 1)", field="gpu_model")
            key = GPU_MODEL_PREFIX + self.gpu_model
            res[key] = res.get(key, 0.0) + float(self.num_gpus)
        slots = self.slots if self.slots is not None else (0.0 if self.num_gpus else 1.0)
        if slots:
            res[SLOT] = res.get(SLOT, 0.0) + float(slots)
        for k, v in res.items():
            if not k or v < 0 or v != v:
                raise bad_request(f"resources: {k!r}={v} is not a valid resource request", field="resources")
        return {k: v for k, v in res.items() if v > 0}

    def ray_options(self) -> dict[str, Any]:
        if self.num_gpus < 0:
            raise bad_request("num_gpus: must be >= 0", field="gpus")
        if self.devices and (not self.node_id or len(self.devices) != self.num_gpus):
            raise bad_request(
                "devices: name exactly num_gpus GPUs, on a pinned node (node_id)", field="devices"
            )
        opts: dict[str, Any] = {
            "num_cpus": 0,
            "num_gpus": self.num_gpus,
            "resources": self.resource_request(),
            "max_restarts": 0,  # an invocation is never re-run behind the caller's back
            "max_task_retries": 0,
        }
        if self.node_id:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(self.node_id, soft=False)
        return opts

    def describe(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"num_gpus": self.num_gpus, "resources": self.resource_request()}
        if self.node_id:
            doc["node_id"] = self.node_id
        if self.devices:
            doc["devices"] = list(self.devices)
        return doc


def placement_for(
    plan: Plan,
    gpu_model: str | None = None,
    resources: Mapping[str, float] | None = None,
    node_id: str | None = None,
    slots: float | None = None,
) -> Placement:
    """The placement a Plan asks for: as many GPUs as it names; on the node they become Ray's GPUs."""
    if plan.gpus == ["all"]:
        raise bad_request(
            "gpus: 'all' has no meaning on a fleet; give a count (or that many indexes)", field="gpus"
        )
    return Placement(
        num_gpus=len(plan.gpus),
        gpu_model=gpu_model,
        resources=dict(resources or {}),
        node_id=node_id,
        slots=slots,
    )


# -- how a Plan travels ---------------------------------------------------------------------


def _file_mode(st_mode: int) -> int:
    return 0o555 if st_mode & 0o111 else 0o444


def _pack_path(source: str, blobs: dict[str, bytes], budget: list[int]) -> dict[str, Any]:
    src = Path(source)
    if src.is_symlink():
        src = src.resolve()

    def add(p: Path) -> tuple[str, int]:
        data = p.read_bytes()
        budget[0] += len(data)
        if budget[0] > MAX_SHIP_BYTES:
            raise bad_request(
                f"mount {source}: more than {MAX_SHIP_BYTES} bytes of inputs to ship; mount a path "
                "that exists on the nodes instead (ship='none')",
                field="mount",
            )
        digest = sha256_bytes(data)
        blobs[digest] = data
        return digest, _file_mode(p.stat().st_mode)

    if src.is_file():
        digest, mode = add(src)
        return {"kind": "file", "name": src.name, "sha256": digest, "mode": mode}
    if not src.is_dir():
        raise bad_request(
            f"mount source {source} does not exist (or is not a file or directory)", field="mount"
        )
    files: list[dict[str, Any]] = []
    dirs: list[str] = []
    for dirpath, dirnames, filenames in os.walk(src, followlinks=False):
        base = Path(dirpath)
        for d in sorted(dirnames):
            if (base / d).is_symlink():
                raise bad_request(
                    f"mount {source}: {base / d} is a symlink; it cannot be shipped", field="mount"
                )
            dirs.append(str((base / d).relative_to(src)))
        for name in sorted(filenames):
            p = base / name
            st = os.lstat(p)
            if not stat.S_ISREG(st.st_mode):
                raise bad_request(
                    f"mount {source}: {p} is not a regular file; it cannot be shipped", field="mount"
                )
            digest, mode = add(p)
            files.append({"path": str(p.relative_to(src)), "sha256": digest, "mode": mode})
    return {"kind": "dir", "files": files, "dirs": dirs}


def _mounts_to_wire(
    mounts: list[sandbox.Mount], ship: Ship, blobs: dict[str, bytes], budget: list[int]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in mounts:
        if ship == "auto" and m.read_only:
            out.append(
                {"target": m.target, "read_only": True, "shipped": _pack_path(m.source, blobs, budget)}
            )
        else:
            if not Path(m.source).is_absolute():
                raise bad_request(
                    f"mount {m.source}: a mount that is not shipped names a path on the node; give it absolute",
                    field="mount",
                )
            out.append({"target": m.target, "read_only": m.read_only, "source": m.source})
    return out


def plan_to_wire(plan: Plan, ship: Ship = "auto") -> tuple[dict[str, Any], dict[str, bytes]]:
    """The Plan as plain data, and the bytes of the inputs that travel with it (by sha256).

    A measuring stage's workers travel too, each with its own mounts (shipped like the Plan's)."""
    if ship not in ("auto", "none"):
        raise bad_request(f"ship: {ship!r} is not auto or none", field="ship")
    fields = {
        f.name: getattr(plan, f.name)
        for f in dataclasses.fields(plan)
        if f.name not in ("mounts", "policy_path", "workers")
    }
    try:
        fields = json.loads(json.dumps(fields))
    except (TypeError, ValueError) as exc:
        raise bad_request(f"plan: not plain data, it cannot travel to a node ({exc})", field="plan") from None
    blobs: dict[str, bytes] = {}
    budget = [0]
    mounts = _mounts_to_wire(plan.mounts, ship, blobs, budget)
    workers = [
        {
            "subject": w.subject,
            "uid": w.uid,
            "command": list(w.command),
            "env": dict(w.env),
            "workdir": w.workdir,
            "keep": list(w.keep),
            "mounts": _mounts_to_wire(w.mounts, ship, blobs, budget),
        }
        for w in plan.workers
    ]
    return {"plan": fields, "mounts": mounts, "workers": workers}, blobs


def _write_blob(path: Path, blobs: Mapping[str, bytes], digest: str, mode: int) -> None:
    data = blobs.get(digest)
    if data is None or sha256_bytes(data) != digest:
        raise failed(f"shipped input {path.name}: bytes missing or altered in transit", code="ship_corrupt")
    path.write_bytes(data)
    path.chmod(mode)


def _unpack_dir(shipped: Mapping[str, Any], blobs: Mapping[str, bytes], source: Path) -> None:
    source.mkdir()
    for d in shipped["dirs"]:
        if Path(d).is_absolute() or ".." in Path(d).parts:
            raise failed(f"shipped input: bad path {d!r}", code="ship_corrupt")
        (source / d).mkdir(parents=True, exist_ok=True)
    for f in shipped["files"]:
        rel = Path(str(f["path"]))
        if rel.is_absolute() or ".." in rel.parts:
            raise failed(f"shipped input: bad path {rel}", code="ship_corrupt")
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        _write_blob(source / rel, blobs, f["sha256"], int(f["mode"]))
    for d in sorted((p for p in source.rglob("*") if p.is_dir()), reverse=True):
        d.chmod(0o555)
    source.chmod(0o555)


def _mounts_from_wire(
    wire: list[Mapping[str, Any]], blobs: Mapping[str, bytes], dest: Path
) -> list[sandbox.Mount]:
    mounts: list[sandbox.Mount] = []
    for i, m in enumerate(wire):
        shipped = m.get("shipped")
        if shipped is None:
            mounts.append(sandbox.Mount(str(m["source"]), str(m["target"]), read_only=bool(m["read_only"])))
            continue
        root = dest / str(i)
        root.mkdir(parents=True)
        root.chmod(0o755)
        if shipped["kind"] == "file":
            name = Path(str(shipped["name"])).name
            _write_blob(root / name, blobs, shipped["sha256"], int(shipped["mode"]))
            source = root / name
        else:
            source = root / "d"
            _unpack_dir(shipped, blobs, source)
        mounts.append(sandbox.Mount(str(source), str(m["target"]), read_only=True))
    return mounts


def plan_from_wire(wire: Mapping[str, Any], blobs: Mapping[str, bytes], dest: Path) -> Plan:
    """Rebuild the Plan on a node: shipped inputs are written (read-only, verified) under dest."""
    plan = Plan(**wire["plan"])
    plan.mounts = _mounts_from_wire(list(wire["mounts"]), blobs, dest)
    plan.workers = [
        WorkerLaunch(
            subject=str(w["subject"]),
            uid=int(w["uid"]),
            command=[str(c) for c in w["command"]],
            env={str(k): str(v) for k, v in dict(w["env"]).items()},
            workdir=str(w["workdir"]),
            keep=tuple(str(k) for k in w.get("keep") or ()),
            mounts=_mounts_from_wire(list(w["mounts"]), blobs, dest / f"w{i}"),
        )
        for i, w in enumerate(wire.get("workers") or [])
    ]
    return plan


# -- the node side --------------------------------------------------------------------------


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
    import shutil

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
    "from runner.fleet import _watchdog_main\n"
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


def _err_doc(err: CkoError) -> dict[str, Any]:
    return {
        "message": err.message,
        "exit_code": int(err.exit_code),
        "code": err.code,
        "field": err.field,
        "invocation": err.detail.get("invocation"),
    }


def _find_request(store: Store) -> str | None:
    root = store.root / "invocations"
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        if (d / "request.json").is_file():
            return d.name
    return None


def _node_info() -> dict[str, Any]:
    import ray

    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
    }


def _node_plan(
    task_dir: Path, wire: dict[str, Any], blobs: dict[str, bytes], policy_bytes: bytes | None, pin: str | None
) -> Plan:
    import ray

    plan = plan_from_wire(wire, blobs, task_dir / "in")
    if os.environ.get("CKO_POLICY"):
        plan.policy_path = None  # the node's own policy applies (the controller checked its own)
    elif policy_bytes is not None:
        (task_dir / "policy.yaml").write_bytes(policy_bytes)
        plan.policy_path = str(task_dir / "policy.yaml")
    if plan.gpus and wire.get("devices"):
        plan.gpus = [str(u) for u in wire["devices"]]  # pinned devices (a later look of one experiment)
    elif plan.gpus:
        ids = [str(g) for g in ray.get_gpu_ids()]
        if len(ids) != len(plan.gpus):
            raise unavailable(
                f"Ray gave this invocation {len(ids)} GPU(s), the plan needs {len(plan.gpus)}",
                code="fleet_gpu_grant",
                field="gpus",
            )
        plan.gpus = ids  # indexes on this node; execute maps them to UUIDs and takes their flocks
    if pin is not None:
        entry = img.load_lock().images.get(plan.image)
        if entry is None or entry.image_id != pin:
            raise unavailable(
                f"node {socket.gethostname()} pins image {plan.image} as "
                f"{entry.image_id[:19] if entry else 'nothing'}, the controller as {pin[:19]}: "
                "build the same image on every node",
                code="fleet_image_mismatch",
                field="image",
            )
    return plan


class NodeRunner:
    """The Ray actor that runs one invocation on its node; one actor per invocation.

    Called in order: start (returns once request.json exists), finish (waits for the terminal
    state), read_objects (the objects the result names, in batches), close. An actor (not a
    task) so that the same protocol works through Ray Client (ray://), which cannot stream.
    """

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._task_dir: Path | None = None
        self._watchdog: int | None = None
        self._store: Store | None = None
        self._thread: threading.Thread | None = None
        self._box: dict[str, Any] = {}
        self._early: dict[str, Any] | None = None
        self._inv_id: str | None = None
        self._info = _node_info()

    def start(
        self, wire: dict[str, Any], blobs: dict[str, bytes], policy_bytes: bytes | None, pin: str | None
    ) -> dict[str, Any]:
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
            plan = _node_plan(td, wire, blobs, policy_bytes, pin)
        except CkoError as err:
            self._early = {"kind": "done", "node": self._info, "error": _err_doc(err)}
            return {"kind": "not_started", "node": self._info}
        store = self._store = Store(td / "store")
        box = self._box

        def run() -> None:
            try:
                box["outcome"] = execute(store, plan, keep_outputs=False)
            except CkoError as err:
                box["error"] = err
            except Exception as exc:  # reported to the controller, never swallowed
                box["crash"] = f"{type(exc).__name__}: {exc}"

        self._thread = threading.Thread(target=run, name="cko-invocation", daemon=True)
        self._thread.start()
        while self._thread.is_alive() and self._inv_id is None:
            self._inv_id = _find_request(store)
            if self._inv_id is None:
                self._thread.join(timeout=0.05)
        self._inv_id = self._inv_id or _find_request(store)
        if self._inv_id is None:
            return {"kind": "not_started", "node": self._info}
        request = (inv_dir(store, self._inv_id) / "request.json").read_bytes()
        return {"kind": "started", "id": self._inv_id, "request": request, "node": self._info}

    def finish(self) -> dict[str, Any]:
        if self._early is not None:
            return self._early
        assert self._thread is not None and self._store is not None
        self._thread.join()
        box, inv_id = self._box, self._inv_id
        done: dict[str, Any] = {"kind": "done", "node": self._info, "id": inv_id, "objects": []}
        if "crash" in box:
            done["error"] = {
                "message": f"the node's invocation crashed: {box['crash']}",
                "exit_code": int(Exit.FAILED),
                "code": "fleet_node_crash",
                "field": None,
                "invocation": inv_id,
            }
        elif "error" in box:
            done["error"] = _err_doc(box["error"])
        else:
            done["meta"] = box["outcome"].meta
        d = inv_dir(self._store, inv_id) if inv_id else None
        if d is not None and (d / "result.json").is_file():
            res = InvocationResult.model_validate_json((d / "result.json").read_bytes())
            done["objects"] = [{"sha256": r.sha256, "size": r.size} for r in _object_refs(res)]
            done["request"] = (d / "request.json").read_bytes()
            done["events"] = (d / "events.jsonl").read_bytes() if (d / "events.jsonl").is_file() else None
            done["result"] = (d / "result.json").read_bytes()
        return done

    def read_objects(self, digests: list[str]) -> dict[str, bytes]:
        assert self._store is not None
        return {dg: self._store.read_object(dg) for dg in digests}

    def close(self) -> None:
        if self._watchdog is not None:
            _stop_watchdog(self._watchdog)
            self._watchdog = None
        if self._task_dir is not None:
            remove_tree(self._task_dir)
        self._stack.close()


def _node_cleanup(inv_id: str) -> dict[str, Any]:
    """Runs on the node of a lost task: no container of that invocation may be left."""
    report: dict[str, Any] = {"confirmed_by": "fleet cleanup task on the node", "node": _node_info()}
    client = img.docker_client()
    flt = {"label": f"{sandbox.LABEL}.invocation={inv_id}"}
    found = list(client.containers.list(all=True, filters=flt))
    reps = [sandbox.remove_container(client, c.id, grace=1, bound=20).as_dict() for c in found]
    left = list(client.containers.list(all=True, filters=flt))
    sweep()
    report.update(
        {
            "found_containers": len(found),
            "container_removed": not left,
            "removals": reps,
            "leftover": f"{len(left)} container(s) still exist" if left else None,
        }
    )
    return report


def _node_probe() -> dict[str, Any]:
    """Readiness of one node for cko: engine, pinned images, GPUs, scratch."""
    from . import gpu as gpumod

    doc: dict[str, Any] = {
        "node": _node_info(),
        "cko_version": __version__,
        "python": sys.version.split()[0],
        "scratch": str(scratch_root()),
        "policy": os.environ.get("CKO_POLICY"),
    }
    blockers: list[str] = []
    try:
        client = img.docker_client()
        doc["engine"] = {"ok": True, "version": str(client.version().get("Version"))}
    except CkoError as err:
        client = None
        doc["engine"] = {"ok": False, "reason": err.message}
        blockers.append(err.message)
    images: dict[str, Any] = {}
    lock = img.load_lock()
    for name in img.IMAGE_NAMES:
        entry = lock.images.get(name)
        if client is None:
            images[name] = {"ok": False, "image_id": entry.image_id if entry else None, "reason": "no engine"}
            continue
        try:
            e = img.resolve(name, client)
            images[name] = {"ok": True, "image_id": e.image_id}
        except CkoError as err:
            images[name] = {"ok": False, "image_id": entry.image_id if entry else None, "reason": err.message}
    doc["images"] = images
    if not any(v["ok"] for v in images.values()):
        blockers.append("no usable image")
    hg = gpumod.host_gpus()
    doc["gpus"] = {
        "available": hg.available,
        "count": len(hg.devices),
        "names": sorted({d.name for d in hg.devices}),
        "reason": None if hg.available else hg.reason,
    }
    try:
        scratch_root().mkdir(parents=True, exist_ok=True)
        doc["scratch_writable"] = os.access(scratch_root(), os.W_OK)
    except OSError as exc:
        doc["scratch_writable"] = False
        blockers.append(f"scratch {scratch_root()}: {exc.strerror}")
    doc["ready"] = not blockers
    doc["blockers"] = blockers
    return doc


# -- the controller side --------------------------------------------------------------------


def _object_refs(res: InvocationResult) -> list[ObjectRef]:
    refs = list(res.outputs)
    refs += [r for r in (res.stdout, res.stderr, res.telemetry) if r is not None]
    return refs


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


def _kill(actor: Any) -> None:
    import ray

    if actor is not None:
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)


def _margin(plan: Plan) -> float:
    return plan.lock_timeout_s + plan.stop_grace_s + plan.cleanup_timeout_s + START_MARGIN_S


@dataclass
class FleetRun:
    """One invocation submitted to the fleet: where it ran and how it ended."""

    plan: Plan
    placement: Placement
    node: dict[str, Any] | None = None
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
            "node": self.node,
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
class _Run:
    index: int
    plan: Plan
    placement: Placement
    actor: Any = None
    ref: Any = None  # the one pending call on the actor
    phase: str = "start"  # start, finish, objects, close
    todo: list[dict[str, Any]] = field(default_factory=list)  # objects still to fetch
    queue_deadline: float = 0.0
    run_deadline: float | None = None
    inv_id: str | None = None
    request: bytes | None = None
    node: dict[str, Any] | None = None
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    done: dict[str, Any] | None = None
    lost: str | None = None
    timed_out: bool = False
    result: FleetRun | None = None

    def deadline(self) -> float:
        return self.run_deadline if self.run_deadline is not None else self.queue_deadline


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
        # Ray Client's proxy starts a server process per client; on a busy head that start can miss
        # its deadline ("Initialization failure from server") though the cluster is fine: try again.
        attempts = 3 if self.address.startswith("ray://") else 1
        for attempt in range(1, attempts + 1):
            try:
                ray.init(
                    address=self.address,
                    namespace=NAMESPACE,
                    log_to_driver=False,
                    logging_level=logging.ERROR,
                )
                return
            except (ConnectionError, RuntimeError, ValueError) as exc:
                if attempt < attempts and "Initialization failure" in str(exc):
                    with contextlib.suppress(Exception):  # whatever the failed attempt left behind
                        ray.shutdown()
                    time.sleep(2.0 * attempt)
                    continue
                raise unavailable(
                    f"no Ray cluster answers at {self.address}: {str(exc).splitlines()[0][:300]}",
                    code="fleet_unreachable",
                    field="fleet",
                ) from None

    def close(self) -> None:
        """Disconnect from the cluster (stops Ray's driver threads)."""
        import ray

        if ray.is_initialized():
            ray.shutdown()

    # -- status ----------------------------------------------------------------------------
    def status(self, probe: bool = True, timeout_s: float = 60.0) -> dict[str, Any]:
        import ray

        avail: dict[str, dict[str, float]] = {}
        with contextlib.suppress(Exception):
            from ray._private.state import available_resources_per_node

            avail = available_resources_per_node()
        nodes = []
        for n in ray.nodes():
            nodes.append(
                {
                    "node_id": n["NodeID"],
                    "alive": bool(n["Alive"]),
                    "address": n.get("NodeManagerAddress"),
                    "hostname": n.get("NodeManagerHostname"),
                    "resources": _public_resources(n.get("Resources") or {}),
                    "available": _public_resources(avail.get(n["NodeID"], {})) if n["Alive"] else {},
                }
            )
        if probe:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            fn = ray.remote(_node_probe)
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
                        n["cko"] = ray.get(ref)
                    except ray.exceptions.RayError as exc:
                        n["cko"] = {
                            "ready": False,
                            "blockers": [f"probe failed: {str(exc).splitlines()[0][:300]}"],
                        }
        return {
            "address": self.address,
            "ray_version": ray.__version__,
            "nodes": nodes,
            "totals": _public_resources(ray.cluster_resources()),
        }

    # -- running ---------------------------------------------------------------------------
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
        progress: Callable[[str], None] | None = None,
        keep_outputs: bool = False,
        ship: Ship = "auto",
        queue_timeout_s: float = QUEUE_TIMEOUT_S,
    ) -> list[FleetRun]:
        """Run several invocations at once (Ray places them); import each into `store` as it ends."""
        import ray

        say = progress or (lambda _m: None)
        reap_orphans(store)
        runs: list[_Run] = []
        for i, item in enumerate(items):
            plan, placement = item if isinstance(item, tuple) else (item, placement_for(item))
            runs.append(_Run(index=i, plan=plan, placement=placement))
        pending: dict[str, _Run] = {}
        runner = ray.remote(NodeRunner)
        try:
            for r in runs:
                try:
                    opts = r.placement.ray_options()
                    wire, blobs, policy_bytes, pin = _prepare(store, r.plan, ship)
                    wire["devices"] = list(r.placement.devices)
                except CkoError as err:
                    r.result = FleetRun(r.plan, r.placement, error=err)
                    continue
                r.actor = runner.options(**opts).remote()
                r.ref = r.actor.start.remote(wire, ray.put(blobs), policy_bytes, pin)
                r.queue_deadline = time.monotonic() + queue_timeout_s
                pending[r.ref.hex()] = r
                say(f"{r.plan.label or r.plan.op}: submitted to the fleet ({r.placement.describe()})")
            while pending:
                now = time.monotonic()
                for r in [r for r in pending.values() if r.deadline() <= now]:
                    del pending[r.ref.hex()]
                    _kill(r.actor)
                    r.timed_out = True
                    r.lost = {
                        "start": f"no node had the resources within {queue_timeout_s:g}s; cancelled",
                        "finish": "it ran past the plan's timeout plus the fleet margin; its actor was killed",
                    }.get(r.phase, f"fetching its records took more than {TRANSFER_TIMEOUT_S:g}s")
                    self._finish(store, r, keep_outputs, say)
                if not pending:
                    break
                wait_s = max(0.0, min(r.deadline() for r in pending.values()) - time.monotonic())
                ready, _ = ray.wait(
                    [r.ref for r in pending.values()], num_returns=1, timeout=min(wait_s, 5.0)
                )
                for ref in ready:
                    r = pending.pop(ref.hex())
                    if self._step(store, r, ref, say):
                        self._finish(store, r, keep_outputs, say)
                    else:
                        pending[r.ref.hex()] = r
        finally:
            for r in runs:
                if r.result is None:  # interrupted: stop what still runs, record it as lost
                    _kill(r.actor)
                    r.lost = r.lost or "the controller stopped waiting for it"
                    with contextlib.suppress(Exception):
                        self._finish(store, r, keep_outputs, say)
                r.stack.close()
        return [r.result for r in runs if r.result is not None]

    def _step(self, store: Store, r: _Run, ref: Any, say: Callable[[str], None]) -> bool:
        """Take the answer of the actor's pending call, make the next; True when nothing more comes."""
        import ray

        try:
            msg = ray.get(ref)
        except ray.exceptions.RayError as exc:
            r.lost = f"the fleet lost its worker: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            _kill(r.actor)
            return True
        if r.phase == "start":
            r.node = msg.get("node")
            if msg.get("kind") == "started":
                try:
                    self._started(store, r, msg)
                except CkoError as err:
                    _kill(r.actor)
                    r.lost = err.message
                    return True
                say(f"{r.plan.label or r.plan.op}: {r.inv_id} running on {(r.node or {}).get('hostname')}")
            r.run_deadline = time.monotonic() + r.plan.timeout_s + _margin(r.plan)
            r.phase, r.ref = "finish", r.actor.finish.remote()
            return False
        if r.phase == "finish":
            r.done = msg
            r.todo = [o for o in msg.get("objects", []) if not store.object_path(str(o["sha256"])).is_file()]
            r.run_deadline = time.monotonic() + TRANSFER_TIMEOUT_S
        elif r.phase == "objects":
            for digest, data in msg.items():
                if sha256_bytes(data) == digest:  # an altered one stays missing: the import refuses it
                    store.put_bytes(data)
        elif r.phase == "close":
            _kill(r.actor)
            return True
        if r.todo:
            batch: list[str] = []
            size = 0
            while r.todo and (not batch or size + int(r.todo[0]["size"]) <= TRANSFER_BATCH_BYTES):
                o = r.todo.pop(0)
                batch.append(str(o["sha256"]))
                size += int(o["size"])
            r.phase, r.ref = "objects", r.actor.read_objects.remote(batch)
        else:
            r.phase, r.ref = "close", r.actor.close.remote()
        return False

    def _started(self, store: Store, r: _Run, msg: dict[str, Any]) -> None:
        inv_id = check_id(str(msg["id"]), "invocation")
        d = inv_dir(store, inv_id)
        if d.exists():
            raise failed(f"invocation {inv_id} already exists in {store.root}", code="fleet_duplicate")
        r.stack.enter_context(claim(store, inv_id, timeout=5))
        write_new(d / "request.json", msg["request"])
        r.inv_id, r.request, r.node = inv_id, msg["request"], msg.get("node")
        Events(d / "events.jsonl")("fleet_started", {"node": r.node})

    def _finish(self, store: Store, r: _Run, keep_outputs: bool, say: Callable[[str], None]) -> None:
        label = r.plan.label or r.plan.op
        try:
            if r.done is not None:
                r.node = r.node or r.done.get("node")
                if r.inv_id is None and r.done.get("request") is not None:
                    self._started(
                        store,
                        r,
                        {"id": r.done["id"], "request": r.done["request"], "node": r.done.get("node")},
                    )
                r.result = self._import(store, r, keep_outputs)
            elif r.inv_id is not None:
                r.result = self._record_lost(store, r)
            else:
                err = CkoError(
                    f"{label}: {r.lost}",
                    exit_code=Exit.TIMED_OUT if r.timed_out else Exit.UNAVAILABLE,
                    code="fleet_queue_timeout" if r.timed_out else "fleet_lost",
                    field="fleet",
                )
                r.result = FleetRun(r.plan, r.placement, node=r.node, error=err)
        except CkoError as err:
            r.result = FleetRun(r.plan, r.placement, node=r.node, error=err)
        finally:
            r.stack.close()
        say(f"{label}: {r.result.id or '-'} {r.result.outcome.result.state if r.result.outcome else 'error'}")

    def _import(self, store: Store, r: _Run, keep_outputs: bool) -> FleetRun:
        assert r.done is not None
        done = r.done
        err_doc = done.get("error")
        error = None
        if err_doc:
            error = CkoError(
                str(err_doc["message"]),
                exit_code=Exit(int(err_doc["exit_code"])),
                code=str(err_doc["code"]),
                field=err_doc.get("field"),
            )
        if r.inv_id is None:  # nothing was recorded on the node: nothing to import
            assert error is not None
            return FleetRun(r.plan, r.placement, node=r.node, error=error)
        d = inv_dir(store, r.inv_id)
        problems = _check_bundle(store, r, done)
        if problems:
            return self._record_terminal(
                store,
                r,
                "failed",
                Exit.FAILED,
                "fleet import refused: " + "; ".join(problems[:5]),
                {"container_removed": None},
                event="fleet_import_refused",
            )
        with store.writer():
            if done.get("events") is not None:
                write_replace(d / "events.jsonl", done["events"])
            store.commit_file(d / "result.json", done["result"])
        res = InvocationResult.model_validate_json(done["result"])
        if error is not None:
            error.detail = {"invocation": r.inv_id}
            return FleetRun(r.plan, r.placement, node=r.node, error=error)
        out_dir = _materialise_outputs(store, res) if keep_outputs else None
        return FleetRun(
            r.plan,
            r.placement,
            node=r.node,
            outcome=Outcome(
                id=r.inv_id, result=res, out_dir=out_dir, meta=done.get("meta") or {}, where=self._where(r)
            ),
        )

    def _record_lost(self, store: Store, r: _Run) -> FleetRun:
        """The worker is gone mid-run: make sure its container is gone too, record the terminal state."""
        assert r.inv_id is not None
        cleanup = self._cleanup_on_node(r)
        if r.timed_out:
            return self._record_terminal(
                store, r, "timed_out", Exit.TIMED_OUT, str(r.lost), cleanup, event="fleet_timeout"
            )
        return self._record_terminal(
            store,
            r,
            "abandoned",
            Exit.FAILED,
            f"the fleet worker was lost: {r.lost}",
            cleanup,
            event="abandoned",
        )

    def _cleanup_on_node(self, r: _Run) -> dict[str, Any]:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node_id = (r.node or {}).get("node_id")
        if not node_id or r.inv_id is None:
            return {"container_removed": None, "reason": "the node is unknown"}
        ref = (
            ray.remote(_node_cleanup)
            .options(
                num_cpus=0,
                max_retries=0,
                scheduling_strategy=(NodeAffinitySchedulingStrategy(node_id, soft=False)),
            )
            .remote(r.inv_id)
        )
        ready, _ = ray.wait([ref], timeout=CLEANUP_TASK_TIMEOUT_S)
        if not ready:
            ray.cancel(ref, force=True)
            return {
                "container_removed": None,
                "node": r.node,
                "reason": f"the node did not answer a cleanup task within {CLEANUP_TASK_TIMEOUT_S:g}s "
                "(its watchdog removes the container if the machine is up)",
            }
        try:
            out: dict[str, Any] = ray.get(ref)
            return out
        except ray.exceptions.RayError as exc:
            return {
                "container_removed": None,
                "node": r.node,
                "reason": f"cleanup task failed: {str(exc).splitlines()[0][:300]} (the node may be gone; "
                "its watchdog removes the container if the machine is up)",
            }

    def _record_terminal(
        self,
        store: Store,
        r: _Run,
        state: Literal["failed", "timed_out", "abandoned"],
        code: Exit,
        reason: str,
        cleanup: dict[str, Any],
        event: str,
    ) -> FleetRun:
        assert r.inv_id is not None
        d = inv_dir(store, r.inv_id)
        Events(d / "events.jsonl")(event, {"reason": reason, "cleanup": cleanup})
        try:
            op = str(json.loads(d.joinpath("request.json").read_bytes()).get("op", r.plan.op))
        except (OSError, ValueError):
            op = r.plan.op
        res = InvocationResult(
            id=r.inv_id,
            op=op,
            state=state,
            exit_code=int(code),
            reason=reason,
            ended_at=now_iso(),
            cleanup=cleanup,
            request_sha256=sha256_file(d / "request.json"),
            events_sha256=sha256_file(d / "events.jsonl"),
        )
        from .canonical import canonical_bytes

        with store.writer():
            store.commit_file(d / "result.json", canonical_bytes(res))
        return FleetRun(
            r.plan,
            r.placement,
            node=r.node,
            outcome=Outcome(id=r.inv_id, result=res, out_dir=None, meta={}, where=self._where(r)),
        )

    def _where(self, r: _Run) -> dict[str, Any]:
        node = r.node or {}
        return {"fleet": self.address, "node_id": node.get("node_id"), "hostname": node.get("hostname")}


class FleetExecutor:
    """`invocation.execute` on the fleet, for the workflow (runner/executor.py's Executor).

    sticky: after the first invocation, every later one goes to the same node (and, when it used
    GPUs, the same GPU UUIDs), so that all the measurements of one experiment (its sequential
    looks) are pairs measured on one device. Ray still accounts a GPU of that node for each; the
    node's per-GPU flock serialises it with anything else on that device.
    """

    def __init__(
        self,
        fleet: Fleet,
        placement: Placement | None = None,
        ship: Ship = "auto",
        sticky: bool = True,
        gpu_model: str | None = None,
    ) -> None:
        self.fleet = fleet
        self.placement = placement
        self.ship: Ship = ship
        self.sticky = sticky
        self.gpu_model = gpu_model
        self.pinned: dict[str, Any] = {}  # node_id, devices: where the first invocation ran

    def __call__(
        self,
        store: Store,
        plan: Plan,
        progress: Callable[[str], None] | None = None,
        keep_outputs: bool = False,
    ) -> Outcome:
        where = (
            dataclasses.replace(self.placement)
            if self.placement
            else placement_for(plan, gpu_model=self.gpu_model)
        )
        if self.pinned:
            where.node_id = self.pinned["node_id"]
            if plan.gpus and self.pinned["devices"]:
                where.devices = list(self.pinned["devices"])
                where.num_gpus = len(where.devices)
        fr = self.fleet.run_many(
            store, [(plan, where)], progress=progress, keep_outputs=keep_outputs, ship=self.ship
        )[0]
        if self.sticky and not self.pinned and fr.node and fr.node.get("node_id") and fr.outcome is not None:
            ident = fr.outcome.result.identity
            self.pinned = {
                "node_id": fr.node["node_id"],
                "devices": [d.uuid for d in ident.devices] if ident is not None else [],
            }
        if fr.error is not None:
            raise fr.error
        assert fr.outcome is not None
        return fr.outcome

    def preflight(self, image: str, gpus: int) -> list[dict[str, str]]:
        """Some live node has the resources, a ready engine and the controller's pinned image."""
        entry = img.load_lock().images.get(image)
        if entry is None:
            return [
                {
                    "what": "image",
                    "reason": f"this controller's images.lock pins no {image} image: nodes cannot be checked",
                    "next_step": f"cko images build {image}" + (" --offline" if image == "cpu" else ""),
                }
            ]
        need = Placement(num_gpus=gpus, gpu_model=self.gpu_model).resource_request()
        if gpus:
            need["GPU"] = float(gpus)
        doc = self.fleet.status(probe=True)
        reasons: list[str] = []
        for n in doc["nodes"]:
            if not n["alive"]:
                continue
            name = f"{n['node_id'][:12]} ({n.get('hostname')})"
            res = n["resources"]
            lacking = [
                f"{k} {res.get(k, 0):g} of {v:g}" for k, v in sorted(need.items()) if res.get(k, 0) < v
            ]
            ck = n.get("cko") or {}
            im = (ck.get("images") or {}).get(image) or {}
            if lacking:
                reasons.append(f"{name}: has {', '.join(lacking)}")
            elif not ck.get("ready"):
                reasons.append(f"{name}: {'; '.join(ck.get('blockers') or ['not ready'])}")
            elif not im.get("ok"):
                reasons.append(f"{name}: image {image}: {im.get('reason')}")
            elif im.get("image_id") != entry.image_id:
                reasons.append(
                    f"{name}: pins {image} as {str(im.get('image_id'))[:19]}, the controller as {entry.image_id[:19]}"
                )
            else:
                return []
        return [
            {
                "what": "fleet",
                "reason": f"no node of {self.fleet.address} can run it: "
                + ("; ".join(reasons) or "no node is alive"),
                "next_step": "start a node with those resources and the same pinned image "
                "(cko fleet status shows each node; docs/fleet.md)",
            }
        ]


def _check_bundle(store: Store, r: _Run, done: dict[str, Any]) -> list[str]:
    """Every hash of the node's record checks out before the controller commits it."""
    problems: list[str] = []
    if done.get("result") is None or done.get("request") is None:
        return ["the node sent no result.json"]
    if done["request"] != r.request:
        problems.append("request.json differs from the one the node announced")
    try:
        res = InvocationResult.model_validate_json(done["result"])
    except (ValidationError, ValueError) as exc:
        return [f"result.json is not a valid invocation result: {str(exc).splitlines()[0]}"]
    if res.id != r.inv_id:
        problems.append(f"result.json names {res.id}, not {r.inv_id}")
    if res.request_sha256 != sha256_bytes(done["request"]):
        problems.append("result.json's request_sha256 does not match request.json")
    if res.events_sha256 is not None and (
        done.get("events") is None or res.events_sha256 != sha256_bytes(done["events"])
    ):
        problems.append("result.json's events_sha256 does not match events.jsonl")
    for ref in _object_refs(res):
        p = store.object_path(ref.sha256)
        if not p.is_file():
            problems.append(f"object {ref.name or ref.sha256[:16]} did not arrive")
        elif p.stat().st_size != ref.size:
            problems.append(f"object {ref.name or ref.sha256[:16]}: size {p.stat().st_size} != {ref.size}")
    return problems


def _materialise_outputs(store: Store, res: InvocationResult) -> Path:
    out = store.root / "scratch" / res.id / "out"
    out.mkdir(parents=True)
    for ref in res.outputs:
        rel = Path(ref.name or ref.sha256)
        if rel.is_absolute() or ".." in rel.parts:
            continue
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(store.read_object(ref.sha256))
    return out


def _prepare(
    store: Store, plan: Plan, ship: Ship
) -> tuple[dict[str, Any], dict[str, bytes], bytes | None, str | None]:
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
    policy_bytes = Path(policy_path).read_bytes() if policy_path else None
    entry = img.load_lock().images.get(plan.image)
    return wire, blobs, policy_bytes, entry.image_id if entry else None


def _public_resources(res: Mapping[str, float]) -> dict[str, float]:
    """Ray's resources without its internal per-node and memory entries."""
    return {
        k: float(v)
        for k, v in sorted(res.items())
        if not k.startswith("node:") and k not in ("memory", "object_store_memory")
    }


# -- several devices of one identity pool ---------------------------------------------------

Verdict = Literal["accepted", "below_minimum", "regressed", "inconclusive"]
POOL_FIELDS = tuple(k for k in MATTERS if k != "tools")


def identity_pool(identity: EnvironmentIdentity) -> dict[str, Any]:
    """The fields that make two devices one pool (model, architecture, driver, image, clocks...)."""
    return {k: _field_values(identity, k) for k in POOL_FIELDS}


class DeviceAnalysis(Closed):
    """One device's analysis of one experiment: every pair of it measured on that device."""

    device: str  # the GPU UUID
    node: str | None = None
    pool: dict[str, Any] = Field(default_factory=dict)
    verdict: Verdict
    effect_pct: float | None = None
    ci_low_pct: float | None = None
    ci_high_pct: float | None = None
    n_pairs: int | None = None
    experiment: dict[str, Any] | None = None  # a {id, sha256} reference, when it is a stored experiment


class CombinedVerdict(Closed):
    verdict: Verdict
    rule: str
    devices: list[DeviceAnalysis]
    agreement: bool
    effect_range_pct: list[float] | None = None
    reasons: list[str] = Field(default_factory=list)


COMBINE_RULE = (
    "per device, never pooled: accepted only if accepted on every device; regressed if regressed on "
    "any; below_minimum if every device is accepted or below_minimum and one is below; else "
    "inconclusive"
)


def analyse_device(
    device: str,
    reference: Sequence[float],
    candidate: Sequence[float],
    *,
    direction: str,
    min_effect_pct: float,
    confidence: float = 0.95,
    seed: int = 0,
    resamples: int = 4000,
    metric: str | None = None,
    node: str | None = None,
    pool: Mapping[str, Any] | None = None,
) -> DeviceAnalysis:
    """The paired comparison (operations.stats.compare) of the pairs measured on one device."""
    from operations import stats

    try:
        c = stats.compare(
            list(reference),
            list(candidate),
            direction=direction,
            min_effect_pct=min_effect_pct,
            confidence=confidence,
            seed=seed,
            resamples=resamples,
            metric=metric,
        )
    except stats.StatsInputError as exc:
        raise bad_request(f"device {device}: {exc}", field="samples") from None
    return DeviceAnalysis(
        device=device,
        node=node,
        pool=dict(pool or {}),
        verdict=c.verdict,
        effect_pct=c.effect_pct,
        ci_low_pct=c.ci_low_pct,
        ci_high_pct=c.ci_high_pct,
        n_pairs=c.n_pairs,
    )


def combine_per_device(results: Sequence[DeviceAnalysis | Mapping[str, Any]]) -> CombinedVerdict:
    """One verdict over devices of one identity pool, each analysed on its own (see COMBINE_RULE)."""
    from .workflow.analysis import combine

    devs: list[DeviceAnalysis] = []
    for i, r in enumerate(results):
        try:
            devs.append(r if isinstance(r, DeviceAnalysis) else DeviceAnalysis.model_validate(dict(r)))
        except ValidationError as exc:
            e = exc.errors()[0]
            raise bad_request(
                f"results[{i}].{'.'.join(str(x) for x in e['loc'])}: {e['msg']}", field=f"results[{i}]"
            ) from None
    if not devs:
        raise bad_request("results: no device to combine", field="results")
    seen: set[str] = set()
    for d in devs:
        if d.device in seen:
            raise bad_request(
                f"results: device {d.device} appears twice; one analysis per device", field="results"
            )
        seen.add(d.device)
    pools = [d.pool for d in devs if d.pool]
    if pools and any(p != pools[0] for p in pools[1:]):
        differ = sorted({k for p in pools for k in set(p) | set(pools[0]) if p.get(k) != pools[0].get(k)})
        raise bad_request(
            f"results: devices of different identity pools cannot be combined (differ in "
            f"{', '.join(differ)})",
            field="results",
            code="mixed_identity_pool",
        )
    verdict: Verdict = combine([d.verdict for d in devs])  # type: ignore[assignment]
    effects = [d.effect_pct for d in devs if d.effect_pct is not None]
    reasons = (
        [f"{d.device}: {d.verdict}" for d in devs if d.verdict != "accepted"] if verdict != "accepted" else []
    )
    if len(pools) < len(devs):
        reasons.append("some devices carry no identity pool: their sameness was not checked")
    return CombinedVerdict(
        verdict=verdict,
        rule=COMBINE_RULE,
        devices=devs,
        agreement=len({d.verdict for d in devs}) == 1,
        effect_range_pct=[min(effects), max(effects)] if effects else None,
        reasons=reasons,
    )
