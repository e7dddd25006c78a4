"""The artifact store: content-addressed objects, immutable canonical records, one mutable pointer.

Only the host controller writes here. Every write is atomic (temp file + fsync + link/rename) and
records are never overwritten: a second write of the same id is an error, so a reference
`{id, sha256}` stays valid forever or is detected as broken by `verify`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from . import ledger
from .canonical import canonical_bytes, sha256_bytes, sha256_file
from .errors import CkoError, Exit, bad_request, failed
from .locks import FileLock

RECORD_KINDS = ("targets", "variants", "experiments", "baselines", "stackaudits")
ID_RE = re.compile(r"^[a-z]{2,5}-[0-9]{8}T[0-9]{6}-[0-9a-f]{6,12}$")
M = TypeVar("M", bound=BaseModel)


def new_id(prefix: str) -> str:
    return f"{prefix}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(4)}"


def check_id(value: str, field: str = "id") -> str:
    if not ID_RE.match(value):
        raise bad_request(f"{field}: {value!r} is not a cko record id", field=field)
    return value


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_temp(directory: Path, data: bytes) -> Path:
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return Path(tmp)


def write_new(path: Path, data: bytes) -> None:
    """Create `path` with `data` atomically; fail if it exists (records are immutable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _write_temp(path.parent, data)
    try:
        os.link(tmp, path)
    except FileExistsError as exc:
        raise CkoError(f"refusing to overwrite {path}", exit_code=Exit.FAILED, code="immutable") from exc
    finally:
        os.unlink(tmp)
    _fsync_dir(path.parent)


def write_replace(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _write_temp(path.parent, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


class Store:
    """An artifact root (DESIGN.md, Store)."""

    def __init__(self, root: str | Path, create: bool = True) -> None:
        self.root = Path(root).absolute()
        if self.root.exists() and not self.root.is_dir():
            raise bad_request(f"--store: {self.root} exists and is not a directory", field="store")
        if not self.root.exists():
            if not create:
                raise bad_request(f"--store: {self.root} does not exist", field="store")
            try:
                self.root.mkdir(parents=True)
            except OSError as exc:
                raise bad_request(
                    f"--store: cannot create {self.root}: {exc.strerror}", field="store"
                ) from exc
        for sub in ("objects/sha256", "invocations", "champion/selections", *RECORD_KINDS):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(self.root / ".writer.lock")
        self._ledger_lock = FileLock(self.root / ".ledger.lock")

    # -- layout: every path under the store is named here, nowhere else -----------------------
    def at(self, rel: str) -> Path:
        """A path the ledger names (relative to the root)."""
        return self.root / rel

    def kind_dir(self, kind: str) -> Path:
        """The directory of one kind of immutable record (RECORD_KINDS, or a command's own kind)."""
        return self.root / kind

    @property
    def invocations_dir(self) -> Path:
        return self.root / "invocations"

    def invocation_dir(self, inv_id: str) -> Path:
        return self.invocations_dir / inv_id

    def invocation_result(self, inv_id: str) -> Path:
        return self.invocation_dir(inv_id) / "result.json"

    def scratch(self, name: str | None = None) -> Path:
        """Working space of running operations (never referenced by a record)."""
        return self.root / "scratch" if name is None else self.root / "scratch" / name

    @property
    def objects_dir(self) -> Path:
        return self.root / "objects" / "sha256"

    @property
    def pointers_dir(self) -> Path:
        """The champion pointers, one per Target (the store's only mutable files)."""
        return self.root / "champion"

    def pointer_path(self, target_id: str) -> Path:
        return self.pointers_dir / f"{target_id}.json"

    @property
    def selections_dir(self) -> Path:
        return self.pointers_dir / "selections"

    def selection_path(self, selection_id: str) -> Path:
        return self.selections_dir / f"{selection_id}.json"

    def quarantine_dir(self, stamp: str) -> Path:
        return self.root / "quarantine" / stamp

    def report_path(self, name: str) -> Path:
        """Files a command writes for people beside the records (the demo's report and JUnit)."""
        return self.root / name

    # -- ledger: every immutable record, hash-chained, so even an unreferenced one is checked --
    @property
    def ledger_path(self) -> Path:
        return self.root / "ledger.jsonl"

    def commit_file(self, path: Path, data: bytes) -> str:
        """Write an immutable record file and append it to the ledger; returns its sha256.

        A record is committed when its ledger line is: the file is written first (temp, fsync,
        link), then the line (append, fsync). A failure of the append (a full disk) truncates the
        ledger back and removes the file, so nothing half-committed is left; a crash between the
        two leaves a file with no line, which `cko repair` quarantines (it was never committed)."""
        write_new(path, data)
        digest = sha256_bytes(data)
        rel = str(path.relative_to(self.root))
        try:
            with self._ledger_lock.hold(timeout=30, what="store ledger"):
                ledger.append(self, rel, digest)
        except BaseException:
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        return digest

    def ledger(self) -> list[dict[str, Any]]:
        if not self.ledger_path.exists():
            return []
        return [json.loads(x) for x in self.ledger_path.read_bytes().splitlines() if x.strip()]

    # -- locking ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def writer(self, timeout: float = 30.0) -> Iterator[None]:
        """One writer per store; held only around commits, never during a container run."""
        with self._lock.hold(timeout=timeout, what=f"store writer lock {self.root}"):
            yield

    # -- objects ---------------------------------------------------------------------------
    def object_path(self, digest: str) -> Path:
        return self.objects_dir / digest[:2] / digest

    def put_bytes(self, data: bytes) -> dict[str, Any]:
        digest = sha256_bytes(data)
        path = self.object_path(digest)
        if not path.exists():
            try:
                write_new(path, data)
            except CkoError:
                pass  # written concurrently with the same content: same digest, same bytes
        return {"sha256": digest, "size": len(data)}

    def put_file(self, src: str | Path, field: str = "path") -> dict[str, Any]:
        """Store a host file: resolved once, no link followed, within the policy's mount_roots
        (system policy narrowed by $CKO_POLICY), a regular single-named file, read by descriptor."""
        from . import hostpath
        from .policy import load_policy

        policy, _ = load_policy(None)
        return self.put_bytes(hostpath.read_file(src, field, policy))

    def put_fd(self, fd: int) -> dict[str, Any]:
        """Store what an open descriptor holds (collection reads by descriptor, never by path)."""
        from .hostpath import read_all

        return self.put_bytes(read_all(fd, 1 << 40, "output", "output"))

    def put_json(self, obj: Any) -> dict[str, Any]:
        return self.put_bytes(canonical_bytes(obj))

    def read_object(self, digest: str, verify: bool = True) -> bytes:
        path = self.object_path(digest)
        if not path.is_file():
            raise failed(f"object {digest} is missing from the store", code="missing_object")
        data = path.read_bytes()
        if verify and sha256_bytes(data) != digest:
            raise failed(f"object {digest} was altered (hash mismatch)", code="altered_object")
        return data

    def read_json_object(self, digest: str) -> Any:
        return json.loads(self.read_object(digest))

    # -- records ---------------------------------------------------------------------------
    def record_path(self, kind: str, record_id: str) -> Path:
        if kind not in RECORD_KINDS:
            raise ValueError(kind)
        check_id(record_id)
        return self.kind_dir(kind) / f"{record_id}.json"

    def put_record(self, kind: str, record_id: str, model: BaseModel) -> dict[str, str]:
        data = canonical_bytes(model)
        return {"id": record_id, "sha256": self.commit_file(self.record_path(kind, record_id), data)}

    def get_record(
        self, kind: str, record_id: str, cls: type[M], sha256: str | None = None
    ) -> tuple[M, dict[str, str]]:
        path = self.record_path(kind, record_id)
        if not path.is_file():
            raise bad_request(f"no {kind[:-1]} {record_id} in {self.root}", field=kind[:-1])
        data = path.read_bytes()
        digest = sha256_bytes(data)
        if sha256 is not None and digest != sha256:
            raise failed(
                f"{kind[:-1]} {record_id} was altered: sha256 {digest} != referenced {sha256}",
                code="altered_record",
            )
        try:
            model = cls.model_validate_json(data)
        except ValidationError as exc:
            raise failed(
                f"{kind[:-1]} {record_id} is not a valid record: {exc.errors()[0]['msg']}",
                code="corrupt_record",
            ) from exc
        return model, {"id": record_id, "sha256": digest}

    def list_records(self, kind: str) -> list[str]:
        return sorted(p.stem for p in self.kind_dir(kind).glob("*.json") if ID_RE.match(p.stem))

    # -- champion pointer (the one mutable file) -------------------------------------------
    @property
    def champion_path(self) -> Path:
        return self.pointers_dir / "current.json"

    def champion_digest(self) -> str | None:
        p = self.champion_path
        return sha256_file(p) if p.is_file() else None

    def swap_champion(self, expected_digest: str | None, data: bytes) -> None:
        """Compare-and-swap on the pointer's digest, under the writer lock."""
        current = self.champion_digest()
        if current != expected_digest:
            raise CkoError(
                f"champion pointer changed since it was read (expected {expected_digest}, found {current})",
                exit_code=Exit.FAILED,
                code="champion_conflict",
                field="expected_champion",
            )
        write_replace(self.champion_path, data)
