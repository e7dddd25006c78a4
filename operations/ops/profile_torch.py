"""`python -I -m operations profile-torch --report trace.json [--tool-version V] --out D`.

Facts from a PyTorch Profiler Chrome trace into D/result.json (operations/evidence/torch_trace.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..evidence import opmain
from ..evidence.torch_trace import DEFAULT_MAX_EVENTS, TorchTraceFacts, parse_torch_trace


def _build(p: opmain.ArgParser) -> None:
    p.add_argument("--report", required=True, type=Path, help="export_chrome_trace output")
    p.add_argument("--tool-version", default=None, help="torch version (the trace does not name it)")
    p.add_argument("--max-events", type=int, default=DEFAULT_MAX_EVENTS, help="GPU events kept in the list")
    p.add_argument("--summary-limit", type=int, default=200, help="names kept per summary")
    opmain.add_binding(p)


def _body(a: argparse.Namespace) -> TorchTraceFacts:
    return parse_torch_trace(
        a.report,
        tool_version=a.tool_version,
        bound_to=opmain.binding(a),
        max_events=a.max_events,
        summary_limit=a.summary_limit,
    )


def main(argv: list[str]) -> int:
    return opmain.run("profile-torch", argv, _build, _body)
