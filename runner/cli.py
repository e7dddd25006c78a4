"""The `cko` command line (DESIGN.md, CLI): the contract agents and CI script against."""

from __future__ import annotations

import sys

import click

from . import __version__, cliutil
from .cliutil import fail, internal_error, interrupted
from .commands import COMMANDS, GROUPS, LazyGroup
from .errors import CkoError, Exit


@click.group(
    cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}
)
@click.version_option(__version__, prog_name="cko")
def cli() -> None:
    """cko runs one GPU-performance operation at a time inside a pinned, sandboxed container and
    keeps immutable, hash-linked records of what ran where, so any conclusion can be re-checked.

    cko returns facts; it never chooses a direction or promotes a candidate by itself.

    Every command takes --store DIR (default $CKO_STORE, else ./cko-store) and --json.
    Exit codes: 0 done (whatever the verdict), 1 the operation ran and failed, 2 bad request
    (nothing written), 3 refused by policy, 4 timed out, 5 environment unavailable, 130 interrupted.
    `cko commands --json` lists every operation with its request and result schemas.
    """


def _wants_json(argv: list[str]) -> bool:
    head = argv[: argv.index("--")] if "--" in argv else argv
    return "--json" in head


def _usage_error(exc: click.ClickException) -> CkoError:
    """A click usage error as a bad request (exit 2) naming the parameter where click knows it."""
    param = getattr(exc, "param", None)
    name = getattr(param, "name", None) or getattr(exc, "param_hint", None)
    code = "usage" if isinstance(exc, click.UsageError) else "bad_request"
    return CkoError(
        exc.format_message(), exit_code=Exit.BAD_REQUEST, code=code, field=str(name) if name else None
    )


def _command_of(argv: list[str]) -> str:
    """Best-effort command name for documents written before click resolved the command."""
    words = [a for a in (argv[: argv.index("--")] if "--" in argv else argv) if not a.startswith("-")]
    if not words or words[0] not in COMMANDS:
        return ""
    if len(words) > 1 and words[0] in GROUPS:
        return f"{words[0]} {words[1]}"
    return words[0]


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; usage errors, interrupts and crashes outside a command body keep the JSON contract."""
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = _wants_json(args)
    cliutil.ARGV[:] = args
    try:
        rv = cli.main(args=args, prog_name="cko", standalone_mode=False)
    except click.ClickException as exc:
        if exc.exit_code == 0:
            sys.exit(0)
        err = _usage_error(exc)
    except (click.Abort, KeyboardInterrupt):
        err = interrupted()
    except Exception as exc:  # noqa: BLE001 - an unexpected failure still answers in JSON
        err = internal_error(exc)
    else:
        sys.exit(rv if isinstance(rv, int) else 0)
    fail(as_json, err, _command_of(args))


if __name__ == "__main__":
    main()
