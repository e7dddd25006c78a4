"""Pinned operation images: the lock file, offline builds, and resolution by image id.

The runner never runs a mutable tag: it resolves an image name (`cpu`, `cuda`) to the image id
recorded in images/images.lock, checks the engine has it, and checks the lock's input hash
(Dockerfile + requirements + the operations code baked into the image) still matches the
checkout, so a stale image is refused instead of silently running old tool code.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from . import native
from .canonical import sha256_bytes, sha256_file
from .errors import CkoError, Exit, bad_request, unavailable
from .models import Closed

IMAGE_NAMES = ("cpu", "cuda")
TAG_VERSION = "0.1.0"
DEBIAN_SUITE = "bookworm"
# Parts of a debootstrap root that an operation never needs: keeps the cpu image small.
SLIM_PATHS = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man",
              "usr/share/info", "usr/share/locale", "usr/share/lintian", "usr/share/common-licenses")


class ImageEntry(Closed):
    name: str
    tag: str
    dockerfile: str
    dockerfile_sha256: str
    inputs_sha256: str
    build_inputs: dict[str, Any] = Field(default_factory=dict)
    image_id: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    size_bytes: int | None = None
    built_at: str


class ImagesLock(Closed):
    version: int = 1
    images: dict[str, ImageEntry] = Field(default_factory=dict)


def repo_root() -> Path:
    env = os.environ.get("CKO_HOME")
    if env:
        return Path(env).absolute()
    here = Path(__file__).resolve().parent.parent
    return here


def lock_path() -> Path:
    return Path(os.environ.get("CKO_IMAGES_LOCK", repo_root() / "images" / "images.lock"))


def build_dir() -> Path:
    return repo_root() / "images" / ".build"


def check_name(name: str) -> str:
    if name not in IMAGE_NAMES:
        raise bad_request(f"unknown image {name!r}; known images: {', '.join(IMAGE_NAMES)}", field="image")
    return name


def load_lock(path: Path | None = None) -> ImagesLock:
    path = path or lock_path()
    if not path.exists():
        return ImagesLock()
    try:
        return ImagesLock.model_validate_json(path.read_bytes())
    except (ValidationError, ValueError) as exc:
        raise CkoError(
            f"{path} is corrupt ({str(exc).splitlines()[0]}); rebuild with `cko images build`",
            exit_code=Exit.UNAVAILABLE,
            code="corrupt_images_lock",
            field="images.lock",
        ) from None


def save_lock(lock: ImagesLock, path: Path | None = None) -> None:
    from .store import write_replace

    path = path or lock_path()
    data = json.dumps(lock.model_dump(mode="json"), indent=2, sort_keys=True).encode() + b"\n"
    write_replace(path, data)


def _tree_files(root: Path) -> list[Path]:
    out = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
            out.append(p)
    return out


def inputs_hash(name: str) -> str:
    """Hash of everything the image bakes in from the checkout."""
    root = repo_root()
    parts = []
    # the cpu image installs requirements-cpu.txt only; the cuda image either list (build arg REQUIREMENTS)
    reqs = [root / "images" / "requirements-cpu.txt"] if name == "cpu" else \
        sorted((root / "images").glob("requirements-*.txt"))
    for p in [root / "images" / name / "Dockerfile", *reqs, *_tree_files(root / "operations")]:
        parts.append(f"{p.relative_to(root)}\0{sha256_file(p)}")
    return sha256_bytes("\n".join(parts).encode())


def docker_client() -> Any:
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except DockerException as exc:
        raise unavailable(
            f"Docker engine not reachable ({str(exc).splitlines()[0][:200]}); start dockerd "
            "(see README: `make engine`)",
            code="engine_unavailable",
        ) from None
    return client


def image_present(client: Any, image_id: str) -> bool:
    from docker.errors import ImageNotFound

    try:
        client.images.get(image_id)
        return True
    except ImageNotFound:
        return False


def image_status(client: Any | None = None) -> list[dict[str, Any]]:
    lock = load_lock()
    rows = []
    for name in IMAGE_NAMES:
        entry = lock.images.get(name)
        row: dict[str, Any] = {"name": name, "locked": entry is not None}
        if entry:
            row.update(image_id=entry.image_id, tag=entry.tag, size_bytes=entry.size_bytes, built_at=entry.built_at)
            row["stale"] = entry.inputs_sha256 != inputs_hash(name)
            row["present"] = image_present(client, entry.image_id) if client is not None else None
        else:
            row.update(present=False, stale=None)
        rows.append(row)
    return rows


def resolve(name: str, client: Any) -> ImageEntry:
    """The locked, present, up-to-date image for `name`, or a clear exit-5 error."""
    check_name(name)
    entry = load_lock().images.get(name)
    if entry is None:
        raise unavailable(f"image {name} is not built (no entry in {lock_path()}); run `cko images build {name}`",
                          code="image_missing", field="image")
    if not image_present(client, entry.image_id):
        raise unavailable(f"image {name} ({entry.image_id[:19]}) is in the lock but not in the engine; "
                          f"run `cko images build {name}`", code="image_missing", field="image")
    if os.environ.get("CKO_ALLOW_STALE_IMAGE") != "1" and entry.inputs_sha256 != inputs_hash(name):
        raise unavailable(f"image {name} is stale: the operations code or Dockerfile changed since it was built; "
                          f"run `cko images build {name}`", code="image_stale", field="image")
    return entry


# -- building -------------------------------------------------------------------------------

Progress = Callable[[str], None]


def _run(cmd: list[str], what: str, progress: Progress) -> None:
    progress(f"{what}: {' '.join(cmd[:4])} ...")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise unavailable(f"{what} failed (exit {proc.returncode}): {' | '.join(tail)}", code="build_failed")


def ensure_rootfs(progress: Progress) -> Path:
    """A slim Debian root made by debootstrap (cached in images/.build)."""
    target = build_dir() / f"rootfs-{DEBIAN_SUITE}"
    if (target / "usr" / "bin" / "python3").exists():
        return target
    if shutil.which("debootstrap") is None:
        raise unavailable("debootstrap is not installed (apt-get install debootstrap)", code="build_tool_missing")
    tmp = build_dir() / f"rootfs-{DEBIAN_SUITE}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    _run(["debootstrap", "--variant=minbase", "--include=python3,python3-venv", DEBIAN_SUITE, str(tmp)],
         "debootstrap", progress)
    slim_rootfs(tmp)
    tmp.rename(target)
    return target


def slim_rootfs(root: Path) -> None:
    for rel in SLIM_PATHS:
        p = root / rel
        if p.is_dir():
            for child in p.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()


def import_base(client: Any, rootfs: Path, tag: str, progress: Progress) -> str:
    tar_path = build_dir() / f"{rootfs.name}.tar"
    progress(f"packing {rootfs.name}")
    with tarfile.open(tar_path, "w") as tar:
        for child in sorted(rootfs.iterdir()):
            tar.add(child, arcname=child.name)
    progress(f"importing {tag}")
    repo, _, tagname = tag.partition(":")
    with open(tar_path, "rb") as f:
        out = client.api.import_image_from_data(f, repository=repo, tag=tagname)
    tar_path.unlink()
    status = out if isinstance(out, str) else json.dumps(out)
    image = client.images.get(tag)
    if not image.id:
        raise unavailable(f"docker import returned no image ({status[:200]})", code="build_failed")
    return str(image.id)


def ensure_wheels(progress: Progress, python_version: str = "3.11") -> dict[str, str]:
    """A wheelhouse for the image's Python, made by the host's pip (the container has no index)."""
    wheels = build_dir() / "wheels"
    req = repo_root() / "images" / "requirements-cpu.txt"
    given = os.environ.get("CKO_WHEELHOUSE")
    if given:  # a host with no package index (the lent GPU machine): wheels carried in
        wheels.mkdir(parents=True, exist_ok=True)
        for w in Path(given).glob("*.whl"):
            shutil.copy(w, wheels / w.name)
        return {p.name: sha256_file(p) for p in sorted(wheels.glob("*.whl"))}
    stamp = wheels / f".stamp-{python_version}"
    want = sha256_file(req)
    if not (stamp.exists() and stamp.read_text() == want):
        wheels.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--no-deps",
              "--python-version", python_version, "--implementation", "cp",
              "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
              "--platform", "manylinux2014_x86_64", "--platform", "any",
              "-d", str(wheels), "-r", str(req)], "pip download (wheelhouse)", progress)
        stamp.write_text(want)
    return {p.name: sha256_file(p) for p in sorted(wheels.glob("*.whl"))}


def build_image(name: str, *, offline: bool, base_image: str | None = None, progress: Progress = print,
                build_args: dict[str, str] | None = None) -> ImageEntry:
    check_name(name)
    client = docker_client()
    root = repo_root()
    dockerfile = root / "images" / name / "Dockerfile"
    lock = load_lock()
    started = time.monotonic()
    build_inputs: dict[str, Any] = {}
    buildargs: dict[str, str] = dict(build_args or {})
    if buildargs:
        build_inputs["build_args"] = dict(buildargs)
    py = "3.11" if name == "cpu" else os.environ.get("CKO_CUDA_PYTHON", "3.12")
    build_inputs["wheels"] = ensure_wheels(progress, py)
    # the trace scanner is part of the operations code the image bakes in: built first, or the
    # image would take a stale or missing library (the input hash below covers it)
    try:
        native.build(progress=progress)
    except RuntimeError as exc:
        raise unavailable(f"building the trace scanner failed: {exc}", field="native") from None
    if base_image:
        buildargs["BASE_IMAGE"] = base_image
        build_inputs["base"] = {"kind": "given", "image": base_image}
    elif offline:
        if name != "cpu":
            raise bad_request("an offline cuda build needs --base-image (e.g. from tests/gpu/prepare.sh)",
                              field="base_image")
        prior = lock.images.get(name)
        base_id = (prior.build_inputs.get("base", {}).get("image_id") if prior else None)
        if not (base_id and image_present(client, base_id)):
            rootfs = ensure_rootfs(progress)
            base_id = import_base(client, rootfs, f"cko/base-{DEBIAN_SUITE}:{TAG_VERSION}", progress)
        buildargs["BASE_IMAGE"] = base_id
        build_inputs["base"] = {"kind": "debootstrap", "suite": DEBIAN_SUITE, "variant": "minbase", "image_id": base_id}
    tag = f"cko/{name}:{TAG_VERSION}"
    progress(f"docker build {tag} (network none)")
    image_id = None
    log_tail: list[str] = []
    from docker.errors import APIError, BuildError

    try:
        for chunk in client.api.build(path=str(root), dockerfile=str(dockerfile.relative_to(root)), tag=tag,
                                      buildargs=buildargs, network_mode="none", rm=True, forcerm=True,
                                      decode=True):
            if "stream" in chunk:
                line = chunk["stream"].rstrip()
                if line:
                    log_tail = (log_tail + [line])[-20:]
                    if line.startswith("Step "):
                        progress(line)
            if "error" in chunk:
                raise unavailable(f"docker build of {name} failed: {chunk['error'].strip()} | "
                                  + " | ".join(log_tail[-5:]), code="build_failed")
            if "aux" in chunk and "ID" in chunk["aux"]:
                image_id = chunk["aux"]["ID"]
    except (APIError, BuildError) as exc:
        raise unavailable(f"docker build of {name} failed: {exc}", code="build_failed") from None
    image = client.images.get(image_id or tag)
    entry = ImageEntry(
        name=name,
        tag=tag,
        dockerfile=str(dockerfile.relative_to(root)),
        dockerfile_sha256=sha256_file(dockerfile),
        inputs_sha256=inputs_hash(name),
        build_inputs=build_inputs | {"seconds": round(time.monotonic() - started, 1)},
        image_id=str(image.id),
        size_bytes=int(image.attrs.get("Size") or 0),
        built_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    lock = load_lock()  # re-read: another build may have written the other image meanwhile
    save_lock(ImagesLock(version=lock.version, images={**lock.images, name: entry}))
    return entry
