"""What the evidence operations (operations/ops/profile_*.py, sass.py, execution_map.py) share.

Convention: inputs are paths in argv (mounted read-only under /cko/in); the fact set goes to
`--out DIR` as DIR/result.json. Exit 0 with the facts; exit 1 with
`{"error": code, "message": ..., "field": ...}` when the input is refused; exit 2 with
`{"error": "bad_arguments", ...}` for a bad command line. Never a traceback for bad input: an
unexpected exception is written as `{"error": "parser_error", ...}` (exit 1) too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from .common import Binding, Refusal, binding_from_args


class BadArguments(Exception):
    pass


class ArgParser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting."""

    def error(self, message: str) -> Any:
        raise BadArguments(message)


def add_binding(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("identity the report is bound to (from the caller's Target)")
    g.add_argument("--bind-target", default=None, help="Target id")
    g.add_argument("--bind-gpu-name", default=None)
    g.add_argument("--bind-compute-capability", default=None, help='e.g. "9.0"')
    g.add_argument("--bind-driver", default=None, help="NVIDIA driver version")
    g.add_argument("--bind-subject", default=None, help='"original" or a variant id')
    g.add_argument("--bind-snapshot", default=None, help="sha256 of the subject's snapshot")


def binding(args: argparse.Namespace) -> Binding | None:
    return binding_from_args(
        args.bind_target,
        args.bind_gpu_name,
        args.bind_compute_capability,
        args.bind_driver,
        getattr(args, "bind_subject", None),
        getattr(args, "bind_snapshot", None),
    )


def write_result(out: Path, doc: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out, prefix=".result-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(doc, f, sort_keys=True, separators=(",", ":"), allow_nan=False)
        f.write("\n")
    os.replace(tmp, out / "result.json")


def _out_from_argv(argv: list[str]) -> Path | None:
    for i, a in enumerate(argv):
        if a == "--out" and i + 1 < len(argv):
            return Path(argv[i + 1])
        if a.startswith("--out="):
            return Path(a.split("=", 1)[1])
    return None


def run(
    prog: str,
    argv: list[str],
    build: Callable[[ArgParser], None],
    body: Callable[[argparse.Namespace], BaseModel | dict[str, Any]],
) -> int:
    """Parse argv, run body, write DIR/result.json; return the exit code."""
    p = ArgParser(prog=f"python -I -m operations {prog}", add_help=True)
    p.add_argument("--out", required=True, type=Path, help="output directory (result.json is written there)")
    build(p)
    try:
        args = p.parse_args(argv)
    except BadArguments as exc:
        out = _out_from_argv(argv)
        doc = {"error": "bad_arguments", "message": f"{prog}: {exc}", "field": None}
        if out is not None:
            try:
                write_result(out, doc)
            except OSError:
                pass
        print(doc["message"], file=sys.stderr)
        return 2
    try:
        facts = body(args)
        doc = facts.model_dump(mode="json") if isinstance(facts, BaseModel) else facts
        code = 0
    except Refusal as r:
        doc, code = r.to_json(), 1
    except Exception as exc:  # a parser bug on odd input: still a document, never a traceback
        doc = {"error": "parser_error", "message": f"{type(exc).__name__}: {str(exc)[:500]}", "field": None}
        code = 1
    try:
        write_result(args.out, doc)
    except (OSError, ValueError) as exc:
        print(f"{prog}: cannot write {args.out}/result.json: {exc}", file=sys.stderr)
        return 1
    if code:
        print(f"{prog}: {doc['error']}: {doc['message']}", file=sys.stderr)
    return code
