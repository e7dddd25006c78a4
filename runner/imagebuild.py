"""Building named images: reproducibly from layers cko writes itself, or by the engine from a Dockerfile.

A `layers` recipe (cpu, torch-cpu, a project's own) becomes: a normalised debootstrap root; cko's
Python environment (/opt/cko, from a wheelhouse the host's pip made); the recipe's packages
(/opt/cko/extra); and the operations code (/opt/cko/src) last, since it changes most. Each layer
is a deterministic tar (runner/oci.py) and the two install steps run in a container with no network,
their output tarred here; so the image id depends on the inputs only. A `dockerfile` recipe (cuda,
a user's) is built by the engine, and an `image` recipe (the user's own image) gets the same
supervisor layer on top; both are recorded by the id they got, marked not reproducible.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import native, oci
from .canonical import sha256_bytes, sha256_file
from .errors import CkoError, bad_request, unavailable
from .images import (
    ImageEntry,
    Recipe,
    assets_root,
    cache_dir,
    docker_client,
    image_present,
    inputs_hash,
    load_lock,
    load_recipe,
    operations_dir,
    recipe_file,
    save_entry,
)

Progress = Callable[[str], None]
DEBIAN_SUITE = "bookworm"
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "any",
)
# Parts of a debootstrap root an operation never needs (smaller image), and ones that differ per run.
SLIM_PATHS = (
    "var/cache/apt/archives",
    "var/lib/apt/lists",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "usr/share/lintian",
    "usr/share/common-licenses",
    "var/log",
    "var/cache/debconf",
    "var/cache/ldconfig",
    "run",
    "tmp",
    "var/tmp",
)
NOISE_FILES = (
    "etc/passwd-",
    "etc/group-",
    "etc/shadow-",
    "etc/gshadow-",
    "var/lib/dpkg/status-old",
    "var/lib/dpkg/diversions-old",
    "var/lib/dpkg/statoverride-old",
    "var/cache/apt/pkgcache.bin",
    "var/cache/apt/srcpkgcache.bin",
    "var/lib/dbus/machine-id",
    "var/lib/systemd/random-seed",
)
ENV = {
    "PATH": "/opt/cko/bin:/usr/local/bin:/usr/bin:/bin",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "HOME": "/tmp",
}
WORK_DIRS = ("cko/in", "cko/out", "cko/subjects", "cko/harness", "cko/request")
# Bytecode is compiled into each layer by runner/pycompile.py (mounted at /c): the root is read-only
# at run time, so a module without its .pyc is compiled again in every container that imports it.
PYCOMPILE = Path(__file__).with_name("pycompile.py")
COMPILE = "PYTHONHASHSEED=0 python3 /c/pycompile.py"
VENV_SCRIPT = f"""set -e
python3 -m venv /opt/cko
/opt/cko/bin/python -m pip install -q --no-index --no-cache-dir --no-compile --disable-pip-version-check \\
  --find-links /w -r /w/requirements.txt
cd /opt/cko/lib/python3*/site-packages
rm -rf pip pip-* setuptools setuptools-* _distutils_hack pkg_resources distutils-precedence.pth
rm -f /opt/cko/bin/pip /opt/cko/bin/pip3 /opt/cko/bin/pip3.*
printf '/opt/cko/src\\n/opt/cko/extra\\n' > cko-operations.pth
find /opt/cko -name __pycache__ -prune -exec rm -rf {{}} +
{COMPILE} /opt/cko /opt/cko
STD="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')"
{COMPILE} "$STD" "$STD" "/pyc$STD"
"""
EXTRA_SCRIPT = f"""set -e
python3 -m venv /tmp/v
/tmp/v/bin/pip install -q --no-index --no-cache-dir --no-compile --disable-pip-version-check \\
  --find-links /w --target /out -r /w/requirements.txt
rm -rf /out/bin
find /out -name __pycache__ -prune -exec rm -rf {{}} +
{COMPILE} /out /opt/cko/extra
"""
OPS_SCRIPT = f"{COMPILE} /opt/cko/src/operations /opt/cko/src/operations"


def _run(cmd: list[str], what: str, progress: Progress) -> None:
    progress(f"{what}: {' '.join(cmd[:4])} ...")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise unavailable(f"{what} failed (exit {proc.returncode}): {' | '.join(tail)}", code="build_failed")


# -- the Debian root ---------------------------------------------------------------------------


def ensure_rootfs(progress: Progress) -> Path:
    """A slim, normalised Debian root made by debootstrap (cached; the .debs too)."""
    target = cache_dir() / "rootfs" / f"{DEBIAN_SUITE}-minbase"
    if (target / ".cko-normalised").exists():
        return target
    if shutil.which("debootstrap") is None:
        raise unavailable(
            "debootstrap is not installed (apt-get install debootstrap)", code="build_tool_missing"
        )
    tmp = target.with_name(target.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    debs = Path(os.environ.get("CKO_DEB_CACHE") or cache_dir() / "debs")
    debs.mkdir(parents=True, exist_ok=True)
    _run(
        [
            "debootstrap",
            "--variant=minbase",
            "--include=python3,python3-venv",
            f"--cache-dir={debs}",
            DEBIAN_SUITE,
            str(tmp),
        ],
        "debootstrap",
        progress,
    )
    normalise_rootfs(tmp)
    tmp.rename(target)
    return target


def _empty_dir(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        for child in p.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()


def normalise_rootfs(root: Path) -> None:
    """Remove what differs between two debootstraps of the same packages: logs, caches, backups,
    the random machine id, password-change dates, the host's name and resolver, compiled bytecode
    (whose bytes are not guaranteed the same run to run)."""
    for rel in SLIM_PATHS:
        _empty_dir(root / rel)
    for rel in NOISE_FILES:
        (root / rel).unlink(missing_ok=True)
    for pyc in sorted(root.glob("usr/lib/python3*/**/__pycache__")):
        shutil.rmtree(pyc, ignore_errors=True)
    for rel, text in (
        ("etc/machine-id", ""),
        ("etc/hostname", "cko\n"),
        ("etc/resolv.conf", ""),
        ("etc/hosts", "127.0.0.1\tlocalhost\n"),
    ):
        p = root / rel
        if p.exists() or p.is_symlink():
            p.unlink()
        p.write_text(text)
    shadow = root / "etc" / "shadow"
    if shadow.exists():  # field 3 is the day of the last password change: the day debootstrap ran
        lines = [
            ":".join(f[:2] + [""] + f[3:]) for f in (ln.split(":") for ln in shadow.read_text().splitlines())
        ]
        shadow.write_text("\n".join(lines) + "\n")
    (root / "tmp").chmod(0o1777)
    (root / ".cko-normalised").write_text("")


def _packages(root: Path) -> str:
    """sha256 of the installed packages and versions: the base's real inputs."""
    status = (root / "var" / "lib" / "dpkg" / "status").read_text()
    pkgs = sorted(ln for ln in status.splitlines() if ln.startswith(("Package:", "Version:")))
    return sha256_bytes("\n".join(pkgs).encode())


# -- layers ----------------------------------------------------------------------------------


def _cached_layer(key: str, comment: str, make: Callable[[oci.LayerWriter], Path | None]) -> oci.Layer:
    meta = cache_dir() / "layers" / f"{key}.json"
    if meta.is_file():
        digest = json.loads(meta.read_text())["digest"]
        path = cache_dir() / "layers" / f"{digest}.tar"
        if path.is_file():
            return oci.Layer(path, digest, comment)
    work = cache_dir() / "layers" / f".{key}.tar"
    lw = oci.LayerWriter(work)
    scratch = make(lw)
    digest = lw.write()
    if scratch is not None:  # the tree the layer was read from, only now that the tar is written
        shutil.rmtree(scratch)
    path = cache_dir() / "layers" / f"{digest}.tar"
    os.replace(work, path)
    meta.write_text(json.dumps({"digest": digest}))
    return oci.Layer(path, digest, comment)


def base_layer(progress: Progress) -> tuple[oci.Layer, dict[str, Any]]:
    root = ensure_rootfs(progress)
    pk = _packages(root)
    progress("base layer (normalised debootstrap root)")
    layer = _cached_layer(
        f"base-{DEBIAN_SUITE}-{pk}-{oci.epoch()}",
        f"debootstrap --variant=minbase {DEBIAN_SUITE}",
        lambda lw: lw.add_tree(root, skip=lambda rel: rel == ".cko-normalised"),
    )
    return layer, {
        "kind": "debootstrap",
        "suite": DEBIAN_SUITE,
        "variant": "minbase",
        "packages_sha256": pk,
        "layer": f"sha256:{layer.digest}",
    }


def ensure_wheels(
    req_lines: list[str], python: str, resolve: bool, progress: Progress
) -> tuple[Path, dict[str, str]]:
    """A wheelhouse for the image's Python, made by the host's pip (the container has no index)."""
    text = "\n".join(req_lines) + "\n"
    given = os.environ.get("CKO_WHEELHOUSE")
    carried = sorted(Path(given).glob("*.whl")) if given else []
    # A carried wheelhouse gets a cache entry of its own, keyed by its wheels' digests too: copied
    # into the entry a download made for the same requirements, its extra wheels would land in
    # every later build of those requirements (and in their lock entries).
    salt = "".join(f"\0{w.name}:{sha256_file(w)}" for w in carried) if given else ""
    key = sha256_bytes(f"{python}\0{resolve}\0{text}{salt}".encode())[:24]
    wheels = cache_dir() / "wheels" / key
    if not (wheels / ".complete").exists():
        wheels.mkdir(parents=True, exist_ok=True)
        (wheels / "requirements.txt").write_text(text)
        for w in carried:  # carried wheels first: pip takes them (--find-links) over the index's
            shutil.copy(w, wheels / w.name)
        try:
            _run(_download_cmd(wheels, python, resolve, given), "pip download (wheelhouse)", progress)
        except CkoError:
            if not given:
                raise
            # a host with no package index (the lent GPU machine): the carried wheels are all there is
            progress("no package index reachable: the carried wheelhouse is used as it is")
        (wheels / ".complete").write_text("")
    (wheels / "requirements.txt").write_text(text)
    return wheels, {p.name: sha256_file(p) for p in sorted(wheels.glob("*.whl"))}


def _download_cmd(wheels: Path, python: str, resolve: bool, given: str | None) -> list[str]:
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    return [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--only-binary=:all:",
        *([] if resolve else ["--no-deps"]),
        *(["--find-links", given] if given else []),
        "--python-version",
        python,
        "--implementation",
        "cp",
        *plat,
        "-d",
        str(wheels),
        "-r",
        str(wheels / "requirements.txt"),
    ]


def _in_container(
    client: Any, image_id: str, script: str, mounts: dict[str, dict[str, str]], what: str
) -> None:
    from docker.errors import ContainerError

    try:
        client.containers.run(
            image_id,
            ["sh", "-c", script],
            network_mode="none",
            volumes=mounts,
            remove=True,
            user="0:0",
            stdout=True,
            stderr=True,
        )
    except ContainerError as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else str(exc.stderr)
        raise unavailable(f"{what} failed: {err.strip()[-600:]}", code="build_failed") from None


def _scratch(name: str) -> Path:
    d = cache_dir() / "build" / f"{name}-{os.getpid()}"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    return d


def venv_layer(
    client: Any, base_id: str, base: oci.Layer, req: Path, progress: Progress
) -> tuple[oci.Layer, dict[str, str]]:
    lines = [ln.strip() for ln in req.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    wheels, hashes = ensure_wheels(lines, "3.11", False, progress)
    key = (
        "venv-"
        + sha256_bytes(
            json.dumps([base.digest, hashes, lines, VENV_SCRIPT, _compiler_hash(), oci.epoch()]).encode()
        )[:32]
    )

    def make(lw: oci.LayerWriter) -> Path:
        out = _scratch("venv")
        (out / "opt").mkdir()
        (out / "pyc").mkdir()
        progress("installing cko's Python environment and its bytecode (container, no network)")
        _in_container(
            client,
            base_id,
            VENV_SCRIPT,
            {
                str(wheels): {"bind": "/w", "mode": "ro"},
                str(out / "opt"): {"bind": "/opt/cko", "mode": "rw"},
                str(out / "pyc"): {"bind": "/pyc", "mode": "rw"},
            }
            | _compiler_mount(),
            "venv install",
        )
        lw.add_tree(out / "opt", "opt/cko", owner=(0, 0))
        lw.add_tree(out / "pyc", "", owner=(0, 0))  # the interpreter's standard library's bytecode
        return out

    return _cached_layer(key, "cko venv (/opt/cko)", make), hashes


def extra_layer(
    client: Any, base_id: str, base: oci.Layer, recipe: Recipe, progress: Progress
) -> tuple[oci.Layer, dict[str, str]]:
    wheels, hashes = ensure_wheels(list(recipe.packages), recipe.python, True, progress)
    key = (
        "extra-"
        + sha256_bytes(
            json.dumps(
                [base.digest, hashes, recipe.packages, EXTRA_SCRIPT, _compiler_hash(), oci.epoch()]
            ).encode()
        )[:32]
    )

    def make(lw: oci.LayerWriter) -> Path:
        out = _scratch("extra")
        progress(f"installing {', '.join(recipe.packages)} (container, no network)")
        _in_container(
            client,
            base_id,
            EXTRA_SCRIPT,
            {str(wheels): {"bind": "/w", "mode": "ro"}, str(out): {"bind": "/out", "mode": "rw"}}
            | _compiler_mount(),
            "package install",
        )
        lw.add_tree(out, "opt/cko/extra", owner=(0, 0))
        return out

    return _cached_layer(key, f"packages: {' '.join(recipe.packages)}", make), hashes


def ops_layer(client: Any, base_id: str, progress: Progress) -> oci.Layer:
    """The supervisor: operations/ with its bytecode (and the trace scanner built beside it), and the
    work mounts."""
    try:
        native.build(progress=progress)
    except RuntimeError as exc:
        raise unavailable(f"building the trace scanner failed: {exc}", field="native") from None
    src = _scratch("ops") / "operations"
    shutil.copytree(
        operations_dir(), src, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".trace_scan.*")
    )
    progress("compiling the supervisor's bytecode (container, no network)")
    _in_container(
        client,
        base_id,
        OPS_SCRIPT,
        {str(src): {"bind": "/opt/cko/src/operations", "mode": "rw"}} | _compiler_mount(),
        "compiling operations",
    )
    lw = oci.LayerWriter(cache_dir() / "layers" / f".ops-{os.getpid()}.tar")
    lw.add_tree(src, "opt/cko/src/operations", owner=(0, 0))
    for d in WORK_DIRS:
        lw.add_dir(d)
    digest = lw.write()
    shutil.rmtree(src.parent)
    path = cache_dir() / "layers" / f"{digest}.tar"
    os.replace(lw.out, path)
    return oci.Layer(path, digest, "cko supervisor (operations)")


def _compiler_mount() -> dict[str, dict[str, str]]:
    return {str(PYCOMPILE): {"bind": "/c/pycompile.py", "mode": "ro"}}


def _compiler_hash() -> str:
    return sha256_file(PYCOMPILE)


# -- assembling ------------------------------------------------------------------------------


def _load(client: Any, archive: Path, image_id: str, repo: str, progress: Progress) -> None:
    if not image_present(client, image_id):
        progress(f"docker load {archive.name}")
        with open(archive, "rb") as f:
            client.api.load_image(f)
    client.images.get(image_id).tag(repo, image_id.split(":", 1)[1][:12])


def _assemble(
    client: Any, layers: list[oci.Layer], repo: str, labels: dict[str, str], progress: Progress
) -> dict[str, str]:
    """Config + archive (cached by image id) + load; tagged REPO:<id prefix>, a tag nothing else reuses."""
    cfg = oci.image_config(layers, env=ENV, user="65534:65534", workdir="/tmp", labels=labels)
    image_hex = sha256_bytes(oci.canonical_json(cfg))
    archive = cache_dir() / "images" / f"{image_hex}.tar"
    ref = f"{repo}:{image_hex[:12]}"
    meta = archive.with_suffix(".json")
    if archive.is_file() and meta.is_file():
        out: dict[str, str] = json.loads(meta.read_text())
    else:
        progress(f"writing the image archive ({sum(la.path.stat().st_size for la in layers) / 1e6:.0f} MB)")
        out = oci.write_archive(archive, layers, cfg, ref)
        meta.write_text(json.dumps(out))
    _load(client, archive, out["image_id"], repo, progress)
    return out | {"archive": str(archive), "tag": ref}


# the base: its layer, what went into it, its image id (every layered recipe's chain ends on it)
Base = tuple[oci.Layer, dict[str, Any], str]


def _base_image(client: Any, progress: Progress) -> Base:
    base, info = base_layer(progress)
    out = _assemble(client, [base], f"cko/base-{DEBIAN_SUITE}", {"org.cko.image": "base"}, progress)
    return base, info | {"image_id": out["image_id"]}, out["image_id"]


def recipe_layers(
    client: Any, recipe: Recipe, base_image: Base, progress: Progress
) -> tuple[list[oci.Layer], dict[str, Any]]:
    """The layers below the supervisor, and what went into them."""
    base, info, base_id = base_image
    if recipe.kind != "layers":
        raise bad_request(
            f"image {recipe.name}: only a packages recipe can be a base (is {recipe.kind})", field="base"
        )
    if recipe.base == "debootstrap":
        venv, hashes = venv_layer(
            client, base_id, base, assets_root() / "images" / "requirements-cpu.txt", progress
        )
        layers, inputs = [base, venv], {"base": info, "wheels": hashes}
    else:
        layers, inputs = recipe_layers(client, load_recipe(recipe.base), base_image, progress)
        inputs = {"base": {"kind": "recipe", "name": recipe.base, **inputs}}
    if recipe.packages or recipe.requirements:
        if recipe.requirements:
            recipe = recipe.model_copy(
                update={
                    "packages": [
                        *recipe.packages,
                        *[
                            ln.strip()
                            for ln in recipe_file(recipe, recipe.requirements).read_text().splitlines()
                            if ln.strip() and not ln.startswith("#")
                        ],
                    ]
                }
            )
        extra, hashes = extra_layer(client, base_id, base, recipe, progress)
        layers.append(extra)
        inputs["packages"] = {"requested": recipe.packages, "wheels": hashes}
    return layers, inputs


def layered_build(client: Any, recipe: Recipe, progress: Progress) -> ImageEntry:
    started = time.monotonic()
    base_image = _base_image(client, progress)
    layers, inputs = recipe_layers(client, recipe, base_image, progress)
    layers.append(ops_layer(client, base_image[2], progress))
    ih = inputs_hash(recipe.name, recipe)
    out = _assemble(
        client, layers, f"cko/{recipe.name}", {"org.cko.image": recipe.name, "org.cko.inputs": ih}, progress
    )
    _smoke(client, out["image_id"], recipe)
    size = sum(la.path.stat().st_size for la in layers)
    progress(f"{recipe.name}: {out['image_id'][:19]} in {time.monotonic() - started:.0f} s")
    return ImageEntry(
        name=recipe.name,
        tag=out["tag"],
        kind="layers",
        reproducible=True,
        inputs_sha256=ih,
        build_inputs=inputs
        | {"layers": [f"sha256:{la.digest}" for la in layers], "source_date_epoch": oci.epoch()},
        image_id=out["image_id"],
        manifest_digest=out["manifest_digest"],
        size_bytes=size,
    )


def _smoke(client: Any, image_id: str, recipe: Recipe) -> None:
    """The supervisor imports in the image, as the operations will run it."""
    mods = "operations, numpy, scipy, pydantic, yaml, pynvml, msgspec"
    _in_container(
        client, image_id, f'/opt/cko/bin/python -I -c "import {mods}"', {}, f"checking image {recipe.name}"
    )


def build_image(
    name: str,
    *,
    offline: bool = True,
    base_image: str | None = None,
    progress: Progress = print,
    build_args: dict[str, str] | None = None,
) -> tuple[ImageEntry, dict[str, Any]]:
    """Build `name` (a recipe name or a recipe file) and record it; returns the entry and facts about the build."""
    recipe = load_recipe(name)
    client = docker_client()
    started = time.monotonic()
    if recipe.kind == "layers":
        if base_image:
            raise bad_request(
                f"--base-image: image {recipe.name} is built from its recipe's layers", field="base_image"
            )
        entry = layered_build(client, recipe, progress)
    elif recipe.kind == "dockerfile":
        entry = engine_build(
            client,
            recipe,
            offline=offline,
            base_image=base_image,
            progress=progress,
            build_args=build_args or {},
        )
    else:
        raise bad_request(
            f"image {recipe.name}: an `image:` recipe is not supported yet; use a Dockerfile "
            "whose FROM is that image",
            field="recipe",
        )
    changed = save_entry(entry)
    return entry, {"seconds": round(time.monotonic() - started, 1), "lock_changed": changed}


# -- engine builds (a Dockerfile: the cuda image, a user's own) --------------------------------------


def _context(recipe: Recipe, wheels: Path) -> Path:
    """A build context in the cache holding what cko's Dockerfiles COPY (nothing written under the package)."""
    ctx = _scratch(f"ctx-{recipe.name}")
    shutil.copytree(
        operations_dir(),
        ctx / "operations",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".trace_scan.*"),
    )
    (ctx / "images").mkdir()
    for p in (assets_root() / "images").glob("requirements-*.txt"):
        shutil.copy(p, ctx / "images" / p.name)
    shutil.copytree(wheels, ctx / "images" / ".build" / "wheels", ignore=shutil.ignore_patterns(".*"))
    df = recipe_file(recipe, recipe.dockerfile or "")
    shutil.copy(df, ctx / "Dockerfile")
    for p in df.parent.iterdir():  # the recipe's own files (a user's Dockerfile may COPY them)
        if p.is_file() and not (ctx / p.name).exists():
            shutil.copy(p, ctx / p.name)
    return ctx


def engine_build(
    client: Any,
    recipe: Recipe,
    *,
    offline: bool,
    base_image: str | None,
    progress: Progress,
    build_args: dict[str, str],
) -> ImageEntry:
    wheels, hashes = _cpu_wheels(recipe, progress)
    try:
        native.build(progress=progress)
    except RuntimeError as exc:
        raise unavailable(f"building the trace scanner failed: {exc}", field="native") from None
    buildargs, inputs = _build_args(client, recipe, offline, base_image, build_args)
    inputs = {"wheels": hashes} | inputs
    ctx = _context(recipe, wheels)
    tag = f"cko/{recipe.name}:build"
    progress(f"docker build {recipe.name} (network none)")
    try:
        image_id = _docker_build(client, recipe.name, ctx, tag, buildargs, progress)
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
    return _dockerfile_entry(client, recipe, client.images.get(image_id or tag), tag, inputs)


def _cpu_wheels(recipe: Recipe, progress: Progress) -> tuple[Path, dict[str, str]]:
    """The wheels of the cpu requirements for the image's Python (the cuda image may have another)."""
    py = "3.11" if recipe.name != "cuda" else os.environ.get("CKO_CUDA_PYTHON", "3.12")
    req = assets_root() / "images" / "requirements-cpu.txt"
    lines = [ln.strip() for ln in req.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return ensure_wheels(lines, py, False, progress)


def _build_args(
    client: Any, recipe: Recipe, offline: bool, base_image: str | None, build_args: dict[str, str]
) -> tuple[dict[str, str], dict[str, Any]]:
    """The build arguments with the base image the Dockerfile starts from, and the inputs to record
    (the user's build arguments and that base)."""
    buildargs = dict(build_args)
    inputs: dict[str, Any] = {"build_args": dict(buildargs)} if buildargs else {}
    if base_image:
        buildargs["BASE_IMAGE"] = base_image
        inputs["base"] = {"kind": "given", "image": base_image}
    elif recipe.name == "cuda" and offline:
        raise bad_request(
            "an offline cuda build needs --base-image (e.g. from tests/gpu/prepare.sh)", field="base_image"
        )
    elif recipe.name != "cuda":  # a user's Dockerfile starts from cko's cpu image: the supervisor is there
        cpu = load_lock().images.get("cpu")
        if cpu is None or not image_present(client, cpu.image_id):
            raise bad_request(
                f"image {recipe.name}: build the cpu image first (cko images build cpu)", field="base"
            )
        buildargs["BASE_IMAGE"] = cpu.image_id
        inputs["base"] = {"kind": "recipe", "name": "cpu", "image_id": cpu.image_id}
    return buildargs, inputs


def _docker_build(
    client: Any, name: str, ctx: Path, tag: str, buildargs: dict[str, str], progress: Progress
) -> str | None:
    """Build the context with no network; the built image's id, when the engine reported it."""
    from docker.errors import APIError, BuildError

    image_id, log_tail = None, list[str]()
    try:
        for chunk in client.api.build(
            path=str(ctx),
            dockerfile="Dockerfile",
            tag=tag,
            buildargs=buildargs,
            network_mode="none",
            rm=True,
            forcerm=True,
            decode=True,
        ):
            line = chunk.get("stream", "").rstrip()
            if line:
                log_tail = (log_tail + [line])[-20:]
                if line.startswith("Step "):
                    progress(line)
            if "error" in chunk:
                raise unavailable(
                    f"docker build of {name} failed: {chunk['error'].strip()} | " + " | ".join(log_tail[-5:]),
                    code="build_failed",
                )
            if "aux" in chunk and "ID" in chunk["aux"]:
                image_id = chunk["aux"]["ID"]
    except (APIError, BuildError) as exc:
        raise unavailable(f"docker build of {name} failed: {exc}", code="build_failed") from None
    return image_id


def _dockerfile_entry(
    client: Any, recipe: Recipe, image: Any, build_tag: str, inputs: dict[str, Any]
) -> ImageEntry:
    """Tag the built image by its id (dropping the build tag) and describe it for the lock."""
    hexid = str(image.id).split(":", 1)[1]
    image.tag(f"cko/{recipe.name}", hexid[:12])
    client.api.remove_image(build_tag, noprune=True)  # keep only the tag named by the id
    df = recipe_file(recipe, recipe.dockerfile or "")
    return ImageEntry(
        name=recipe.name,
        tag=f"cko/{recipe.name}:{hexid[:12]}",
        kind="dockerfile",
        dockerfile=df.name,
        dockerfile_sha256=sha256_file(df),
        inputs_sha256=inputs_hash(recipe.name, recipe),
        build_inputs=inputs,
        image_id=str(image.id),
        size_bytes=int(image.attrs.get("Size") or 0),
        built_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
