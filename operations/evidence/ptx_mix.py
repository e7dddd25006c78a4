"""The PTX instruction mix: an opcode's family, state space and access width, and the classes
cko reports (tensor core, async copy, bulk copy, TMA, barriers), from the opcode text alone."""

from __future__ import annotations

from typing import Protocol

SPACES = {
    "global": "global",
    "shared": "shared",
    "shared::cta": "shared",
    "shared::cluster": "shared::cluster",
    "local": "local",
    "param": "param",
    "const": "const",
}
TYPE_BYTES = {"8": 1, "16": 2, "32": 4, "64": 8, "128": 16}
LOAD_OPS, STORE_OPS = ("ld", "ldu"), ("st",)
BARRIER_FAMILIES = ("bar", "barrier", "mbarrier", "fence", "membar")
FLAG_FAMILIES = (
    "wgmma",
    "tcgen05",
    "mbarrier",
    "ldmatrix",
    "stmatrix",
    "setmaxnreg",
    "elect",
    "griddepcontrol",
)


class _Mix(Protocol):
    opcodes: dict[str, int]
    families: dict[str, int]
    loads: dict[str, dict[str, int]]
    stores: dict[str, dict[str, int]]
    tensor_core: dict[str, int]
    async_copy: dict[str, int]
    bulk_copy: dict[str, int]
    tma: dict[str, int]
    barriers: dict[str, int]
    flags: list[str]


def width_bytes(parts: list[str]) -> int | None:
    """`ld.global.v4.b32` -> 16; `st.shared.b16` -> 2; `ld.global.f16x2` -> 4; None if no type."""
    vec = 1
    size = None
    for p in parts:
        if p[:1] == "v" and p[1:].isdigit():
            vec = int(p[1:])
        elif p[:1] in "bsuf" and p[1:].isdigit() and p[1:] in TYPE_BYTES:
            size = TYPE_BYTES[p[1:]]
        elif p in ("f16x2", "bf16x2"):
            size = 4
        elif p in ("bf16", "e4m3x2", "e5m2x2"):
            size = 2
    return None if size is None else vec * size


def space_of(parts: list[str]) -> str:
    for p in parts:
        if p in SPACES:
            return SPACES[p]
    return "generic"


def _add(d: dict[str, int], k: str, n: int) -> None:
    d[k] = d.get(k, 0) + n


def _memory(f: _Mix, op: str, parts: list[str], n: int) -> None:
    table = f.loads if parts[0] in LOAD_OPS else f.stores
    w = width_bytes(parts[1:])
    _add(table.setdefault(space_of(parts[1:]), {}), "?" if w is None else str(w), n)


def _copy_class(f: _Mix, op: str) -> dict[str, int] | None:
    if op.startswith(
        ("cp.async.bulk.tensor", "cp.reduce.async.bulk.tensor", "cp.async.bulk.prefetch.tensor")
    ):
        return f.tma
    if op.startswith(("cp.async.bulk", "cp.reduce.async.bulk")):
        return f.bulk_copy
    if op.startswith("cp.async"):
        return f.async_copy
    return None


def classify(f: _Mix) -> None:
    """Fill families, loads/stores, the classes and flags from f.opcodes."""
    for op, n in f.opcodes.items():
        parts = op.split(".")
        fam = parts[0]
        _add(f.families, fam, n)
        if fam in LOAD_OPS or fam in STORE_OPS:
            _memory(f, op, parts, n)
        if fam == "mma" or op.startswith(("wgmma.mma_async", "tcgen05.mma")):
            _add(f.tensor_core, op, n)
        cls = _copy_class(f, op)
        if cls is not None:
            _add(cls, op, n)
        if fam in BARRIER_FAMILIES:
            _add(f.barriers, op, n)
    flags = set()
    if any(op.split(".")[0] == "mma" for op in f.tensor_core):
        flags.add("mma")
    flags.update(fam for fam in FLAG_FAMILIES if fam in f.families)
    for name, d in (("cp.async", f.async_copy), ("cp.async.bulk", f.bulk_copy), ("tma", f.tma)):
        if d:
            flags.add(name)
    if "local" in f.loads or "local" in f.stores:
        flags.add("local_memory")
    f.flags = sorted(flags)
