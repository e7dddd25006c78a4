"""Named operation images: recipes, the project's lock, and resolution by image id.

The runner never runs a mutable tag: it resolves an image name (`cpu`, `cuda`, `torch-cpu`, or any
recipe a project adds) to the image id its lock records, checks the engine has it (loading it from
the store's archive, the cache, or a registry when it does not: runner/imagemove.py), and checks the
lock's input hash (recipe + requirements + the operations code baked in) still matches, so a stale
image is refused instead of silently running old tool code.

Where things live (nothing is written inside the installed package):
- the lock: $CKO_IMAGES_LOCK, else the nearest `cko-images.lock` from the working directory up,
  else `./cko-images.lock` (a project's lock; the checkout's own is tracked at its root);
- recipes: the project's `cko-images/NAME.yaml` beside that lock, then cko's own (`images/recipes`);
- caches (debootstrap root, wheelhouses, layers, archives): $CKO_CACHE or $XDG_CACHE_HOME/cko.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError

from .canonical import sha256_bytes, sha256_file
from .errors import CkoError, Exit, bad_request, unavailable
from .models import Closed

BUILTIN = ("cpu", "cuda")
IMAGE_NAMES = BUILTIN  # the images every installation knows; projects add their own recipes
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
LOCK_NAME = "cko-images.lock"
# Bump when the way an image is assembled changes: part of every input hash.
BUILDER_VERSION = "2"


class Recipe(Closed):
    """How to make a named image. Exactly one of: packages on a base, a Dockerfile, an image id."""

    name: str = Field(pattern=NAME_RE.pattern)
    base: str = "debootstrap"  # "debootstrap" (cko's Debian root) or another recipe's name
    requirements: str | None = None  # a pinned list (relative to the recipe), installed without resolving
    packages: list[str] = Field(default_factory=list)  # requirement lines resolved by the host's pip
    dockerfile: str | None = None  # built by the engine (not reproducible: its id is recorded)
    image: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$")  # the user's own image
    python: str = "3.11"
    description: str = ""
    origin: str = ""  # where the recipe was read (filled in when loaded)

    @property
    def kind(self) -> Literal["layers", "dockerfile", "image"]:
        return "dockerfile" if self.dockerfile else ("image" if self.image else "layers")


class ImageEntry(Closed):
    name: str
    tag: str
    kind: Literal["layers", "dockerfile", "image"] = "dockerfile"
    reproducible: bool = False
    dockerfile: str | None = None
    dockerfile_sha256: str | None = None
    inputs_sha256: str
    build_inputs: dict[str, Any] = Field(default_factory=dict)
    image_id: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    manifest_digest: str | None = None  # of its OCI manifest, the digest a registry serves it by
    registry_refs: list[str] = Field(default_factory=list)  # where it was pushed: HOST/REPO@sha256:...
    size_bytes: int | None = None
    built_at: str | None = None  # only for engine builds; a reproducible entry has no time in it


class ImagesLock(Closed):
    version: int = 2
    images: dict[str, ImageEntry] = Field(default_factory=dict)


# -- where things are ------------------------------------------------------------------------


def repo_root() -> Path:
    """Where cko's own assets (images/, examples/) are: the checkout, or the installed package."""
    env = os.environ.get("CKO_HOME")
    if env:
        return Path(env).absolute()
    here = Path(__file__).resolve().parent.parent
    if (here / "images").is_dir() and (here / "examples").is_dir():
        return here
    return Path(__file__).resolve().parent / "_assets"  # the wheel: setup.py installs cko_perf/runner/_assets


def assets_root() -> Path:
    return repo_root()


def cache_dir() -> Path:
    env = os.environ.get("CKO_CACHE")
    if env:
        return Path(env).absolute()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "cko"


def lock_path() -> Path:
    env = os.environ.get("CKO_IMAGES_LOCK")
    if env:
        return Path(env).absolute()
    cwd = Path.cwd()
    for d in (cwd, *cwd.parents):
        if (d / LOCK_NAME).is_file():
            return d / LOCK_NAME
    return cwd / LOCK_NAME


def build_dir() -> Path:
    return cache_dir() / "build"


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise bad_request(
            f"image {name!r}: a name is lowercase letters, digits, '.', '_' or '-'", field="image"
        )
    return name


# -- recipes ---------------------------------------------------------------------------------


def recipe_dirs() -> list[Path]:
    return [lock_path().parent / "cko-images", assets_root() / "images" / "recipes"]


def known_recipes() -> list[str]:
    names = set(BUILTIN)
    for d in recipe_dirs():
        names |= {p.stem for p in d.glob("*.yaml")} if d.is_dir() else set()
    return sorted(names)


def load_recipe(name_or_path: str) -> Recipe:
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") and path.is_file()):
        check_name(name_or_path)
        found = [d / f"{name_or_path}.yaml" for d in recipe_dirs() if (d / f"{name_or_path}.yaml").is_file()]
        if not found:
            raise bad_request(
                f"unknown image {name_or_path!r}; known images: {', '.join(known_recipes())} "
                "(a project adds one as cko-images/NAME.yaml beside its cko-images.lock)",
                field="image",
            )
        path = found[0]
    try:
        doc = yaml.safe_load(path.read_text()) or {}
        recipe = Recipe.model_validate({"name": path.stem, **doc, "origin": str(path.resolve())})
    except (ValidationError, yaml.YAMLError) as exc:
        raise bad_request(
            f"recipe {path}: {str(exc).splitlines()[0]}"
            + (f" ({exc.errors()[0]['loc']})" if isinstance(exc, ValidationError) else ""),
            field="recipe",
        ) from None
    kinds = sum(bool(x) for x in (recipe.dockerfile, recipe.image, recipe.requirements or recipe.packages))
    if kinds > 1:
        raise bad_request(
            f"recipe {path}: give packages, a dockerfile or an image, not several", field="recipe"
        )
    return recipe


def recipe_file(recipe: Recipe, rel: str) -> Path:
    p = Path(rel)
    return p if p.is_absolute() else Path(recipe.origin).parent / p


# -- the lock --------------------------------------------------------------------------------


def load_lock(path: Path | None = None) -> ImagesLock:
    path = path or lock_path()
    if not path.exists():
        return ImagesLock()
    try:
        doc = json.loads(path.read_bytes())
        doc["version"] = 2  # a version-1 lock reads the same: its entries are engine builds
        return ImagesLock.model_validate(doc)
    except (ValidationError, ValueError, TypeError) as exc:
        raise CkoError(
            f"{path} is corrupt ({str(exc).splitlines()[0]}); rebuild with `cko images build`",
            exit_code=Exit.UNAVAILABLE,
            code="corrupt_images_lock",
            field="images.lock",
        ) from None


def lock_bytes(lock: ImagesLock) -> bytes:
    return (
        json.dumps(lock.model_dump(mode="json", exclude_none=True), indent=2, sort_keys=True).encode() + b"\n"
    )


def save_entry(entry: ImageEntry, path: Path | None = None) -> bool:
    """Record `entry`; the file is rewritten only when its bytes change (a rebuild of the same
    inputs leaves a tracked lock untouched). Returns whether it changed."""
    from .locks import FileLock
    from .store import write_replace

    path = path or lock_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    guard = cache_dir() / "locks" / f"lock-{sha256_bytes(str(path.resolve()).encode())[:16]}.lck"
    guard.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(guard).hold(120, "the images lock", "cko images build"):
        lock = load_lock(path)  # re-read under the lock: another build may have written another image
        new = lock_bytes(ImagesLock(images={**lock.images, entry.name: entry}))
        if path.exists() and path.read_bytes() == new:
            return False
        write_replace(path, new)
    return True


# -- input hashes ------------------------------------------------------------------------------


def _tree_files(root: Path) -> list[Path]:
    return [
        p
        for p in sorted(root.rglob("*"))
        if p.is_file()
        and "__pycache__" not in p.parts
        and p.suffix != ".pyc"
        and not p.name.startswith(".trace_scan.")
    ]


def operations_dir() -> Path:
    """The operations code baked into the images: runner/'s sibling, in the checkout (cko_perf/'s
    links resolve to the repository's operations/) as in the wheel (cko_perf/operations)."""
    return (
        Path(__file__).resolve().parent.parent / "operations"
        if (Path(__file__).resolve().parent.parent / "operations").is_dir()
        else assets_root() / "operations"
    )


def inputs_hash(name: str, recipe: Recipe | None = None) -> str:
    """Hash of everything the image bakes in from this installation (recipe, lists, operations code)."""
    recipe = recipe or load_recipe(name)
    parts = [
        f"builder\0{BUILDER_VERSION}",
        f"recipe\0{sha256_bytes(recipe.model_dump_json(exclude={'origin'}).encode())}",
    ]
    files: list[tuple[str, Path]] = []
    if recipe.requirements:
        files.append(("requirements", recipe_file(recipe, recipe.requirements)))
    if recipe.dockerfile:
        files.append(("dockerfile", recipe_file(recipe, recipe.dockerfile)))
        files += [
            (f"requirements/{p.name}", p)
            for p in sorted((assets_root() / "images").glob("requirements-*.txt"))
        ]
    ops = operations_dir()
    files += [(f"operations/{p.relative_to(ops).as_posix()}", p) for p in _tree_files(ops)]
    parts += [f"{label}\0{sha256_file(p)}" for label, p in files if p.is_file()]
    if recipe.base != "debootstrap" and recipe.kind == "layers":
        parts.append(f"base\0{inputs_hash(recipe.base)}")
    return sha256_bytes("\n".join(parts).encode())


# -- the engine ------------------------------------------------------------------------------


def docker_client() -> Any:
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env(timeout=300)
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
    for name in sorted(set(BUILTIN) | set(lock.images)):
        entry = lock.images.get(name)
        row: dict[str, Any] = {"name": name, "locked": entry is not None}
        if entry:
            row.update(
                image_id=entry.image_id,
                tag=entry.tag,
                size_bytes=entry.size_bytes,
                kind=entry.kind,
                reproducible=entry.reproducible,
                manifest_digest=entry.manifest_digest,
                registry_refs=entry.registry_refs,
            )
            try:
                row["stale"] = entry.inputs_sha256 != inputs_hash(name)
            except CkoError:
                row["stale"] = None  # the recipe is not here any more: the lock still pins the id
            row["present"] = image_present(client, entry.image_id) if client is not None else None
        else:
            row.update(present=False, stale=None)
        rows.append(row)
    return rows


# An audit runs in the Target's exact image, whatever the lock says now (runner/workflow/audit.py).
_PINNED: dict[str, str] = {}


@contextlib.contextmanager
def pinned(name: str, image_id: str) -> Iterator[None]:
    prior = _PINNED.get(name)
    _PINNED[name] = image_id
    try:
        yield
    finally:
        if prior is None:
            _PINNED.pop(name, None)
        else:
            _PINNED[name] = prior


def resolve(name: str, client: Any) -> ImageEntry:
    """The locked, present, up-to-date image for `name`, or a clear exit-5 error."""
    check_name(name)
    if name in _PINNED:
        pin = _PINNED[name]
        if not image_present(client, pin):
            raise unavailable(f"image {name} {pin} is not in the engine", code="image_missing", field="image")
        return ImageEntry(name=name, tag=pin, inputs_sha256="pinned", image_id=pin)
    entry = load_lock().images.get(name)
    if entry is None and name not in known_recipes():
        raise bad_request(
            f"unknown image {name!r}; known images: {', '.join(known_recipes())}", field="image"
        )
    if entry is None:
        raise unavailable(
            f"image {name} is not built (no entry in {lock_path()}); run `cko images build {name}`",
            code="image_missing",
            field="image",
        )
    if not image_present(client, entry.image_id):
        from .imagemove import fetch_into_engine

        if not fetch_into_engine(client, entry.image_id, name=name):
            raise unavailable(
                f"image {name} ({entry.image_id[:19]}) is in the lock but not in the engine, the "
                f"cache or a registry it was pushed to; run `cko images build {name}` or "
                f"`cko images load`",
                code="image_missing",
                field="image",
            )
    if os.environ.get("CKO_ALLOW_STALE_IMAGE") != "1":
        try:
            stale = entry.inputs_sha256 != inputs_hash(name)
        except CkoError:
            stale = False  # a recipe this installation lacks: the lock's id is all there is to run
        if stale:
            raise unavailable(
                f"image {name} is stale: the operations code or its recipe changed since it was "
                f"built; run `cko images build {name}`",
                code="image_stale",
                field="image",
            )
    return entry
