"""Shared CLI conventions: --store/--json on every command, one JSON document on stdout, exit codes."""

from __future__ import annotations

import functools
import json
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.text import Text

from .errors import CkoError, Exit, pydantic_error

# Human output goes to stderr when --json is given, so stdout carries exactly one JSON document.
# markup=False: data never passes through Rich markup, so a unit like "[items/s]" is printed as is;
# styled text is built with rich.text.Text. Off a terminal the width is unbounded (logs and CI keep
# every digit instead of "31.…"); NO_COLOR is honoured by Rich itself.
_NO_TTY_WIDTH = 4000


def _console(stderr: bool) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else _NO_TTY_WIDTH
    return Console(stderr=stderr, highlight=False, markup=False, width=width, soft_wrap=width is not None)


_err_console = _console(True)
_out_console = _console(False)

# The keys every JSON document carries, success or error (README, "JSON output").
ENVELOPE_KEYS = ("ok", "command", "exit_code", "schema")


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
    f = click.option(
        "--json", "as_json", is_flag=True, help="Print one JSON document on stdout, nothing else."
    )(f)
    return f


def fleet_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Add --fleet and --gpu-model: where the command's invocations run (runner/executor.py)."""
    f = click.option(
        "--gpu-model", help="With --fleet: take the custom resource gpu:<MODEL> per GPU (e.g. H200)."
    )(f)
    f = click.option(
        "--fleet",
        "fleet",
        metavar="ADDRESS",
        help="Run its invocations on a Ray cluster (host:port, ray://host:10001, auto) instead of "
        "this host. See docs/fleet.md.",
    )(f)
    return f


def console(as_json: bool) -> Console:
    return _err_console if as_json else _out_console


def progress_console() -> Console:
    return _err_console


def say(message: str) -> None:
    """A progress line on stderr (dim), never parsed as markup; also an event of a detached operation."""
    from .detach import event

    _err_console.print(Text(message, style="dim"))
    event("progress", message=message)


# The arguments main() was given: a detached operation runs them again (runner/detach.py).
ARGV: list[str] = []


def detachable(
    model: type[BaseModel] | None = None,
) -> Callable[[Callable[..., Outcome]], Callable[..., Outcome]]:
    """Add --detach: check the request (exit 2, nothing written), start the operation in the background
    and answer at once with its id."""

    def deco(f: Callable[..., Outcome]) -> Callable[..., Outcome]:
        @functools.wraps(f)
        def wrapper(*args: Any, detach: bool = False, **kwargs: Any) -> Outcome:
            if not detach:
                return f(*args, **kwargs)
            return _start_detached(kwargs, model)

        return click.option(
            "--detach",
            is_flag=True,
            help="Return at once with the operation id (op-...); "
            "follow it with `cko status ID --follow` or `--wait`.",
        )(wrapper)

    return deco


def _start_detached(kwargs: dict[str, Any], model: type[BaseModel] | None) -> Outcome:
    from .detach import start
    from .errors import bad_request
    from .store import Store

    stdin_text = None
    request = kwargs.get("request")
    if request is not None:
        text = read_request_text(request, "request")
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise bad_request(
                f"request: not valid JSON (line {exc.lineno}: {exc.msg})", field="request"
            ) from None
        if model is not None:
            if not isinstance(doc, dict):
                raise bad_request("request: must be a JSON object", field="request")
            model.model_validate(doc)
        stdin_text = text if str(request) == "-" else None
    doc = start(Store(kwargs["store"]), ARGV, stdin_text)
    human = (
        f"detached: {doc['invocation_id']} (pid {doc['pid']}); follow with "
        f"cko status {doc['invocation_id']} --follow"
    )
    return Outcome(doc=doc, human=human)


def command_name() -> str:
    """The running command's path without the program name: "champion select"."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return ""
    return ctx.command_path.split(" ", 1)[1] if " " in ctx.command_path else ""


def result_schema_name(command: str) -> str:
    return command.replace(" ", "-") + "-result" if command else "error"


def envelope(
    doc: dict[str, Any], exit_code: int, command: str | None = None, *, error: bool = False
) -> dict[str, Any]:
    """Add the common keys: ok (exit code 0), the command, its exit code and the schema it validates against."""
    cmd = command_name() if command is None else command
    name = "error" if error else (doc.get("schema") or result_schema_name(cmd))
    return {**doc, "ok": int(exit_code) == 0, "command": cmd, "exit_code": int(exit_code), "schema": name}


def write_json(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def emit(as_json: bool, outcome: Outcome) -> None:
    if as_json:
        write_json(envelope(outcome.doc, int(outcome.exit_code)))
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


def error_doc(err: CkoError, command: str | None = None) -> dict[str, Any]:
    return envelope(err.to_json(), int(err.exit_code), command, error=True)


def fail(as_json: bool, err: CkoError, command: str | None = None) -> None:
    if as_json:
        write_json(error_doc(err, command))
    _err_console.print(Text.assemble(("error", "bold red"), f" ({err.code}): {err.message}"))
    sys.exit(int(err.exit_code))


def internal_error(exc: BaseException) -> CkoError:
    """A bug or an unexpected failure: the traceback goes to stderr and into the document's detail."""
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    sys.stderr.write("".join(tb))
    return CkoError(
        f"internal error: {type(exc).__name__}: {exc}",
        exit_code=Exit.FAILED,
        code="internal",
        detail={"exception": type(exc).__name__, "traceback": "".join(tb[-6:])},
    )


def interrupted() -> CkoError:
    return CkoError("interrupted (Ctrl-C / SIGINT)", exit_code=Exit.INTERRUPTED, code="interrupted")


def handled(f: Callable[..., Outcome]) -> Callable[..., None]:
    """Run a command body; every way out becomes an exit code and, with --json, one JSON document."""

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
        except KeyboardInterrupt:
            fail(as_json, interrupted())
            return
        except (SystemExit, click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as exc:  # noqa: BLE001 - the contract: a traceback becomes a JSON error document
            fail(as_json, internal_error(exc))
            return
        emit(as_json, outcome)

    return wrapper


def read_request_text(path: Path, what: str) -> str:
    """The request's text: a file, or stdin for "-"."""
    from .errors import bad_request
    from .hostpath import read_file

    if str(path) == "-":
        return sys.stdin.read()
    try:
        # By descriptor, a regular file only, bounded: a FIFO or /proc path named as a request
        # never hangs or feeds the controller.
        return read_file(path, what, limit=64 << 20).decode()
    except UnicodeDecodeError as exc:
        raise bad_request(f"{what}: cannot read {path}: {exc}", field=what) from None


def load_json_file(path: Path, what: str) -> Any:
    """Parse a JSON file ("-": stdin); bad JSON is exit 2 naming the line."""
    from .errors import bad_request

    text = read_request_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = "stdin" if str(path) == "-" else str(path)
        raise bad_request(
            f"{what}: {where} is not valid JSON (line {exc.lineno}: {exc.msg})", field=what
        ) from None
