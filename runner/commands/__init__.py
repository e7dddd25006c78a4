"""CLI command modules, loaded lazily: `cko exec` must not pay for scipy's import.

Each module exposes `commands` (a list of click commands or groups); COMMANDS maps every
top-level command name to the module that defines it.
"""

from __future__ import annotations

import importlib
import sys

import click

COMMANDS: dict[str, str] = {
    "doctor": "doctor_cmd",
    "images": "images_cmd",
    "exec": "exec_cmd",
    "readiness": "workflow_cmd",
    "baseline": "workflow_cmd",
    "variant": "workflow_cmd",
    "experiment": "workflow_cmd",
    "stats": "stats_cmd",
    "profile": "evidence_cmd",
    "sass": "evidence_cmd",
    "execution-map": "evidence_cmd",
    "knowledge": "knowledge_cmd",
    "champion": "champion_cmd",
    "audit": "champion_cmd",
    "report": "champion_cmd",
    "demo": "champion_cmd",
    "status": "store_cmd",
    "cancel": "store_cmd",
    "verify": "store_cmd",
    "repair": "store_cmd",
    "reap": "store_cmd",
    "schema": "store_cmd",
    "fleet": "fleet_cmd",
    "commands": "agent_cmd",
    "ls": "agent_cmd",
    "stop": "agent_cmd",
    "mcp": "agent_cmd",
}
# Commands that are groups: their subcommand is part of the command's name ("champion select").
GROUPS = frozenset({"images", "stats", "profile", "knowledge", "champion", "fleet"})


def _load(module: str) -> dict[str, click.Command]:
    name = f"{__name__}.{module}"
    try:
        mod = importlib.import_module(name)
    except ImportError as exc:
        # One broken area must not take the whole CLI down; say so loudly on stderr.
        print(f"cko: commands from {name} unavailable: {exc}", file=sys.stderr)
        return {}
    return {c.name: c for c in mod.commands if c.name}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = COMMANDS.get(cmd_name)
        if module is None:
            return None
        return _load(module).get(cmd_name)
