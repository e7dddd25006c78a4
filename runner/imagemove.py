"""Images move by digest: an OCI archive (in a store, the cache, or at a path) or a registry.

- save: the image's archive, named by its image id: `<store>/images/<id hex>.tar`, or a path.
- load: an archive into the engine, after checking every blob against its digest.
- push: the archive's blobs and manifest to a registry (HTTP API v2), by digest, plus the tag
  `sha256-<id hex>` so that an audit that knows only the image id finds it.
- pull: the manifest by digest (or that tag), every blob checked, written as an archive in the
  cache, then loaded.
An image whose id the engine lacks is looked for in that order: the store, the cache, the
registries its lock entry names, $CKO_REGISTRY (runner/images.py `resolve`, the audit).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from . import oci
from .errors import CkoError, bad_request, unavailable
from .images import cache_dir, image_present, load_lock

MANIFEST_TYPES = ", ".join([oci.OCI_MANIFEST, "application/vnd.docker.distribution.manifest.v2+json"])


def _hex(image_id: str) -> str:
    return image_id.split(":", 1)[1]


def store_archive(store_root: Path, image_id: str) -> Path:
    return store_root / "images" / f"{_hex(image_id)}.tar"


def cache_archive(image_id: str) -> Path:
    return cache_dir() / "images" / f"{_hex(image_id)}.tar"


def _link_or_copy(src: Path, dst: Path) -> None:
    """Atomically: a hard link where the file system allows (archives are immutable), else a copy."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.part")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def save(client: Any, image_id: str, dest: Path) -> dict[str, Any]:
    """The image's archive at `dest`: cko's own archive where the build left one, else the engine's."""
    cached = cache_archive(image_id)
    if not (cached.is_file() and oci.read_archive(cached)["image_id"] == image_id):
        if not image_present(client, image_id):
            raise unavailable(
                f"image {image_id} is neither in the engine nor in the cache",
                code="image_missing",
                field="image",
            )
        cached.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cached.parent, delete=False) as f:
            for chunk in client.images.get(image_id).save(named=False):
                f.write(chunk)
        try:
            layers, config = _docker_archive(Path(f.name))
            oci.write_archive(cached, layers, config, None)
        finally:
            os.unlink(f.name)
    _link_or_copy(cached, dest)
    info = oci.read_archive(dest)
    return {
        "image_id": info["image_id"],
        "manifest_digest": info["manifest_digest"],
        "path": str(dest),
        "bytes": dest.stat().st_size,
    }


def _docker_archive(path: Path) -> tuple[list[oci.Layer], bytes]:
    """The layers and config of `docker save`'s format, rewritten as cko's (each layer a blob by digest)."""
    work = cache_dir() / "layers"
    work.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "r:") as tar:

        def member(name: str) -> Any:
            f = tar.extractfile(name)
            assert f is not None
            return f

        entry = json.loads(member("manifest.json").read())[0]
        cfg_bytes = member(entry["Config"]).read()
        layers = []
        for name in entry["Layers"]:
            tmp = work / f".save-{os.getpid()}"
            with open(tmp, "wb") as dst:
                diff = oci.copy_stream(member(name), dst)
            os.replace(tmp, work / f"{diff}.tar")
            layers.append(oci.Layer(work / f"{diff}.tar", diff, "saved"))
    return layers, cfg_bytes


def load(client: Any, archive: Path, want: str | None = None) -> dict[str, Any]:
    """Check the archive's blobs, then `docker load` it (a no-op where the engine has the image)."""
    try:
        info = oci.read_archive(archive)
    except (ValueError, KeyError, tarfile.TarError, OSError) as exc:
        raise bad_request(f"{archive}: not an image archive cko can check ({exc})", field="archive") from None
    if want and info["image_id"] != want:
        raise bad_request(f"{archive} holds {info['image_id']}, not {want}", field="archive")
    if not image_present(client, info["image_id"]):
        with open(archive, "rb") as f:
            client.api.load_image(f)
    name = info["config"].get("config", {}).get("Labels", {}).get("org.cko.image", "image")
    client.images.get(info["image_id"]).tag(f"cko/{name}", _hex(info["image_id"])[:12])
    return {
        "image_id": info["image_id"],
        "manifest_digest": info["manifest_digest"],
        "loaded_from": str(archive),
    }


# -- registries ------------------------------------------------------------------------------


def _base(registry: str) -> str:
    host = registry.split("/", 1)[0]
    local = host.startswith(("localhost", "127.0.0.1", "[::1]"))
    return f"{'http' if local else 'https'}://{host}"


def split_ref(ref: str) -> tuple[str, str, str]:
    """HOST[:PORT]/REPO@sha256:... or HOST/REPO:TAG -> (host, repo, reference)."""
    if "/" not in ref:
        raise bad_request(f"{ref!r}: expected HOST[:PORT]/REPOSITORY@sha256:DIGEST", field="ref")
    host, rest = ref.split("/", 1)
    if "@" in rest:
        repo, reference = rest.split("@", 1)
    elif ":" in rest:
        repo, reference = rest.rsplit(":", 1)
    else:
        raise bad_request(f"{ref!r}: name a digest (@sha256:...) or a tag", field="ref")
    return host, repo, reference


def push(image_id: str, registry: str, repo: str, client: Any | None = None) -> dict[str, Any]:
    import requests

    archive = cache_archive(image_id)
    if not archive.is_file():
        if client is None:
            raise unavailable(f"no archive of {image_id} to push", code="image_missing", field="image")
        save(client, image_id, archive)
    info = oci.read_archive(archive)
    base = f"{_base(registry)}/v2/{repo}"
    with tarfile.open(archive, "r:") as tar:
        blobs = [info["manifest"]["config"], *info["manifest"]["layers"]]
        for desc in blobs:
            digest = desc["digest"]
            if requests.head(f"{base}/blobs/{digest}", timeout=60).status_code == 200:
                continue
            r = requests.post(f"{base}/blobs/uploads/", timeout=60)
            _ok(r, "start upload")
            loc = r.headers["Location"]
            loc = loc if loc.startswith("http") else _base(registry) + loc
            f = tar.extractfile(f"blobs/sha256/{_hex(digest)}")
            assert f is not None
            r = requests.put(
                loc,
                params={"digest": digest},
                data=f,
                timeout=3600,
                headers={"Content-Type": "application/octet-stream", "Content-Length": str(desc["size"])},
            )
            _ok(r, f"upload {digest[:19]}")
        manifest = tar.extractfile(f"blobs/sha256/{_hex(info['manifest_digest'])}")
        assert manifest is not None
        body = manifest.read()
    for reference in (info["manifest_digest"], f"sha256-{_hex(image_id)}"):
        r = requests.put(
            f"{base}/manifests/{reference}", data=body, timeout=60, headers={"Content-Type": oci.OCI_MANIFEST}
        )
        _ok(r, "put manifest")
    return {
        "image_id": image_id,
        "ref": f"{registry}/{repo}@{info['manifest_digest']}",
        "manifest_digest": info["manifest_digest"],
    }


def _ok(r: Any, what: str) -> None:
    if r.status_code >= 300:
        raise unavailable(
            f"registry: {what} failed (HTTP {r.status_code}: {r.text[:200]})", code="registry_failed"
        )


def pull(ref: str, client: Any, want: str | None = None) -> dict[str, Any]:
    """Fetch by digest (every blob checked), write an archive in the cache, load it."""
    import requests

    host, repo, reference = split_ref(ref)
    base = f"{_base(host)}/v2/{repo}"
    try:
        r = requests.get(f"{base}/manifests/{reference}", headers={"Accept": MANIFEST_TYPES}, timeout=60)
    except requests.RequestException as exc:
        raise unavailable(
            f"registry {host} not reachable ({exc.__class__.__name__})", code="registry_failed"
        ) from None
    _ok(r, f"get manifest {reference}")
    if reference.startswith("sha256:") and hashlib.sha256(r.content).hexdigest() != _hex(reference):
        raise unavailable(f"{ref}: the manifest does not match its digest", code="registry_digest_mismatch")
    manifest = r.json()
    cfg = requests.get(f"{base}/blobs/{manifest['config']['digest']}", timeout=60).content
    image_id = "sha256:" + hashlib.sha256(cfg).hexdigest()
    if image_id != manifest["config"]["digest"] or (want and image_id != want):
        raise unavailable(
            f"{ref}: config {image_id[:19]} is not the image wanted ({(want or '')[:19]})",
            code="registry_digest_mismatch",
        )
    work = cache_dir() / "layers"
    work.mkdir(parents=True, exist_ok=True)
    layers = []
    for desc in manifest["layers"]:
        layers.append(_fetch_layer(f"{base}/blobs/{desc['digest']}", desc, work))
    config = json.loads(cfg)
    if [f"sha256:{la.digest}" for la in layers] != config["rootfs"]["diff_ids"]:
        raise unavailable(
            f"{ref}: layers do not match the config's diff ids", code="registry_digest_mismatch"
        )
    archive = cache_archive(image_id)
    meta = oci.write_archive(archive, layers, cfg, None)
    out = load(client, archive, want=image_id)
    return out | {"pulled": ref, "manifest_digest": meta["manifest_digest"]}


def _fetch_layer(url: str, desc: dict[str, Any], work: Path) -> oci.Layer:
    import requests

    tmp = work / f".pull-{os.getpid()}-{_hex(desc['digest'])[:16]}"
    h = hashlib.sha256()
    with requests.get(url, stream=True, timeout=3600) as r, open(tmp, "wb") as f:
        _ok(r, f"get {desc['digest'][:19]}")
        for chunk in r.iter_content(oci.CHUNK):
            h.update(chunk)
            f.write(chunk)
    if "sha256:" + h.hexdigest() != desc["digest"]:
        tmp.unlink()
        raise unavailable(
            f"blob {desc['digest'][:19]} does not match its digest", code="registry_digest_mismatch"
        )
    if desc.get("mediaType", "").endswith("gzip"):
        plain = tmp.with_suffix(".tar")
        with gzip.open(tmp, "rb") as src, open(plain, "wb") as dst:
            diff = oci.copy_stream(src, dst)  # type: ignore[arg-type]
        tmp.unlink()
        tmp = plain
    else:
        diff = h.hexdigest()
    path = work / f"{diff}.tar"
    os.replace(tmp, path)
    return oci.Layer(path, diff, "pulled")


# -- finding an image the engine lacks ------------------------------------------------------------


def fetch_into_engine(
    client: Any,
    image_id: str,
    *,
    name: str | None = None,
    store_root: Path | None = None,
    notes: list[str] | None = None,
) -> bool:
    """Bring `image_id` into the engine from the store, the cache, or a registry; False when none has it."""
    notes = notes if notes is not None else []
    candidates = ([store_archive(store_root, image_id)] if store_root else []) + [cache_archive(image_id)]
    for path in candidates:
        if path.is_file():
            try:
                load(client, path, want=image_id)
                notes.append(f"loaded from {path}")
                return True
            except CkoError as err:
                notes.append(f"{path}: {err.message}")
    refs = [r for e in load_lock().images.values() if e.image_id == image_id for r in e.registry_refs]
    env = os.environ.get("CKO_REGISTRY")
    if env:
        refs.append(f"{env}/cko/{name or 'image'}:sha256-{_hex(image_id)}")
    for ref in refs:
        try:
            pull(ref, client, want=image_id)
            notes.append(f"pulled {ref}")
            return True
        except CkoError as err:
            notes.append(f"{ref}: {err.message}")
    return False
