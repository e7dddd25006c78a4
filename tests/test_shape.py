"""The codebase's shape: the longest functions and modules, printed, and held to agreed bounds.

A function over FUNCTION_LINES or a module over MODULE_LINES fails this test unless it is named in
LONG below with the reason it is long. The table is the list of what is still to split: shrinking
an entry's function below the bound makes its line here stale, and that fails too, so the table
only ever shrinks with the code. Lines are physical lines after `ruff format` (docstrings and
comments included), the measure a reader scrolls through.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

FUNCTION_LINES = 60
MODULE_LINES = 1000
PACKAGES = ("runner", "operations", "knowledge")

_PARSER = "one pass over a report's rows that carries its state from row to row"
_SPLIT = "still to split (issue 23)"
LONG: dict[str, str] = {
    "operations/evidence/ncu.py:_parse_details": _PARSER,
    "operations/evidence/ncu.py:parse_ncu_csv": _PARSER,
    "operations/evidence/ncu.py:_parse_raw": _PARSER,
    "operations/evidence/ncu.py:add": "one table of metric names to facts, read top to bottom",
    "operations/evidence/torch_trace.py:_facts": _PARSER,
    "operations/evidence/torch_trace.py:scan_decoded": _PARSER
    + " (the reference path of the native scanner)",
    "operations/evidence/torch_trace.py:scan_events": _PARSER + " (the msgspec path)",
    "operations/evidence/sass.py:parse_ptxas": _PARSER,
    "operations/evidence/trace_native.py:__init__": "binds the C scanner's symbols and their ctypes signatures",
    "operations/driver.py:main": "argument parsing of the helper's command line",
    "operations/supervisor.py:timed": "the timed window: freeze, bracket, run, fetch, thaw in one visible order",
    "operations/stats.py:sequential_compare": "the sequential test's looks, in the order the plan declares",
    "runner/sandbox.py:run": "create, attach, start, wait, stop, collect, remove: every exit path removes",
    "runner/sandbox.py:container_kwargs": "every hardening option of a container, in one place to audit",
    "runner/demo.py:run_demo": "the demo's eight steps in order, each a few lines",
    "runner/doctor.py:diagnose": "one check after another, each a few lines",
    "runner/hostpath.py:walk": "the host path walk: every refusal beside the check that makes it",
    "runner/mcp_server.py:serve": "the MCP tool table built in one place",
}


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if "__pycache__" not in p.parts)


def _measure() -> tuple[dict[str, int], dict[str, int]]:
    functions, modules = {}, {}
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        modules[rel] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                key = f"{rel}:{node.name}"
                functions[key] = max(
                    functions.get(key, 0), (node.end_lineno or node.lineno) - node.lineno + 1
                )
    return functions, modules


def test_longest_functions_and_modules_are_within_bounds_or_say_why() -> None:
    functions, modules = _measure()
    print("\nlongest functions:")
    for key, n in sorted(functions.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  {n:5d}  {key}")
    print("longest modules:")
    for key, n in sorted(modules.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  {n:5d}  {key}")
    over = {k for k, n in functions.items() if n > FUNCTION_LINES} | {
        k for k, n in modules.items() if n > MODULE_LINES
    }
    unexplained = sorted(over - set(LONG))
    assert not unexplained, (
        f"over the bounds ({FUNCTION_LINES} lines a function, {MODULE_LINES} a module): {unexplained}"
    )
    stale = sorted(set(LONG) - over)
    assert not stale, f"within the bounds now: take them out of LONG: {stale}"


def test_no_import_runs_back_up() -> None:
    """The layering issue 23 asked for, from the project's own import graph (tests/import_graph.py):
    the container side never imports the host side; the executor seam does not know the fleet
    behind it; the fleet's wire and placement are below its controller and node."""
    from tests.import_graph import graph

    g = graph(ROOT, depth=3)
    for group, deps in g.items():
        if group.startswith(("operations", "knowledge")):
            assert not any(d.startswith("runner") for d in deps), (group, deps)
    assert not any(d.startswith("runner.fleet") for d in g["runner.executor"]), g["runner.executor"]
    for low in ("runner.fleet.wire", "runner.fleet.placement"):
        assert not g[low] & {"runner.fleet.controller", "runner.fleet.node", "runner.fleet.executor"}, g[low]
    print("\n".join(f"{k:32} -> {', '.join(sorted(v)) or '-'}" for k, v in sorted(g.items())))


# Files that run inside an operation image, where the supervisor is the top-level `operations`
# (/opt/cko/src): a workload's kernels and drivers import it by that name.
CONTAINER_SIDE = ("tests/adversarial", "tests/hostile_driver")
HOST_SIDE = ("cko_perf", "runner", "knowledge", "tests", "benchmarks")


def _imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0:  # a relative import stays in its package
        return [node.module or ""]
    return []


def _top_level_imports(path: Path) -> list[str]:
    """Imports of a top-level runner, operations or knowledge in one file, as `file:line: module`."""
    rel = path.relative_to(ROOT)
    return [
        f"{rel}:{node.lineno}: {name}"
        for node in ast.walk(ast.parse(path.read_text()))
        for name in _imported(node)
        if name.split(".")[0] in PACKAGES
    ]


def test_host_code_imports_only_the_cko_perf_namespace() -> None:
    """The wheel installs one top-level package, cko_perf (issue 21): host code that imported a
    top-level `runner`, `operations` or `knowledge` would work in the checkout (its folders are on
    the path there) and break in the wheel, or load a second copy of the same modules beside it."""
    files = sorted(
        p
        for top in HOST_SIDE
        for p in (ROOT / top).glob("*.py" if top == "cko_perf" else "**/*.py")
        if "__pycache__" not in p.parts and not p.relative_to(ROOT).as_posix().startswith(CONTAINER_SIDE)
    )
    assert len(files) > 100, files
    bad = [line for p in files for line in _top_level_imports(p)]
    assert not bad, "import these as cko_perf.<package> (or relatively):\n" + "\n".join(bad)
