"""`cko images build|list`: the pinned operation images."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from .. import images as img
from ..cliutil import Outcome, common, handled, say
from ..errors import bad_request


@click.group("images")
def images() -> None:
    """Build and list the pinned operation images (images/images.lock)."""


@images.command("build")
@click.argument("names", nargs=-1, type=click.Choice(img.IMAGE_NAMES))
@click.option("--offline", is_flag=True, help="Build from a debootstrap root and a local wheelhouse (no registry).")
@click.option("--base-image", help="Use this local image (id or tag) as the base, e.g. one made from a GPU host's toolkit.")
@click.option("--if-missing", is_flag=True, help="Skip images whose lock entry is present and up to date.")
@click.option("--build-arg", "build_args", multiple=True, help="KEY=VALUE passed to docker build (e.g. PYTHON=...).")
@common
@handled
def build_cmd(store: Path, as_json: bool, names: tuple[str, ...], offline: bool, base_image: str | None,
              if_missing: bool, build_args: tuple[str, ...]) -> Outcome:
    """Build images (default: cpu) and record their ids in images/images.lock."""
    chosen = list(names) or ["cpu"]
    bargs = {}
    for a in build_args:
        k, sep, v = a.partition("=")
        if not sep or not k:
            raise bad_request(f"--build-arg {a!r}: expected KEY=VALUE", field="build_arg")
        bargs[k] = v
    built = []
    skipped = []
    client = img.docker_client()
    for name in chosen:
        if if_missing:
            row = next(r for r in img.image_status(client) if r["name"] == name)
            if row.get("present") and not row.get("stale"):
                skipped.append(name)
                continue
        entry = img.build_image(name, offline=offline, base_image=base_image,
                                progress=say, build_args=bargs)
        built.append(entry.model_dump(mode="json"))
    table = Table("image", "id", "size", "seconds")
    for e in built:
        table.add_row(e["name"], e["image_id"][:19], f"{(e['size_bytes'] or 0) / 1e6:.0f} MB",
                      str(e["build_inputs"].get("seconds")))
    for name in skipped:
        table.add_row(name, "(up to date)", "", "")
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
    table = Table("image", "id", "present", "stale", "size", "built")
    for r in rows:
        table.add_row(r["name"], (r.get("image_id") or "-")[:19], str(r.get("present")), str(r.get("stale")),
                      f"{(r.get('size_bytes') or 0) / 1e6:.0f} MB" if r.get("size_bytes") else "-",
                      r.get("built_at") or "-")
    return Outcome(doc={"images": rows, "engine_reachable": client is not None, "lock": str(img.lock_path())},
                   human=table)


commands = [images]
