"""The compiled scanner of PyTorch traces (native/trace_scan.c), loaded with ctypes.

The library is built on the host (`runner/native.py`, run by `make` and by `cko images build`)
into `native/trace_scan.so` next to its source, and so travels into the images with the rest of
`operations`. It links against libc only, not Python, so one build serves every CPython here.
Where it is missing, of another ABI, or built from another source than the one beside it,
`scan` returns None and the Python paths parse alone: slower, same facts. `CKO_TRACE_NATIVE=0`
(read at import) turns it off.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from pathlib import Path
from typing import Any, cast

SOURCE = Path(__file__).resolve().parent / "native" / "trace_scan.c"
LIBRARY = SOURCE.with_suffix(".so")
ABI = 1
TOP_KEYS = (
    "schemaVersion",
    "deviceProperties",
    "cuda_runtime_version",
    "cuda_driver_version",
    "cupti_version",
    "baseTimeNanoseconds",
)
F_CORR, F_EXT, F_ARGS = 1, 2, 4
OK, BAIL, NOMEM = 0, 1, 2

_i64 = ctypes.c_int64


class _Cat(ctypes.Structure):
    _fields_ = [("off", _i64), ("len", _i64), ("kind", _i64), ("count", _i64)]


class _Name(ctypes.Structure):
    _fields_ = [(f, _i64) for f in ("cat", "off", "len", "n", "total", "min", "max")]


class _Gpu(ctypes.Structure):
    _fields_ = [
        (f, _i64)
        for f in (
            "start",
            "dur",
            "cat",
            "name",
            "corr",
            "ext",
            "args_off",
            "args_len",
            "op",
            "launch",
            "launch_start",
            "index",
            "flags",
        )
    ]


class _Result(ctypes.Structure):
    _fields_ = [
        ("status", _i64),
        ("fail_at", _i64),
        ("events", _i64),
        ("has_window", _i64),
        ("lo", _i64),
        ("hi", _i64),
        ("gpu_total", _i64),
        ("correlated", _i64),
        ("top_off", _i64 * len(TOP_KEYS)),
        ("top_len", _i64 * len(TOP_KEYS)),
        ("cats", ctypes.POINTER(_Cat)),
        ("ncats", _i64),
        ("names", ctypes.POINTER(_Name)),
        ("nnames", _i64),
        ("gpu", ctypes.POINTER(_Gpu)),
        ("ngpu", _i64),
    ]


def load(library: Path = LIBRARY, source: Path = SOURCE) -> Any:
    """The library with its signatures set, or None (turned off, missing, another ABI, stale)."""
    if os.environ.get("CKO_TRACE_NATIVE", "1") == "0" or not library.is_file():
        return None
    try:
        lib = ctypes.CDLL(str(library))
        lib.cko_trace_source.restype = ctypes.c_char_p
        if lib.cko_trace_abi() != ABI or lib.cko_trace_result_size() != ctypes.sizeof(_Result):
            return None
        # a library built from another source than the one beside it (stale) is not used
        if lib.cko_trace_source().decode() != hashlib.sha256(source.read_bytes()).hexdigest():
            return None
    except (OSError, AttributeError):  # another platform's build, an older one, no source
        return None
    lib.cko_trace_scan.restype = _i64
    lib.cko_trace_scan.argtypes = [
        ctypes.c_char_p,
        _i64,
        ctypes.POINTER(ctypes.c_char_p),
        ctypes.POINTER(_i64),
        _i64,
        _i64,
        ctypes.POINTER(_Result),
    ]
    lib.cko_trace_free.restype = None
    lib.cko_trace_free.argtypes = [ctypes.POINTER(_Result)]
    return lib


LIB = load()


def available() -> bool:
    return LIB is not None


class Scanned:
    """What the scanner found, copied out of C memory: plain Python values only."""

    def __init__(self, r: _Result, data: bytes) -> None:
        self.events = r.events
        self.window = (r.lo, r.hi) if r.has_window else None
        self.gpu_total = r.gpu_total
        self.correlated = r.correlated
        self.top = {
            k: bytes(data[r.top_off[i] : r.top_off[i] + r.top_len[i]])
            for i, k in enumerate(TOP_KEYS)
            if r.top_len[i] >= 0
        }

        def text(off: int, n: int) -> str:
            return data[off : off + n].decode("utf-8")  # validated by the scanner

        # (category or None, kind or -1, count), in order of first appearance
        self.cats: list[tuple[str | None, int, int]] = [
            (text(c.off, c.len) if c.len >= 0 else None, c.kind, c.count)
            for c in (r.cats[i] for i in range(r.ncats))
        ]
        # (category index, name, n, total, min, max), in order of first appearance
        self.names: list[tuple[int, str, int, int, int, int]] = [
            (n.cat, text(n.off, n.len), n.n, n.total, n.min, n.max)
            for n in (r.names[i] for i in range(r.nnames))
        ]
        # the first GPU events by start: (start, dur, cat, name, corr, ext, args bytes, op, launch,
        # launch start), indexes into cats and names, None where the trace has none. The rows are
        # copied out in one piece and split by memoryview (per-field ctypes access cost ~50 ms)
        self.gpu: list[tuple[Any, ...]] = []
        table: list[list[int]] = []
        if r.ngpu:
            rows = ctypes.string_at(r.gpu, r.ngpu * ctypes.sizeof(_Gpu))
            table = cast(list[list[int]], memoryview(rows).cast("q", (r.ngpu, len(_Gpu._fields_))).tolist())
        for (
            start,
            dur,
            cat,
            name,
            corr,
            ext,
            args_off,
            args_len,
            op,
            launch,
            launch_start,
            _index,
            f,
        ) in table:
            self.gpu.append(
                (
                    start,
                    dur,
                    cat,
                    name,
                    corr if f & F_CORR else None,
                    ext if f & F_EXT else None,
                    data[args_off : args_off + args_len] if f & F_ARGS else None,
                    op if op >= 0 else None,
                    launch if launch >= 0 else None,
                    launch_start,
                )
            )


def scan(data: bytes, kinds: dict[str, int], max_gpu: int) -> Scanned | None:
    """The scanner's findings, or None where it declines (not built, or anything it cannot
    vouch for: the Python paths then decide). Raises MemoryError when C memory runs out."""
    if LIB is None:
        return None
    names = list(kinds)
    c_names = (ctypes.c_char_p * len(names))(*(n.encode() for n in names))
    c_kinds = (_i64 * len(names))(*(kinds[n] for n in names))
    r = _Result()
    try:
        status = LIB.cko_trace_scan(data, len(data), c_names, c_kinds, len(names), max_gpu, ctypes.byref(r))
        if status == NOMEM:
            raise MemoryError("the trace scanner ran out of memory")
        if status != OK:
            return None
        return Scanned(r, data)
    finally:
        LIB.cko_trace_free(ctypes.byref(r))
