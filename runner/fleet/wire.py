"""The fleet's wire format: every message between the controller and a node, one pydantic model each.

How a Plan travels: a Plan is plain data plus Mount paths. Its fields go as they are; a read-only
mount (harness, subjects, a request file) is shipped as bytes by default (`ship="auto"`) and
materialised read-only on the node, verified against its hash; a read-write mount is never
shipped and its path must exist on the node (`ship="none"` makes every mount such a path).
Outputs never travel through a mount: the container writes /cko/out and those files come back as
objects of the invocation.

The messages cross Ray as plain data (`model_dump()`: dicts, lists, str, bytes) and are validated
by the side that receives them (`model_validate`), never unpickled as objects: a node and a
controller of different cko versions disagree loudly here rather than somewhere downstream. The
shipped bytes travel beside the StartCall as one Ray object (`Blobs`, by sha256), not inside it.
The calls, in order, on the node's actor: start(StartCall) -> Started | NotStarted; finish() ->
Done; read_objects(ReadObjects) -> ObjectBatch; close(). Two one-off tasks answer NodeProbe
(`cko fleet status`) and CleanupReport (a lost invocation's node).
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, model_validator

from .. import sandbox
from ..canonical import sha256_bytes
from ..errors import CkoError, Exit, bad_request, failed
from ..invocation import Plan
from ..models import Closed
from ..workers import WorkerLaunch

MAX_SHIP_BYTES = 1 << 30  # inputs shipped with one invocation
Ship = Literal["auto", "none"]
Blobs = dict[str, bytes]  # shipped bytes by sha256


# -- the Plan -------------------------------------------------------------------------------


class ShippedFile(Closed):
    """A mount whose source is one file, shipped as bytes."""

    kind: Literal["file"] = "file"
    name: str
    sha256: str
    mode: int  # 0o555 if the source was executable, else 0o444


class ShippedEntry(Closed):
    """One regular file of a shipped directory, by its path relative to the directory."""

    path: str
    sha256: str
    mode: int


class ShippedDir(Closed):
    """A mount whose source is a directory: its regular files and its (sub)directories."""

    kind: Literal["dir"] = "dir"
    files: list[ShippedEntry]
    dirs: list[str]


class WireMount(Closed):
    """A mount as it travels: shipped as bytes (read-only), or a path that exists on the node."""

    target: str
    read_only: bool
    shipped: Annotated[ShippedFile | ShippedDir, Field(discriminator="kind")] | None = None
    source: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> WireMount:
        if (self.shipped is None) == (self.source is None):
            raise ValueError("a mount is either shipped or names a source on the node")
        return self


class WireWorker(Closed):
    """A measuring stage's worker (`workers.WorkerLaunch`), its mounts shipped like the Plan's."""

    subject: str
    uid: int
    command: list[str]
    env: dict[str, str]
    workdir: str
    keep: list[str] = Field(default_factory=list)
    mounts: list[WireMount]


class WirePlan(Closed):
    """A Plan as plain data: its own fields as they are, its mounts and workers as above."""

    plan: dict[str, Any]  # the Plan's fields but mounts, policy_path and workers (JSON values)
    mounts: list[WireMount]
    workers: list[WireWorker] = Field(default_factory=list)


# -- the calls and their answers ------------------------------------------------------------


class NodeInfo(Closed):
    """Where a node-side call ran: the Ray node, the worker's pid, the host."""

    node_id: str
    pid: int
    hostname: str


class StartCall(Closed):
    """controller -> node: run this Plan (its shipped bytes travel beside it as one Ray object)."""

    plan: WirePlan
    devices: list[str] = Field(default_factory=list)  # pinned GPU UUIDs: a later look of one experiment
    policy: bytes | None = None  # the controller's policy file, unless the node has its own
    pin: str | None = None  # the image id the controller's lock pins for the Plan's image


class Started(Closed):
    """node -> controller: the invocation exists on the node; its request.json as written there."""

    kind: Literal["started"] = "started"
    id: str
    request: bytes
    node: NodeInfo


class NotStarted(Closed):
    """node -> controller: nothing was recorded on the node (the answer comes with finish)."""

    kind: Literal["not_started"] = "not_started"
    node: NodeInfo


StartReply = Annotated[Started | NotStarted, Field(discriminator="kind")]
START_REPLY: TypeAdapter[Started | NotStarted] = TypeAdapter(StartReply)


class WireError(Closed):
    """A CkoError as it travels: everything the controller needs to raise the same one."""

    message: str
    exit_code: int
    code: str
    field: str | None = None
    invocation: str | None = None

    @classmethod
    def of(cls, err: CkoError) -> WireError:
        return cls(
            message=err.message,
            exit_code=int(err.exit_code),
            code=err.code,
            field=err.field,
            invocation=err.detail.get("invocation"),
        )

    def error(self) -> CkoError:
        return CkoError(self.message, exit_code=Exit(self.exit_code), code=self.code, field=self.field)


class Wanted(Closed):
    """An object the result names, to fetch unless the controller's store has it."""

    sha256: str
    size: int = Field(ge=0)


class Done(Closed):
    """node -> controller: the terminal records of the invocation (none when it never started)."""

    kind: Literal["done"] = "done"
    node: NodeInfo
    id: str | None = None
    objects: list[Wanted] = Field(default_factory=list)
    error: WireError | None = None
    meta: dict[str, Any] | None = None  # the Outcome's meta (the probe's findings), on success
    request: bytes | None = None
    events: bytes | None = None
    result: bytes | None = None


class ReadObjects(Closed):
    """controller -> node: one batch of objects to send (at most TRANSFER_BATCH_BYTES together)."""

    digests: list[str]


class ObjectBatch(Closed):
    """node -> controller: the bytes of the objects asked for, by sha256 (checked on arrival)."""

    objects: dict[str, bytes]


class CleanupReport(Closed):
    """node -> controller: what a cleanup task found of a lost invocation's containers."""

    confirmed_by: str
    node: NodeInfo
    found_containers: int
    container_removed: bool
    removals: list[dict[str, Any]]
    leftover: str | None


class EngineProbe(Closed):
    ok: bool
    version: str | None = None
    reason: str | None = None


class ImageProbe(Closed):
    ok: bool
    image_id: str | None
    reason: str | None = None


class GpuProbe(Closed):
    available: bool
    count: int
    names: list[str]
    reason: str | None


class NodeProbe(Closed):
    """node -> controller: the readiness of one node for cko (`cko fleet status`).

    Sent and read back with exclude_unset, so an optional field not set (an engine's version when
    it is down) is absent from `cko fleet status`, not null.
    """

    node: NodeInfo
    cko_version: str
    python: str
    scratch: str
    policy: str | None
    engine: EngineProbe
    images: dict[str, ImageProbe]
    gpus: GpuProbe
    scratch_writable: bool
    ready: bool
    blockers: list[str]


# -- a Plan to the wire and back ------------------------------------------------------------


def _file_mode(st_mode: int) -> int:
    return 0o555 if st_mode & 0o111 else 0o444


class _Packer:
    """Collects the bytes of the mounts to ship, within MAX_SHIP_BYTES for the whole Plan."""

    def __init__(self) -> None:
        self.blobs: Blobs = {}
        self.total = 0

    def add(self, source: str, p: Path) -> tuple[str, int]:
        data = p.read_bytes()
        self.total += len(data)
        if self.total > MAX_SHIP_BYTES:
            raise bad_request(
                f"mount {source}: more than {MAX_SHIP_BYTES} bytes of inputs to ship; mount a path "
                "that exists on the nodes instead (ship='none')",
                field="mount",
            )
        digest = sha256_bytes(data)
        self.blobs[digest] = data
        return digest, _file_mode(p.stat().st_mode)

    def pack(self, source: str) -> ShippedFile | ShippedDir:
        src = Path(source)
        if src.is_symlink():
            src = src.resolve()
        if src.is_file():
            digest, mode = self.add(source, src)
            return ShippedFile(name=src.name, sha256=digest, mode=mode)
        if not src.is_dir():
            raise bad_request(
                f"mount source {source} does not exist (or is not a file or directory)", field="mount"
            )
        return self._pack_dir(source, src)

    def _pack_dir(self, source: str, src: Path) -> ShippedDir:
        files: list[ShippedEntry] = []
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
                digest, mode = self.add(source, p)
                files.append(ShippedEntry(path=str(p.relative_to(src)), sha256=digest, mode=mode))
        return ShippedDir(files=files, dirs=dirs)

    def mounts(self, mounts: list[sandbox.Mount], ship: Ship) -> list[WireMount]:
        out: list[WireMount] = []
        for m in mounts:
            if ship == "auto" and m.read_only:
                out.append(WireMount(target=m.target, read_only=True, shipped=self.pack(m.source)))
                continue
            if not Path(m.source).is_absolute():
                raise bad_request(
                    f"mount {m.source}: a mount that is not shipped names a path on the node; give it absolute",
                    field="mount",
                )
            out.append(WireMount(target=m.target, read_only=m.read_only, source=m.source))
        return out


def plan_to_wire(plan: Plan, ship: Ship = "auto") -> tuple[WirePlan, Blobs]:
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
    packer = _Packer()
    mounts = packer.mounts(plan.mounts, ship)
    workers = [
        WireWorker(
            subject=w.subject,
            uid=w.uid,
            command=list(w.command),
            env=dict(w.env),
            workdir=w.workdir,
            keep=list(w.keep),
            mounts=packer.mounts(w.mounts, ship),
        )
        for w in plan.workers
    ]
    return WirePlan(plan=fields, mounts=mounts, workers=workers), packer.blobs


def _write_blob(path: Path, blobs: Mapping[str, bytes], digest: str, mode: int) -> None:
    data = blobs.get(digest)
    if data is None or sha256_bytes(data) != digest:
        raise failed(f"shipped input {path.name}: bytes missing or altered in transit", code="ship_corrupt")
    path.write_bytes(data)
    path.chmod(mode)


def _unpack_dir(shipped: ShippedDir, blobs: Mapping[str, bytes], source: Path) -> None:
    source.mkdir()
    for name in shipped.dirs:
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise failed(f"shipped input: bad path {name!r}", code="ship_corrupt")
        (source / name).mkdir(parents=True, exist_ok=True)
    for f in shipped.files:
        rel = Path(f.path)
        if rel.is_absolute() or ".." in rel.parts:
            raise failed(f"shipped input: bad path {rel}", code="ship_corrupt")
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        _write_blob(source / rel, blobs, f.sha256, f.mode)
    for d in sorted((p for p in source.rglob("*") if p.is_dir()), reverse=True):
        d.chmod(0o555)
    source.chmod(0o555)


def _mounts_from_wire(wire: list[WireMount], blobs: Mapping[str, bytes], dest: Path) -> list[sandbox.Mount]:
    mounts: list[sandbox.Mount] = []
    for i, m in enumerate(wire):
        shipped = m.shipped
        if shipped is None:
            assert m.source is not None  # WireMount: one or the other
            mounts.append(sandbox.Mount(m.source, m.target, read_only=m.read_only))
            continue
        root = dest / str(i)
        root.mkdir(parents=True)
        root.chmod(0o755)
        if isinstance(shipped, ShippedFile):
            name = Path(shipped.name).name
            _write_blob(root / name, blobs, shipped.sha256, shipped.mode)
            source = root / name
        else:
            source = root / "d"
            _unpack_dir(shipped, blobs, source)
        mounts.append(sandbox.Mount(str(source), m.target, read_only=True))
    return mounts


def plan_from_wire(wire: WirePlan, blobs: Mapping[str, bytes], dest: Path) -> Plan:
    """Rebuild the Plan on a node: shipped inputs are written (read-only, verified) under dest."""
    plan = Plan(**wire.plan)
    plan.mounts = _mounts_from_wire(wire.mounts, blobs, dest)
    plan.workers = [
        WorkerLaunch(
            subject=w.subject,
            uid=w.uid,
            command=list(w.command),
            env=dict(w.env),
            workdir=w.workdir,
            keep=tuple(w.keep),
            mounts=_mounts_from_wire(w.mounts, blobs, dest / f"w{i}"),
        )
        for i, w in enumerate(wire.workers)
    ]
    return plan
