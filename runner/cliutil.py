"""Shared CLI conventions: --store/--json on every command, one JSON document on stdout, exit codes."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError
from rich.console import Console

from .errors import CkoError, Exit, pydantic_error

# Human output goes to stderr when --json is given, so stdout carries exactly one JSON document.
_err_console = Console(stderr=True, highlight=False)
_out_console = Console(highlight=False)


@dataclass
class Outcome:
    """What a command returns: a JSON document, a human rendering and an exit code."""

    doc: dict[str, Any]
    human: Any = None
    exit_code: int = Exit.DONE
    extra_human: list[Any] = field(default_factory=list)


def default_store() -> str:
    return os.environ.get("CKO_STORE", "./cko-store")


def common(f: Callable[..., Any]) -> Callable[..., Any]:
    """Add --store and --json to a command."""
    f = click.option(
        "--store",
        "store",
        default=default_store,
        show_default="$CKO_STORE or ./cko-store",
        type=click.Path(path_type=Path),
        help="Artifact store directory.",
    )(f)
    f = click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout, nothing else.")(f)
    return f


def fleet_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Add --fleet and --gpu-model: where the command's invocations run (runner/executor.py)."""
    f = click.option("--gpu-model", help="With --fleet: take the custom resource gpu:<MODEL> per GPU (e.g. H200).")(f)
    f = click.option("--fleet", "fleet", metavar="ADDRESS",
                     help="Run its invocations on a Ray cluster (host:port, ray://host:10001, auto) instead of "
                          "this host. See docs/fleet.md.")(f)
    return f


def console(as_json: bool) -> Console:
    return _err_console if as_json else _out_console


def progress_console() -> Console:
    return _err_console


def emit(as_json: bool, outcome: Outcome) -> None:
    if as_json:
        sys.stdout.write(json.dumps(outcome.doc, indent=2, sort_keys=True, default=str) + "\n")
        sys.stdout.flush()
    else:
        c = _out_console
        if outcome.human is None:
            c.print_json(json.dumps(outcome.doc, default=str))
        else:
            c.print(outcome.human)
        for extra in outcome.extra_human:
            c.print(extra)
    if outcome.exit_code:
        sys.exit(int(outcome.exit_code))


def fail(as_json: bool, err: CkoError) -> None:
    if as_json:
        sys.stdout.write(json.dumps(err.to_json(), indent=2, sort_keys=True, default=str) + "\n")
    _err_console.print(f"[bold red]error[/] ({err.code}): {err.message}", markup=True, soft_wrap=True)
    sys.exit(int(err.exit_code))


def handled(f: Callable[..., Outcome]) -> Callable[..., None]:
    """Run a command body; map CkoError and validation errors to exit codes and messages."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        as_json = bool(kwargs.get("as_json", False))
        try:
            outcome = f(*args, **kwargs)
        except CkoError as err:
            fail(as_json, err)
            return
        except ValidationError as exc:
            fail(as_json, pydantic_error(exc, "request"))
            return
        emit(as_json, outcome)

    return wrapper


def load_json_file(path: Path, what: str) -> Any:
    from .errors import bad_request
    from .hostpath import read_file

    try:
        # By descriptor, a regular file only, bounded: a FIFO or /proc path named as a request
        # never hangs or feeds the controller.
        text = read_file(path, what, limit=64 << 20).decode()
    except UnicodeDecodeError as exc:
        raise bad_request(f"{what}: cannot read {path}: {exc}", field=what) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad_request(f"{what}: {path} is not valid JSON (line {exc.lineno}: {exc.msg})", field=what) from None
