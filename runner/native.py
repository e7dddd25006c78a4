"""Builds the compiled trace scanner (operations/evidence/native/trace_scan.c) on the host.

    python -m cko_perf.runner.native [--force]

The library lands beside its source, inside `operations`, so the images take it with the rest of
the operations code (and their input hash covers it). It links against libc only and carries the
sha256 of the source it was compiled from; the loader (operations/evidence/trace_native.py)
uses it only when that matches the source beside it. Without a C compiler nothing is built and
torch traces parse on the Python paths: the same facts, about half the speed.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from .canonical import sha256_file

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "operations" / "evidence" / "native" / "trace_scan.c"
LIBRARY = SOURCE.with_suffix(".so")
# no -march: the library runs wherever the images run; no -ffast-math: rounding must be IEEE's
CFLAGS = ("-O2", "-std=c11", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror")


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def built_from(lib: Path) -> str | None:
    """The source sha256 a built library says it came from (None: not a library of ours)."""
    try:
        handle = ctypes.CDLL(str(lib))
        fn = handle.cko_trace_source
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_char_p
    value: bytes = fn()
    return value.decode()


def build(*, force: bool = False, progress: Callable[[str], None] = print) -> Path | None:
    """The library, compiled when missing or built from another source; None without a compiler."""
    digest = sha256_file(SOURCE)
    if not force and LIBRARY.is_file() and built_from(LIBRARY) == digest:
        return LIBRARY
    cc = compiler()
    if cc is None:
        progress(
            "native: no C compiler (cc): torch traces will parse on the Python paths (same facts, slower)"
        )
        return None
    # compiled beside the target and renamed over it: a reader never sees half a library
    fd, tmp = tempfile.mkstemp(prefix=".trace_scan.", suffix=".so", dir=LIBRARY.parent)
    os.close(fd)
    try:
        cmd = [cc, *CFLAGS, f'-DCKO_SOURCE_SHA256="{digest}"', "-o", tmp, str(SOURCE), "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-4000:]}")
        os.chmod(tmp, 0o644)
        os.replace(tmp, LIBRARY)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    progress(f"native: built {LIBRARY.relative_to(ROOT)} with {cc} (source sha256 {digest[:12]})")
    return LIBRARY


def main(argv: list[str]) -> int:
    try:
        build(force="--force" in argv, progress=lambda m: print(m, file=sys.stderr))
    except RuntimeError as exc:
        print(f"native: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
