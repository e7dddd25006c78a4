"""`python -I -m operations profile-ncu --report F [--tool-version V | --version-file F] --out D`.

Facts from an Nsight Compute CSV report (raw or details page) into D/result.json
(operations/evidence/ncu.py says what is parsed and what is refused).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..evidence import opmain
from ..evidence.common import read_text_limited
from ..evidence.ncu import DEFAULT_MAX_UNMODELED_LAUNCHES, NcuFacts, parse_ncu_csv


def _build(p: opmain.ArgParser) -> None:
    p.add_argument("--report", required=True, type=Path, help="ncu --csv output (--page raw or details)")
    p.add_argument("--tool-version", default=None, help="ncu version, e.g. 2025.3.1")
    p.add_argument(
        "--version-file", type=Path, default=None, help="`ncu --version` output captured at collection"
    )
    p.add_argument("--max-unmodeled-launches", type=int, default=DEFAULT_MAX_UNMODELED_LAUNCHES)
    opmain.add_binding(p)


def _body(a: argparse.Namespace) -> NcuFacts:
    text = read_text_limited(a.version_file, what="version_file") if a.version_file else None
    return parse_ncu_csv(
        a.report,
        tool_version=a.tool_version,
        version_text=text,
        bound_to=opmain.binding(a),
        max_unmodeled_launches=a.max_unmodeled_launches,
    )


def main(argv: list[str]) -> int:
    return opmain.run("profile-ncu", argv, _build, _body)
