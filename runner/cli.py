"""The `cko` command line (DESIGN.md, CLI): the contract agents and CI script against."""

from __future__ import annotations

import click

from . import __version__
from .commands import LazyGroup


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="cko")
def cli() -> None:
    """cko runs one GPU-performance operation at a time inside a pinned, sandboxed container and
    keeps immutable, hash-linked records of what ran where, so any conclusion can be re-checked.

    cko returns facts; it never chooses a direction or promotes a candidate by itself.

    Every command takes --store DIR (default $CKO_STORE, else ./cko-store) and --json.
    Exit codes: 0 done (whatever the verdict), 1 the operation ran and failed, 2 bad request
    (nothing written), 3 refused by policy, 4 timed out, 5 environment unavailable.
    """



def main() -> None:
    cli(prog_name="cko")


if __name__ == "__main__":
    main()
