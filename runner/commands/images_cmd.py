"""`cko images build|list|save|load|push|pull`: named operation images, pinned by id, moved by digest."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from .. import imagebuild, imagemove
from .. import images as img
from ..cliutil import Outcome, common, handled, say
from ..errors import bad_request


@click.group("images")
def images() -> None:
    """Build, list and move the operation images (the project's cko-images.lock)."""


def _build_args(values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for a in values:
        k, sep, v = a.partition("=")
        if not sep or not k:
            raise bad_request(f"--build-arg {a!r}: expected KEY=VALUE", field="build_arg")
        out[k] = v
    return out


@images.command("build")
@click.argument("names", nargs=-1)
@click.option(
    "--offline",
    is_flag=True,
    help="Accepted for compatibility: cko's own images are always built "
    "offline (a debootstrap root and a local wheelhouse; no registry).",
)
@click.option("--base-image", help="A Dockerfile image (cuda): use this local image (id or tag) as its base.")
@click.option("--if-missing", is_flag=True, help="Skip images whose lock entry is present and up to date.")
@click.option(
    "--build-arg", "build_args", multiple=True, help="KEY=VALUE passed to docker build (Dockerfile images)."
)
@common
@handled
def build_cmd(
    store: Path,
    as_json: bool,
    names: tuple[str, ...],
    offline: bool,
    base_image: str | None,
    if_missing: bool,
    build_args: tuple[str, ...],
) -> Outcome:
    """Build images by name (default: cpu) or recipe file, and record their ids in the lock."""
    chosen = list(names) or ["cpu"]
    bargs = _build_args(build_args)
    built, skipped = [], []
    client = img.docker_client()
    for name in chosen:
        if if_missing and Path(name).suffix not in (".yaml", ".yml"):
            row = next((r for r in img.image_status(client) if r["name"] == name), {})
            if row.get("present") and row.get("stale") is False:
                skipped.append(name)
                continue
        entry, facts = imagebuild.build_image(
            name, offline=offline, base_image=base_image, progress=say, build_args=bargs
        )
        built.append(entry.model_dump(mode="json", exclude_none=True) | facts)
    table = Table("image", "id", "reproducible", "size", "seconds", "lock")
    for e in built:
        table.add_row(
            e["name"],
            e["image_id"][:19],
            str(e["reproducible"]),
            f"{(e.get('size_bytes') or 0) / 1e6:.0f} MB",
            str(e["seconds"]),
            "updated" if e["lock_changed"] else "unchanged",
        )
    for name in skipped:
        table.add_row(name, "(up to date)", "", "", "", "unchanged")
    return Outcome(doc={"built": built, "skipped": skipped, "lock": str(img.lock_path())}, human=table)


@images.command("list")
@common
@handled
def list_cmd(store: Path, as_json: bool) -> Outcome:
    """Show each image in the lock, whether the engine has it, and whether it is stale."""
    try:
        client = img.docker_client()
    except Exception:
        client = None
    rows = img.image_status(client)
    table = Table("image", "id", "present", "stale", "reproducible", "size")
    for r in rows:
        table.add_row(
            r["name"],
            (r.get("image_id") or "-")[:19],
            str(r.get("present")),
            str(r.get("stale")),
            str(r.get("reproducible", "-")),
            f"{(r.get('size_bytes') or 0) / 1e6:.0f} MB" if r.get("size_bytes") else "-",
        )
    return Outcome(
        doc={
            "images": rows,
            "recipes": img.known_recipes(),
            "engine_reachable": client is not None,
            "lock": str(img.lock_path()),
        },
        human=table,
    )


def _image_id(ref: str) -> str:
    """A name in the lock, or an image id."""
    if ref.startswith("sha256:"):
        if len(ref) != 71:
            raise bad_request(f"{ref!r}: an image id is sha256: and 64 hex digits", field="image")
        return ref
    entry = img.load_lock().images.get(img.check_name(ref))
    if entry is None:
        raise bad_request(f"image {ref!r} is not in {img.lock_path()}", field="image")
    return entry.image_id


@images.command("save")
@click.argument("image")
@click.option(
    "--to", "to", type=click.Path(path_type=Path), help="Write the archive here instead of into the store."
)
@common
@handled
def save_cmd(store: Path, as_json: bool, image: str, to: Path | None) -> Outcome:
    """Keep IMAGE (a name or an id) as an OCI archive in the store (images/<id>.tar), or at --to."""
    image_id = _image_id(image)
    client = img.docker_client()
    dest = to or imagemove.store_archive(store.absolute(), image_id)
    doc = imagemove.save(client, image_id, dest)
    return Outcome(doc=doc, human=f"{image_id[:19]} -> {dest} ({doc['bytes'] / 1e6:.0f} MB)")


@images.command("load")
@click.argument("source")
@common
@handled
def load_cmd(store: Path, as_json: bool, source: str) -> Outcome:
    """Load an archive (a path, or an image id kept in the store) into the engine, checking every digest."""
    client = img.docker_client()
    path = imagemove.store_archive(store.absolute(), source) if source.startswith("sha256:") else Path(source)
    if not path.is_file():
        raise bad_request(f"{path}: no such archive", field="source")
    doc = imagemove.load(client, path)
    return Outcome(doc=doc, human=f"loaded {doc['image_id'][:19]} from {path}")


@images.command("push")
@click.argument("image")
@click.option("--registry", required=True, help="HOST[:PORT] of the registry (plain HTTP only on localhost).")
@click.option("--repository", help="Repository in the registry (default: cko/NAME).")
@common
@handled
def push_cmd(store: Path, as_json: bool, image: str, registry: str, repository: str | None) -> Outcome:
    """Push IMAGE by digest; a name's lock entry records where it went."""
    image_id = _image_id(image)
    name = None if image.startswith("sha256:") else image
    repo = repository or f"cko/{name or 'image'}"
    doc = imagemove.push(image_id, registry, repo, client=img.docker_client())
    if name:
        entry = img.load_lock().images[name]
        if doc["ref"] not in entry.registry_refs:
            img.save_entry(
                entry.model_copy(update={"registry_refs": sorted([*entry.registry_refs, doc["ref"]])})
            )
    return Outcome(doc=doc, human=f"pushed {image_id[:19]} as {doc['ref']}")


@images.command("pull")
@click.argument("ref")
@common
@handled
def pull_cmd(store: Path, as_json: bool, ref: str) -> Outcome:
    """Pull HOST[:PORT]/REPO@sha256:DIGEST (every blob checked) and load it."""
    doc = imagemove.pull(ref, img.docker_client())
    return Outcome(doc=doc, human=f"pulled {doc['image_id'][:19]} from {ref}")


commands = [images]
