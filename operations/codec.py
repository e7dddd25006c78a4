"""Values that cross the supervisor/worker boundary: a workload's inputs and a subject's output.

A value is a tree of dicts, lists, tuples, scalars, strings, NumPy arrays and torch tensors. It is
written as one JSON manifest (the tree, with each array replaced by a slot) plus one raw `.npy`
file per array, never a pickle: the reader is the trusted side and the writer may be hostile, so
decoding allocates only what the manifest declares, checks it against the file's size and refuses
unknown dtypes, depths and sizes with a reason.

Arrays are loaded copy-on-write from shared memory (`mmap_mode="c"`): a worker may overwrite its
copy of the inputs (in-place subjects do) without touching the supervisor's file or paying for a
copy before its timed window.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

MAX_DEPTH = 16
MAX_LEAVES = 4096
# dtypes accepted from the other side (object arrays would mean pickles)
KINDS = set("biufc")
TORCH_BITCAST = {"bfloat16": "int16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8"}


class CodecError(ValueError):
    """A value that cannot be written or read safely, with the reason."""


def _torch_host_view(t: Any) -> tuple[Any, dict[str, Any]]:
    """The tensor as one NumPy can hold (bfloat16 and fp8 bit-cast to ints), still where it lives."""
    t = t.detach()
    tag: dict[str, Any] = {"torch": str(t.dtype).removeprefix("torch."), "device": t.device.type}
    name = tag["torch"]
    if name in TORCH_BITCAST:
        import torch

        t = t.contiguous().view(getattr(torch, TORCH_BITCAST[name]))
    return t, tag


def _numpy_dtype(t: Any) -> np.dtype:
    name = str(t.dtype).removeprefix("torch.")
    try:
        return np.dtype(name)
    except TypeError:
        raise CodecError(f"dtype {name} cannot be passed (numbers only)") from None


# The page-locked stage's size: a larger output crosses in pieces of it, so a worker holds at most
# this much beside the file's own pages (its container's memory limit counts both).
STAGE_BYTES = 64 << 20


class _PinnedStage:
    """One page-locked host buffer per process, reused by every device tensor a worker writes out.

    A device-to-host copy into pageable memory goes through the driver's bounce buffers and faults in
    every fresh page of the destination; into page-locked memory it runs at the link's rate, and the
    file is then filled by write(2), whose page allocation happens in the kernel. For a 32 MB output
    that took a check's fetch from 21 to 10 ms on the H100 (benchmarks/fetch_copy.py)."""

    def __init__(self) -> None:
        self.buf: Any = None

    def host_copy(self, raw: Any) -> Any | None:
        """A page-locked host copy of the 1-D byte tensor `raw` (at most STAGE_BYTES; valid until the
        next call), or None where page-locked memory cannot be had (the caller copies it pageable)."""
        import torch

        need = raw.numel()
        if self.buf is None or self.buf.numel() < need:
            self.buf = None  # the old one is freed before a larger one is asked for
            try:
                size = max(need, min(1 << 20, STAGE_BYTES))
                self.buf = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            except RuntimeError:
                return None
        host = self.buf[:need]
        host.copy_(raw)  # synchronous: the device's bytes are in `host` when this returns
        return host


_PINNED = _PinnedStage()


def _write_npy(t: Any, path: Path, dtype: np.dtype, stage_bytes: int | None = None) -> None:
    """A tensor's bytes as `.npy` (the header from `dtype` and its shape), a device tensor through
    the page-locked stage at most `stage_bytes` at a time."""
    import torch

    if t.element_size() != dtype.itemsize:
        raise CodecError(f"tensor of {t.dtype} cannot be written as {dtype}")
    step = stage_bytes or STAGE_BYTES
    raw = t.contiguous().reshape(-1).view(torch.uint8)
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": tuple(t.shape)}
    with open(path, "wb") as f:
        try:
            np.lib.format.write_array_header_1_0(f, header)
        except ValueError:  # a header past 64 KiB (a shape of very many dimensions)
            np.lib.format.write_array_header_2_0(f, header)
        for start in range(0, raw.numel(), step):
            piece = raw[start : start + step]
            host = _PINNED.host_copy(piece) if piece.device.type != "cpu" else None
            f.write((piece.cpu() if host is None else host).numpy().data)


def _save_torch(t: Any, path: Path, dtype: np.dtype) -> None:
    """Write a tensor as `.npy`: a device tensor through the page-locked stage (one fast copy, one
    write per piece), where `.cpu()` then `np.save` made a host array and copied it again."""
    if t.device.type == "cpu" or t.numel() == 0 or t.dim() == 0:
        np.save(path, np.ascontiguousarray(t.cpu().numpy()), allow_pickle=False)
        return
    _write_npy(t, path, dtype)


def _save_leaf(v: Any, directory: Path, name: str, host_only: bool) -> dict[str, Any]:
    """One array or tensor as `name` under `directory`; its manifest node."""
    tag: dict[str, Any] = {}
    if isinstance(v, np.ndarray):
        dtype = v.dtype
    else:
        v, tag = _torch_host_view(v)
        dtype = _numpy_dtype(v)
        if host_only:
            tag["device"] = "cpu"
    if dtype.kind not in KINDS:
        raise CodecError(f"dtype {dtype} cannot be passed (numbers only)")
    if isinstance(v, np.ndarray):
        np.save(directory / name, np.ascontiguousarray(v), allow_pickle=False)
    else:
        _save_torch(v, directory / name, dtype)
    return {"a": name, "dtype": dtype.str, "shape": list(v.shape)} | tag


def encode(value: Any, directory: Path, host_only: bool = False) -> dict[str, Any]:
    """Write `value` under `directory` (which must exist and be empty); return its manifest.

    `host_only`: torch tensors are recorded as host arrays (outputs are compared on the host)."""
    counter = [0]

    def walk(v: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise CodecError(f"value nested deeper than {MAX_DEPTH}")
        if v is None or isinstance(v, bool | int | float | str):
            return {"s": v}
        if isinstance(v, dict):
            if not all(isinstance(k, str) for k in v):
                raise CodecError("dict keys must be strings")
            return {"d": {k: walk(x, depth + 1) for k, x in v.items()}}
        if isinstance(v, list | tuple):
            return {"l" if isinstance(v, list) else "t": [walk(x, depth + 1) for x in v]}
        if isinstance(v, np.generic):
            return {"s": v.item()}
        if not (type(v).__module__.startswith("torch") or isinstance(v, np.ndarray)):
            raise CodecError(
                f"cannot pass a {type(v).__name__} between processes (arrays, tensors, scalars only)"
            )
        counter[0] += 1
        if counter[0] > MAX_LEAVES:
            raise CodecError(f"more than {MAX_LEAVES} arrays")
        return _save_leaf(v, directory, f"a{counter[0]:04d}.npy", host_only)

    manifest = {"root": walk(value, 0)}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def _load_array(directory: Path, node: dict[str, Any], budget: list[int], device_ok: bool) -> Any:
    name = str(node.get("a", ""))
    if "/" in name or not name.endswith(".npy") or name.startswith("."):
        raise CodecError(f"array file name {name!r} refused")
    dtype = np.dtype(str(node.get("dtype")))
    if dtype.kind not in KINDS:
        raise CodecError(f"dtype {dtype} refused")
    shape = tuple(int(s) for s in node.get("shape", []))
    if any(s < 0 for s in shape):
        raise CodecError("negative dimension refused")
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    path = directory / name
    st = os.lstat(path)
    if not os.path.isfile(path) or os.path.islink(path) or st.st_size < nbytes or st.st_size > nbytes + 4096:
        raise CodecError(f"{name}: file size {st.st_size} does not hold {shape} {dtype}")
    budget[0] -= nbytes
    if budget[0] < 0:
        raise CodecError("value larger than the size allowed for it")
    arr = np.load(path, mmap_mode="c", allow_pickle=False)
    if arr.dtype != dtype or tuple(arr.shape) != shape:
        raise CodecError(f"{name}: header says {arr.shape} {arr.dtype}, manifest {shape} {dtype}")
    if "torch" not in node:
        return arr
    import torch

    t = torch.from_numpy(arr)
    tname = str(node["torch"])
    if tname in TORCH_BITCAST:
        t = t.view(getattr(torch, tname))
    if device_ok and node.get("device") == "cuda":
        t = t.to("cuda")
    return t


def decode(directory: Path, max_bytes: int, device_ok: bool = True) -> Any:
    """Read a value written by `encode`, allocating at most `max_bytes` of array data."""
    try:
        raw = (directory / "manifest.json").read_bytes()
    except OSError as exc:
        raise CodecError(f"no manifest: {exc.strerror}") from None
    if len(raw) > 4 << 20:
        raise CodecError("manifest larger than 4 MiB")
    budget = [max_bytes]
    leaves = [0]

    def walk(node: Any, depth: int) -> Any:
        if depth > MAX_DEPTH or not isinstance(node, dict):
            raise CodecError("malformed manifest")
        leaves[0] += 1
        if leaves[0] > MAX_LEAVES * 4:
            raise CodecError("manifest has too many nodes")
        if "s" in node:
            return node["s"]
        if "d" in node:
            return {str(k): walk(v, depth + 1) for k, v in dict(node["d"]).items()}
        if "l" in node:
            return [walk(v, depth + 1) for v in list(node["l"])]
        if "t" in node:
            return tuple(walk(v, depth + 1) for v in list(node["t"]))
        if "a" in node:
            return _load_array(directory, node, budget, device_ok)
        raise CodecError("malformed manifest")

    try:
        return walk(json.loads(raw).get("root"), 0)
    except (ValueError, TypeError, AttributeError, OSError) as exc:
        raise CodecError(f"unreadable value: {exc}") from None


def nbytes(value: Any) -> int:
    """Array bytes in a value (the bound an output's size is held to)."""
    if isinstance(value, dict):
        return sum(nbytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(nbytes(v) for v in value)
    if hasattr(value, "nbytes") and not isinstance(value, int | float):
        return int(value.nbytes)
    if hasattr(value, "element_size") and hasattr(value, "numel"):
        return int(value.element_size() * value.numel())
    return 0
