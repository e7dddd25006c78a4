"""Bytecode for a read-only image, the same bytes on every machine (stdlib only: it runs inside the
build container, with the image's own interpreter).

Why: an image's root is read-only at run time and PYTHONDONTWRITEBYTECODE is set, so without .pyc
files every container compiles every module it imports, at every start (measured in the cpu image
on the 2-core dev machine: importing the supervisor, numpy and scipy.stats took 6.2 s from source,
1.4-1.9 s from bytecode).

Why not `compileall`: its output is not reproducible. marshal's formats 3 and 4 mark an object as a
back-reference depending on its reference count, which depends on whatever else the compiling
process has loaded: `compileall -j1` and `compileall -j0` over the same tree give different bytes.
Here: marshal format 2 (no back-references; every loader reads it), the hash-based unchecked header
of PEP 552 (no source mtime; the image never changes under it), PYTHONHASHSEED=0 (set constants in a
fixed order), files in sorted order, one file per task.

    PYTHONHASHSEED=0 python3 pycompile.py [-j N] SRC IMAGE_DIR [OUT]

compiles every .py under SRC, names each by its path in the image (IMAGE_DIR/<relative path>: what
tracebacks show), and writes <OUT>/<relative dir>/__pycache__/<name>.<cache tag>.pyc (OUT defaults
to SRC: in place). Prints one line: files compiled, files skipped (not valid Python for this
interpreter, e.g. test data).
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import sys
from concurrent.futures import ProcessPoolExecutor

MARSHAL_VERSION = 2  # the last format without back-references (see the module's docstring)
UNCHECKED_HASH = 0b01  # PEP 552 flags: hash-based, source not checked at import


def pyc_bytes(source: bytes, filename: str) -> bytes:
    """The .pyc of `source`, compiled as `filename`."""
    code = compile(source, filename, "exec", dont_inherit=True, optimize=0)
    header = (
        importlib.util.MAGIC_NUMBER
        + UNCHECKED_HASH.to_bytes(4, "little")
        + importlib.util.source_hash(source)
    )
    return header + marshal.dumps(code, MARSHAL_VERSION)


def sources(src: str) -> list[str]:
    """Every .py under src, relative, sorted; bytecode caches are not descended into."""
    out = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        rel = os.path.relpath(dirpath, src)
        out += [os.path.normpath(os.path.join(rel, f)) for f in sorted(filenames) if f.endswith(".py")]
    return sorted(out)


def compile_one(job: tuple[str, str, str, str]) -> bool:
    src, image_dir, out, rel = job
    with open(os.path.join(src, rel), "rb") as f:
        source = f.read()
    try:
        data = pyc_bytes(source, os.path.join(image_dir, rel))
    except (SyntaxError, ValueError):
        return False
    head, name = os.path.split(rel)
    cache = os.path.join(out, head, "__pycache__")
    os.makedirs(cache, exist_ok=True)
    target = os.path.join(cache, f"{name[:-3]}.{sys.implementation.cache_tag}.pyc")
    with open(target + ".part", "wb") as f:
        f.write(data)
    os.replace(target + ".part", target)
    return True


def main(argv: list[str]) -> int:
    jobs = os.cpu_count() or 1
    if argv[:1] == ["-j"]:
        jobs, argv = max(1, int(argv[1])), argv[2:]
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    if sys.flags.hash_randomization:
        print(
            "pycompile: run with PYTHONHASHSEED=0 (set constants must come out in one order)", file=sys.stderr
        )
        return 2
    src, image_dir = argv[0], argv[1]
    out = argv[2] if len(argv) == 3 else src
    work = [(src, image_dir, out, rel) for rel in sources(src)]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        done = list(pool.map(compile_one, work, chunksize=32))
    print(f"pycompile: {sum(done)} compiled, {len(done) - sum(done)} skipped under {image_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
