"""Content snapshots of a workload directory: a manifest of (path, sha256, mode) in objects/."""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import hostpath
from ..canonical import canonical_bytes, sha256_bytes
from ..errors import CkoError, bad_request
from ..models import ObjectRef
from ..store import Store
from .records import Snapshot

SKIP_DIRS = {"__pycache__", ".git", ".pytest_cache", ".mypy_cache", ".ruff_cache", "build", "cko-store"}
MAX_FILES = 5000
MAX_BYTES = 512 << 20


def _excluded(rel: str, exclude: list[str]) -> bool:
    return any(rel == e or rel.startswith(e.rstrip("/") + "/") or fnmatch.fnmatch(rel, e) for e in exclude)


@dataclass(frozen=True)
class Captured:
    """A file's bytes as read through the walk's descriptor (never re-opened by path)."""

    data: bytes


def scan(root: Path, exclude: list[str], field: str = "workload") -> list[tuple[str, Captured, int]]:
    """(relative path, its bytes, mode) of every regular file, read once by descriptor.

    The directory is a host path a request names: resolved once without following a swapped link,
    within the policy's mount_roots, never under /proc, /sys, /dev (runner/hostpath.py). Symbolic
    links, devices, FIFOs, sockets and hard-linked files are refused by name."""
    from ..policy import load_policy

    policy, _ = load_policy(None)

    def skip(rel: str, is_dir: bool) -> bool:
        name = rel.rsplit("/", 1)[-1]
        if is_dir and name in SKIP_DIRS:
            return True
        return _excluded(rel, exclude) or (not is_dir and name.endswith(".pyc"))

    out = []
    with hostpath.open_dir(root, field, policy) as op:
        try:
            for e in hostpath.walk(op, field, skip=skip, max_files=MAX_FILES, max_bytes=MAX_BYTES):
                data = hostpath.read_all(e.fd, MAX_BYTES, e.rel, field)
                out.append((e.rel, Captured(data), 0o755 if e.st.st_mode & 0o111 else 0o644))
        except CkoError as err:
            if "symbolic link" in err.message:
                raise bad_request(
                    f"{field}: {err.message.split(': ', 1)[-1]}; snapshots hold regular files only",
                    field=field,
                ) from None
            raise
    return out


def manifest_of(store: Store, files: list[tuple[str, Captured, int]]) -> dict[str, Any]:
    entries = []
    for rel, cap, mode in files:
        ref = store.put_bytes(cap.data)
        entries.append({"path": rel, "sha256": ref["sha256"], "size": ref["size"], "mode": mode})
    return {"kind": "cko/snapshot-v1", "files": entries}


def commit(store: Store, manifest: dict[str, Any]) -> Snapshot:
    # Canonical: files sorted by path, so the identity depends on content only, never on the order
    # a directory walk met them in (subdirectories come after a directory's files in os.walk).
    manifest = manifest | {"files": sorted(manifest["files"], key=lambda f: f["path"])}
    data = canonical_bytes(manifest)
    ref = store.put_bytes(data)
    return Snapshot(
        sha256=sha256_bytes(data),
        manifest=ObjectRef(sha256=ref["sha256"], size=ref["size"], name="snapshot.json"),
        files=len(manifest["files"]),
        bytes=sum(f["size"] for f in manifest["files"]),
    )


def take(store: Store, root: Path, exclude: list[str]) -> Snapshot:
    return commit(store, manifest_of(store, scan(root, exclude)))


def content_key(store: Store, sha: str) -> str:
    """The content of a snapshot, independent of how its manifest was written: sorted (path, sha256)."""
    files = json.loads(store.read_object(sha)).get("files", [])
    return sha256_bytes(canonical_bytes(sorted([f["path"], f["sha256"]] for f in files)))


def load_manifest(store: Store, snap: Snapshot) -> dict[str, Any]:
    data = store.read_object(snap.manifest.sha256)
    if sha256_bytes(data) != snap.sha256:
        raise ValueError("snapshot manifest altered")
    return dict(json.loads(data))


def materialize(store: Store, snap: Snapshot, dest: Path, leave_out: list[str] | None = None) -> Path:
    """Write the snapshot's files (verified against their hashes) into dest, read-only.

    `leave_out`: paths (as in allowed_paths) not written — the harness's view of the original
    holds no subject code, so the supervisor cannot import any."""
    manifest = load_manifest(store, snap)
    dest.mkdir(parents=True, exist_ok=False)
    for f in manifest["files"]:
        if leave_out and _excluded(f["path"], leave_out):
            continue
        p = dest / f["path"]
        if ".." in Path(f["path"]).parts or Path(f["path"]).is_absolute():
            raise ValueError(f"bad path in snapshot: {f['path']}")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(store.read_object(f["sha256"]))
        p.chmod(0o555 if f["mode"] & 0o111 else 0o444)
    for d in sorted({p for p in dest.rglob("*") if p.is_dir()}, reverse=True):
        d.chmod(0o555)
    dest.chmod(0o555)
    return dest


def remove_tree(path: Path) -> None:
    hostpath.remove_tree(path)  # no recursion, no link followed, read-only directories made writable
