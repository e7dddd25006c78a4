"""One PyTorch trace parsed on each of the parser's paths, for tests that hold the paths equal.

`outcome` runs the parser as it runs by default (the compiled scanner first where it is built);
`python_fast` as where the scanner is not built; `reference` as where msgspec is not installed
(the reference path alone). Each gives the facts as JSON or ("refused", code, field, message).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cko_perf.operations.evidence import torch_trace, trace_native
from cko_perf.operations.evidence.common import Refusal


def outcome(path: Path, **kw) -> str | tuple:
    try:
        return torch_trace.parse_torch_trace(path, **kw).model_dump_json()
    except Refusal as r:
        return ("refused", r.code, r.field, r.message)


def reference(path: Path, monkeypatch: pytest.MonkeyPatch, **kw) -> str | tuple:
    with monkeypatch.context() as m:
        m.setattr(torch_trace, "msgspec", None)  # no msgspec: no scanner either
        return outcome(path, **kw)


def python_fast(path: Path, monkeypatch: pytest.MonkeyPatch, **kw) -> str | tuple:
    with monkeypatch.context() as m:
        m.setattr(trace_native, "LIB", None)
        return outcome(path, **kw)
