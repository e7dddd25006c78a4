"""`python -I -m operations profile-nsys --report F.sqlite [--tool-version V] --out D`.

Facts from an Nsight Systems SQLite export into D/result.json (operations/evidence/nsys.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..evidence import opmain
from ..evidence.nsys import DEFAULT_MAX_EVENTS, NsysFacts, parse_nsys_sqlite


def _build(p: opmain.ArgParser) -> None:
    p.add_argument("--report", required=True, type=Path, help="nsys export --type sqlite output")
    p.add_argument(
        "--tool-version", default=None, help="nsys version (the export names its own; they must agree)"
    )
    p.add_argument("--max-events", type=int, default=DEFAULT_MAX_EVENTS, help="per-event rows kept per kind")
    opmain.add_binding(p)


def _body(a: argparse.Namespace) -> NsysFacts:
    return parse_nsys_sqlite(
        a.report, tool_version=a.tool_version, bound_to=opmain.binding(a), max_events=a.max_events
    )


def main(argv: list[str]) -> int:
    return opmain.run("profile-nsys", argv, _build, _body)
