"""`python -I -m operations execution-map --request F [--report F] --out D`.

The request (JSON, operations/evidence/execution_map.py ExecutionMapRequest) gives either
intervals or a source report (nsys export or PyTorch trace, `source.report` a path here; or
--report, which then replaces it), a window, exclusions and the named sets whose removable
time is bounded. D/result.json gets coverage, overlap, idle gaps and the bounds.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pydantic import ValidationError

from ..evidence import opmain
from ..evidence.common import Refusal, open_report, read_text_limited
from ..evidence.execution_map import (
    PARSER,
    PARSER_VERSION,
    ExecutionMapFacts,
    ExecutionMapRequest,
    execution_map,
    intervals_from_request,
    intervals_from_source,
)

REQUEST_LIMIT = 512 << 20


def _build(p: opmain.ArgParser) -> None:
    p.add_argument("--request", required=True, type=Path, help="execution-map request JSON")
    p.add_argument("--report", type=Path, default=None, help="the source report (replaces source.report)")


def _body(a: argparse.Namespace) -> ExecutionMapFacts:
    text = read_text_limited(a.request, limit=REQUEST_LIMIT, what="request")
    try:
        req = ExecutionMapRequest.model_validate(json.loads(text))
    except json.JSONDecodeError as exc:
        raise Refusal(
            "not_json", f"request is not JSON (line {exc.lineno}: {exc.msg})", field="request"
        ) from None
    except ValidationError as exc:
        e = exc.errors()[0]
        loc = ".".join(str(x) for x in e.get("loc", ()))
        raise Refusal(
            "invalid_request", f"request: {loc or '(root)'}: {e.get('msg')}", field=loc or None
        ) from None
    if req.source is not None:
        path = a.report or Path(req.source.report)
        digest, size = open_report(path)
        intervals = intervals_from_source(req.source, path)
        report = {
            "report_sha256": digest,
            "report_bytes": size,
            "tool": req.source.kind,
            "source_kind": req.source.kind,
        }
    else:
        assert req.intervals is not None
        digest, size = open_report(a.request)
        intervals = intervals_from_request(req.intervals)
        report = {
            "report_sha256": digest,
            "report_bytes": size,
            "tool": "intervals",
            "source_kind": "intervals",
        }
    report.update(
        tool_version=None,
        tool_version_source=None,
        parser=PARSER,
        parser_version=PARSER_VERSION,
        dialect="intervals-1",
    )
    window = (req.window.start_ns, req.window.end_ns) if req.window else None
    return execution_map(
        intervals, window=window, exclude=req.exclude, remove=req.remove, max_gaps=req.max_gaps, report=report
    )


def main(argv: list[str]) -> int:
    return opmain.run("execution-map", argv, _build, _body)
