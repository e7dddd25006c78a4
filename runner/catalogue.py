"""The machine-readable catalogue of operations (`cko commands --json`, the tools of `cko mcp`).

Built from the click commands themselves, so it cannot drift from the CLI: name, summary, options,
request schema, result schema and exit codes of every command.
"""

from __future__ import annotations

from typing import Any

import click

from .errors import Exit
from .results import RESULTS

EXIT_CODES: dict[str, str] = {
    "0": "done (whatever the verdict)",
    "1": "the operation ran and failed",
    "2": "bad request or usage (nothing written)",
    "3": "refused by policy",
    "4": "timed out",
    "5": "environment unavailable",
    "130": "interrupted",
}
# Commands whose --request file follows a schema (`cko schema NAME`).
REQUEST_SCHEMAS = {
    "readiness": "readiness-request",
    "baseline": "baseline-request",
    "variant": "variant-request",
    "experiment": "experiment-request",
    "execution-map": "execution-map-request",
}
# Exit codes beyond the common ones, or that mean something specific for the command.
SPECIFIC_EXITS: dict[str, dict[str, str]] = {
    "readiness": {"1": "not ready: blockers with the cheapest next step, no Target"},
    "experiment": {
        "0": "done whatever the verdict",
        "1": "run, accuracy or integrity failed, or --fail-on matched",
        "2": "bad request, or target_stage_final / screen_rejected",
    },
    "audit": {
        "0": "holds (--stack: measured, whatever the case verdicts)",
        "1": "does not hold",
        "2": "bad request; --stack: refused, more than the declared component differs (nothing written)",
        "5": "could not check (--stack: an arm not on its Target's frozen stack, or a host component)",
    },
    "verify": {"1": "a missing or altered file, or a recorded verdict the samples do not give again"},
    "status": {"0": "shown (with --follow/--wait: the operation's own exit code)", "4": "--timeout passed"},
    "champion select": {"1": "the evidence does not support selection (codes in the document)"},
}
NOT_TOOLS = frozenset({"mcp", "demo"})  # a server, and a whole demo loop in a fresh store


def _option(p: click.Parameter) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": p.name,
        "kind": "argument" if isinstance(p, click.Argument) else "option",
        "required": bool(p.required),
        "multiple": bool(getattr(p, "multiple", False)),
        "nargs": p.nargs,
    }
    if isinstance(p, click.Option):
        doc["flags"] = list(p.opts)
        doc["is_flag"] = bool(p.is_flag)
        doc["help"] = p.help or ""
    if isinstance(p.type, click.Choice):
        doc["choices"] = list(p.type.choices)
    doc["type"] = {"INT": "integer", "FLOAT": "number", "BOOL": "boolean"}.get(p.type.name.upper(), "string")
    return doc


def leaf_commands(
    group: click.Group, ctx: click.Context, prefix: str = ""
) -> list[tuple[str, click.Command]]:
    out: list[tuple[str, click.Command]] = []
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None:
            continue
        path = f"{prefix}{name}"
        if isinstance(cmd, click.Group):
            out += leaf_commands(cmd, ctx, path + " ")
        else:
            out.append((path, cmd))
    return out


def catalogue() -> list[dict[str, Any]]:
    from .cli import cli

    ctx = click.Context(cli, info_name="cko")
    out = []
    for path, cmd in leaf_commands(cli, ctx):
        exits = dict(EXIT_CODES) | SPECIFIC_EXITS.get(path, {})
        out.append(
            {
                "name": path,
                "summary": (cmd.get_short_help_str(limit=200) or "").strip(),
                "help": (cmd.help or "").strip(),
                "request_schema": REQUEST_SCHEMAS.get(path),
                "result_schema": (path.replace(" ", "-") + "-result") if path in RESULTS else None,
                "error_schema": "error",
                "exit_codes": exits,
                "detachable": any(p.name == "detach" for p in cmd.params),
                "options": [_option(p) for p in cmd.params if p.name not in ("as_json",)],
            }
        )
    return out


ENVELOPE_DOC = {
    "keys": ["ok", "command", "exit_code", "schema"],
    "ok": "true exactly when exit_code is 0",
    "error": "error documents add error (a code), message, field, detail; schema is 'error'",
    "detached": "--detach answers with schema 'detached-result' and invocation_id op-...",
    "interrupt_exit_code": int(Exit.INTERRUPTED),
}
