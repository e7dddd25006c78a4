"""Entry point inside the container: `python -I -m operations OP [ARGS...]`.

Each operation is a module `operations.ops.<op>` (hyphens become underscores) with a
`main(argv: list[str]) -> int`. Operations read inputs from read-only mounts and write
everything they produce under their output directory; they never touch the store.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys


def available() -> list[str]:
    from . import ops

    return sorted(
        m.name.replace("_", "-") for m in pkgutil.iter_modules(ops.__path__) if not m.name.startswith("_")
    )


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -I -m operations OP [ARGS...]\noperations: " + ", ".join(available()))
        return 0 if argv else 2
    op = argv[0]
    if op not in available():
        print(f"unknown operation {op!r}; known: {', '.join(available())}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"operations.ops.{op.replace('-', '_')}")
    return int(module.main(argv[1:]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
