"""The project's import graph at package level, from its sources (ast, no import runs).

    python3 tests/import_graph.py [--depth 2] [ROOT]

Prints one line per module group (`runner.fleet`, `runner.workflow`, `operations.evidence` ... at
--depth dotted parts) with the groups it imports, and the imports that run "back up" (a group
importing its own parent package's modules from inside a subpackage is fine; a lower layer
importing a higher one is listed). tests/test_shape.py asserts the layering the design names.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

PACKAGES = ("runner", "operations", "knowledge")
NAMESPACE = "cko_perf"  # the one top-level import name the three folders are installed under


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(root: Path, path: Path) -> set[str]:
    """Fully qualified project modules imported by one file (relative imports resolved)."""
    mod = _module_name(root, path)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    # `cko_perf.runner.cli` is the installed name of runner/cli.py: the graph names modules by folder
    names = {m.removeprefix(f"{NAMESPACE}.") for m in out}
    return {m for m in names if m.split(".")[0] in PACKAGES}


def graph(root: Path, depth: int) -> dict[str, set[str]]:
    """group -> groups it imports (both cut to `depth` dotted parts; a group's own imports left out)."""
    modules = {
        _module_name(root, p): p
        for pkg in PACKAGES
        for p in (root / pkg).rglob("*.py")
        if "__pycache__" not in p.parts
    }

    def group(m: str) -> str:
        while m not in modules and "." in m:  # `from pkg import name` names a symbol, not a module
            m = m.rpartition(".")[0]
        return ".".join(m.split(".")[:depth])

    edges: dict[str, set[str]] = {}
    for m, p in modules.items():
        g = group(m)
        edges.setdefault(g, set()).update(group(i) for i in _imports(root, p) if group(i) != g)
    return edges


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", nargs="?", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--depth", type=int, default=2)
    args = ap.parse_args()
    for g, deps in sorted(graph(args.root, args.depth).items()):
        print(f"{g:28} -> {', '.join(sorted(deps)) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
