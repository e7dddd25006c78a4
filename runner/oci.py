"""Reproducible image archives: layers and config written here, then `docker load`ed.

`docker build` stamps every layer with the time it ran and every config with `created`, so two
builds of the same inputs never share an id. Like apko, ko and rules_oci, cko writes the image
itself instead: each layer is a tar with entries in sorted order, every mtime set to one epoch
(SOURCE_DATE_EPOCH), no user or group names, and nothing the build machine leaves behind; the
config names those layers by digest and carries the same epoch. The image id is the digest of the
config, so the same inputs give the same id on any machine and any engine.

An archive holds both layouts: an OCI image layout (oci-layout, index.json, blobs/sha256/...) for
registries and OCI tools, and Docker's manifest.json (pointing at the same blobs) so that
`docker load` on Engine 20.10, which reads only the latter, takes it too.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

# 1980-01-01: the earliest time zip (and so wheels) can say; any fixed value would do.
DEFAULT_EPOCH = 315532800
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
CHUNK = 1 << 20


def epoch() -> int:
    value = os.environ.get("SOURCE_DATE_EPOCH")
    return int(value) if value and value.isdigit() else DEFAULT_EPOCH


def canonical_json(doc: Any) -> bytes:
    """One byte string per document: sorted keys, no spaces (the config's digest is the image id)."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256_path(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


# -- layers -----------------------------------------------------------------------------------

Skip = Callable[[str], bool]


class LayerWriter:
    """One deterministic layer tar: add directories and trees; entries come out sorted by path."""

    def __init__(self, out: Path, mtime: int | None = None) -> None:
        self.out = out
        self.mtime = epoch() if mtime is None else mtime
        self._entries: dict[str, tuple[tarfile.TarInfo, Path | None]] = {}
        self._data: dict[str, bytes] = {}

    def _norm(self, ti: tarfile.TarInfo, owner: tuple[int, int] | None) -> tarfile.TarInfo:
        ti.mtime = self.mtime
        ti.uname = ti.gname = ""  # names differ between machines; numeric ids are what a container sees
        if owner is not None:
            ti.uid, ti.gid = owner
        ti.mode &= 0o7777
        ti.pax_headers = {}
        return ti

    def add_dir(self, arcname: str, mode: int = 0o755, uid: int = 0, gid: int = 0) -> None:
        ti = tarfile.TarInfo(arcname.strip("/"))
        ti.type, ti.mode, ti.uid, ti.gid = tarfile.DIRTYPE, mode, uid, gid
        self._entries[ti.name] = (self._norm(ti, None), None)

    def add_parents(self, arcname: str) -> None:
        parts = arcname.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            name = "/".join(parts[:i])
            if name not in self._entries:
                self.add_dir(name)

    def add_bytes(self, arcname: str, data: bytes, mode: int = 0o644) -> None:
        ti = tarfile.TarInfo(arcname.strip("/"))
        ti.size, ti.mode = len(data), mode
        self.add_parents(ti.name)
        self._entries[ti.name] = (self._norm(ti, (0, 0)), None)
        self._data[ti.name] = data

    def add_tree(
        self, src: Path, arcbase: str = "", *, owner: tuple[int, int] | None = None, skip: Skip | None = None
    ) -> None:
        """Everything under `src` as `arcbase/...` (arcbase "" = the layer's root)."""
        base = arcbase.strip("/")
        if base:
            self.add_parents(base + "/x")
        for path in _walk(src):
            rel = path.relative_to(src).as_posix()
            arc = f"{base}/{rel}" if base and rel != "." else (base or rel)
            if arc in ("", ".") or (skip and skip(rel)):
                continue
            st = path.lstat()
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                continue  # device nodes, sockets, fifos: the engine provides /dev
            ti = tarfile.TarInfo(arc)
            ti.mode, ti.uid, ti.gid = st.st_mode & 0o7777, st.st_uid, st.st_gid
            if stat.S_ISDIR(st.st_mode):
                ti.type = tarfile.DIRTYPE
            elif stat.S_ISLNK(st.st_mode):
                ti.type, ti.linkname = tarfile.SYMTYPE, os.readlink(path)
            else:
                ti.size = st.st_size
            if owner is not None:  # a tree from this host: its modes follow the umask, so say them
                ti.mode = 0o755 if (ti.isdir() or ti.mode & 0o111) else 0o644
            self._entries[arc] = (self._norm(ti, owner), path if ti.isreg() else None)

    def write(self) -> str:
        """Write the tar; returns its sha256 (the layer's diff id and, uncompressed, its digest).

        Hard links are stored as copies: which name is the link depends on directory order.
        """
        data = self._data
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out.with_name(self.out.name + ".part")
        with open(tmp, "wb") as raw:
            with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
                for name in sorted(self._entries):
                    ti, src = self._entries[name]
                    if name in data:
                        tar.addfile(ti, io.BytesIO(data[name]))
                    elif src is not None:
                        with open(src, "rb") as f:
                            tar.addfile(ti, f)
                    else:
                        tar.addfile(ti)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, self.out)
        return sha256_path(self.out)


def _walk(root: Path) -> Iterable[Path]:
    yield root
    stack = [root]
    while stack:
        d = stack.pop()
        with os.scandir(d) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            p = Path(e.path)
            yield p
            if e.is_dir(follow_symlinks=False):
                stack.append(p)


# -- image config and archive -------------------------------------------------------------------


@dataclass
class Layer:
    path: Path
    digest: str  # hex sha256 of the uncompressed tar
    comment: str


def image_config(
    layers: list[Layer],
    *,
    env: dict[str, str],
    user: str,
    workdir: str,
    labels: dict[str, str],
    mtime: int | None = None,
) -> dict[str, Any]:
    created = datetime.fromtimestamp(epoch() if mtime is None else mtime, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": {
            "Env": [f"{k}={v}" for k, v in env.items()],
            "User": user,
            "WorkingDir": workdir,
            "Labels": dict(sorted(labels.items())),
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{la.digest}" for la in layers]},
        "history": [{"created": created, "created_by": la.comment} for la in layers],
    }


def _add_blob(tar: tarfile.TarFile, name: str, src: Path | bytes, mtime: int) -> None:
    ti = tarfile.TarInfo(name)
    ti.mtime, ti.mode = mtime, 0o644
    if isinstance(src, bytes):
        ti.size = len(src)
        tar.addfile(ti, io.BytesIO(src))
    else:
        ti.size = src.stat().st_size
        with open(src, "rb") as f:
            tar.addfile(ti, f)


def write_archive(
    out: Path, layers: list[Layer], config: dict[str, Any] | bytes, ref: str | None = None
) -> dict[str, str]:
    """The archive (OCI layout + docker manifest.json); returns image id, manifest digest, archive digest.

    A config given as bytes is kept byte for byte (an image made elsewhere: its id is their digest)."""
    cfg = config if isinstance(config, bytes) else canonical_json(config)
    cfg_hex = hashlib.sha256(cfg).hexdigest()
    manifest = canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": f"sha256:{cfg_hex}", "size": len(cfg)},
            "layers": [
                {"mediaType": OCI_LAYER, "digest": f"sha256:{la.digest}", "size": la.path.stat().st_size}
                for la in layers
            ],
        }
    )
    man_hex = hashlib.sha256(manifest).hexdigest()
    desc: dict[str, Any] = {"mediaType": OCI_MANIFEST, "digest": f"sha256:{man_hex}", "size": len(manifest)}
    if ref:
        desc["annotations"] = {"org.opencontainers.image.ref.name": ref}
    index = canonical_json({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [desc]})
    docker_manifest = canonical_json(
        [
            {
                "Config": f"blobs/sha256/{cfg_hex}",
                "RepoTags": [ref] if ref else None,
                "Layers": [f"blobs/sha256/{la.digest}" for la in layers],
            }
        ]
    )
    mtime = epoch()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    with open(tmp, "wb") as raw:
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
            _add_blob(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}', mtime)
            _add_blob(tar, "index.json", index, mtime)
            _add_blob(tar, "manifest.json", docker_manifest, mtime)
            for la in sorted({la.digest: la for la in layers}.values(), key=lambda la: la.digest):
                _add_blob(tar, f"blobs/sha256/{la.digest}", la.path, mtime)
            _add_blob(tar, f"blobs/sha256/{cfg_hex}", cfg, mtime)
            _add_blob(tar, f"blobs/sha256/{man_hex}", manifest, mtime)
        raw.flush()
        os.fsync(raw.fileno())
    os.replace(tmp, out)
    return {
        "image_id": f"sha256:{cfg_hex}",
        "manifest_digest": f"sha256:{man_hex}",
        "archive_sha256": sha256_path(out),
    }


def read_archive(path: Path) -> dict[str, Any]:
    """The archive's image id, manifest digest and layer digests, each checked against its bytes."""
    with tarfile.open(path, "r:") as tar:
        names = {m.name: m for m in tar.getmembers()}

        def blob(name: str) -> bytes:
            f = tar.extractfile(names[name])
            assert f is not None
            return f.read()

        index = json.loads(blob("index.json"))
        man_digest = index["manifests"][0]["digest"]
        manifest_bytes = blob(f"blobs/sha256/{man_digest.split(':', 1)[1]}")
        if hashlib.sha256(manifest_bytes).hexdigest() != man_digest.split(":", 1)[1]:
            raise ValueError(f"{path}: manifest does not match its digest")
        manifest = json.loads(manifest_bytes)
        cfg_digest = manifest["config"]["digest"]
        cfg = blob(f"blobs/sha256/{cfg_digest.split(':', 1)[1]}")
        if hashlib.sha256(cfg).hexdigest() != cfg_digest.split(":", 1)[1]:
            raise ValueError(f"{path}: config does not match its digest")
        for la in manifest["layers"]:
            hexd = la["digest"].split(":", 1)[1]
            f = tar.extractfile(names[f"blobs/sha256/{hexd}"])
            assert f is not None
            h = hashlib.sha256()
            while chunk := f.read(CHUNK):
                h.update(chunk)
            if h.hexdigest() != hexd:
                raise ValueError(f"{path}: layer {hexd[:12]} does not match its digest")
    return {
        "image_id": cfg_digest,
        "manifest_digest": man_digest,
        "manifest": manifest,
        "config": json.loads(cfg),
    }


def copy_stream(src: BinaryIO, dst: BinaryIO) -> str:
    h = hashlib.sha256()
    while chunk := src.read(CHUNK):
        h.update(chunk)
        dst.write(chunk)
    return h.hexdigest()
