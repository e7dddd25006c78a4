"""CLI command modules; each exposes `commands` (a list of click commands or groups)."""

from __future__ import annotations

import importlib
import sys

import click

# One module per area; the order is the order of `cko --help`.
MODULES = [
    "runner.commands.doctor_cmd",
    "runner.commands.images_cmd",
    "runner.commands.exec_cmd",
    "runner.commands.workflow_cmd",
    "runner.commands.stats_cmd",
    "runner.commands.evidence_cmd",
    "runner.commands.knowledge_cmd",
    "runner.commands.champion_cmd",
    "runner.commands.store_cmd",
    "runner.commands.fleet_cmd",
]


def register(cli: click.Group) -> None:
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            # One broken area must not take the whole CLI down; say so loudly on stderr.
            print(f"cko: commands from {name} unavailable: {exc}", file=sys.stderr)
            continue
        for command in module.commands:
            cli.add_command(command)
