"""Triton's compiled kernel, stage by stage, from its cache directory (`~/.triton/cache/<hash>/`)
or the files of `kernel.asm` and `kernel.metadata` written the same way:
`<name>.json` (metadata), `<name>.source`, `.ttir`, `.ttgir`, `.llir`, `.ptx`, `.cubin`.

* The metadata must come from a Triton version in TRITON_VERSIONS and the `cuda` backend; its
  name, warps, stages, CTAs, shared memory, target and hash are kept. Anything else is refused.
* A file whose suffix is not a stage in STAGES is refused (`unknown_stage`): no silent skipping.
* `__grp__<name>.json` (the cache's index of host paths) is recognised and not read, as are the
  host modules Triton compiles into the same cache with the system compiler (`__triton_launcher*.so`,
  the kernels' C launcher, and `cuda_utils*.so`, its driver glue): they belong to no kernel's stages.
* The stages are cross-checked: the PTX entry, the LLIR function and the TTGIR function carry the
  metadata's name; TTGIR's `ttg.num-warps` and `ttg.target` and PTX's `.target` agree with it.
  Disagreements are facts (`mismatches`), not refusals.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from pydantic import Field

from .common import Facts, Refusal, read_text_limited, sha256_file
from .mlir_stage import MlirStage, parse_mlir_stage
from .ptx import PtxModule, parse_ptx
from .triton_llir import LlirStage, parse_llir

TRITON_VERSIONS = ("3.6",)  # major.minor whose cache layout and dialects the fixtures show
BACKENDS = ("cuda",)
STAGES = ("json", "source", "ttir", "ttgir", "llir", "ptx", "cubin")
GROUP_PREFIX = "__grp__"
HOST_MODULES = ("__triton_launcher", "cuda_utils")  # name prefixes of .so files Triton caches beside kernels
MAX_KERNELS = 256
MAX_FILES = 4096
METADATA_LIMIT = 1 << 20


class TritonMetadata(Facts):
    name: str
    hash: str | None
    triton_version: str
    backend: str
    arch: int | str | None
    warp_size: int | None
    num_warps: int
    num_stages: int | None
    num_ctas: int | None
    shared: int | None  # bytes of shared memory the launch asks for
    tmem_size: int | None = None
    maxnreg: int | None = None
    cluster_dims: list[int] | None = None
    global_scratch_size: int | None = None


class Blob(Facts):
    sha256: str
    bytes: int


class TritonKernel(Facts):
    name: str
    files: dict[str, Blob]  # stage suffix -> the file's hash and size
    metadata: TritonMetadata
    ir: dict[str, MlirStage] = Field(default_factory=dict)  # source, ttir, ttgir
    llir: LlirStage | None = None
    ptx: PtxModule | None = None
    cubin: Blob | None = None
    mismatches: list[str] = Field(default_factory=list)


class TritonReport(Facts):
    kernels: list[TritonKernel]


def _field(doc: dict[str, Any], key: str, kind: type | tuple[type, ...], required: bool = True) -> Any:
    v = doc.get(key)
    if v is None and not required:
        return None
    if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool:
        raise Refusal("bad_metadata", f"metadata {key!r} is missing or not {kind}", field=f"metadata.{key}")
    return v


def parse_metadata(path: str | Path) -> TritonMetadata:
    try:
        doc = json.loads(read_text_limited(path, METADATA_LIMIT, what="metadata"))
    except json.JSONDecodeError as exc:
        raise Refusal("not_json", f"metadata is not JSON: {exc.msg} at {exc.pos}", field="metadata") from None
    if not isinstance(doc, dict):
        raise Refusal("bad_metadata", "metadata is not a JSON object", field="metadata")
    version = _field(doc, "triton_version", str)
    if ".".join(version.split(".")[:2]) not in TRITON_VERSIONS:
        raise Refusal(
            "unknown_triton_version",
            f"triton {version} is not one cko knows ({', '.join(TRITON_VERSIONS)})",
            field="metadata.triton_version",
        )
    target = _field(doc, "target", dict)
    backend = target.get("backend")
    if backend not in BACKENDS:
        raise Refusal("unknown_backend", f"backend {backend!r} is not {BACKENDS}", field="metadata.target")

    def opt_int(key: str) -> int | None:
        v: int | None = _field(doc, key, int, required=False)
        return v

    return TritonMetadata(
        name=_field(doc, "name", str),
        hash=_field(doc, "hash", str, required=False),
        triton_version=version,
        backend=backend,
        arch=target.get("arch") if isinstance(target.get("arch"), int | str) else None,
        warp_size=opt_int("warp_size"),
        num_warps=_field(doc, "num_warps", int),
        num_stages=opt_int("num_stages"),
        num_ctas=opt_int("num_ctas"),
        shared=opt_int("shared"),
        tmem_size=opt_int("tmem_size"),
        maxnreg=opt_int("maxnreg"),
        cluster_dims=_field(doc, "cluster_dims", list, required=False),
        global_scratch_size=opt_int("global_scratch_size"),
    )


def _by_stage(files: list[Path]) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for p in files:
        ext = p.suffix.lstrip(".")
        if ext not in STAGES:
            raise Refusal(
                "unknown_stage",
                f"{p.name}: suffix {ext!r} is not a Triton stage cko knows ({', '.join(STAGES)})",
                field="triton",
            )
        if ext in out:
            raise Refusal(
                "ambiguous_stage",
                f"two {ext} files for one kernel: {out[ext].name}, {p.name}",
                field="triton",
            )
        out[ext] = p
    if "json" not in out:
        raise Refusal("no_metadata", "no <name>.json metadata beside the stages", field="triton")
    return out


def _mismatches(k: TritonKernel) -> list[str]:
    md, out = k.metadata, []
    if k.ptx is not None:
        names = [f.name for f in k.ptx.functions if f.kind == "entry"]
        if md.name not in names:
            out.append(f"ptx entries {names} do not include metadata name {md.name!r}")
        if md.arch is not None and k.ptx.target.removeprefix("sm_").rstrip("af") != str(md.arch):
            out.append(f"ptx .target {k.ptx.target} is not metadata arch {md.arch}")
    if k.llir is not None and md.name not in k.llir.functions_defined:
        out.append(f"llir defines {k.llir.functions_defined}, not {md.name!r}")
    tg = k.ir.get("ttgir")
    if tg is not None:
        warps = tg.module_attributes.get("ttg.num-warps")
        if warps is not None and warps != str(md.num_warps):
            out.append(f"ttgir ttg.num-warps {warps} is not metadata num_warps {md.num_warps}")
        tgt = tg.module_attributes.get("ttg.target")
        if tgt is not None and md.arch is not None and tgt != f"{md.backend}:{md.arch}":
            out.append(f"ttgir ttg.target {tgt} is not {md.backend}:{md.arch}")
    return out


def parse_triton_kernel(files: list[Path]) -> TritonKernel:
    """One kernel's files (any order, names free): facts per stage, or a Refusal."""
    by = _by_stage(files)
    blobs = {
        ext: Blob(sha256=d, bytes=n) for ext, (d, n) in ((e, sha256_file(p)) for e, p in sorted(by.items()))
    }
    k = TritonKernel(name="", files=blobs, metadata=parse_metadata(by["json"]))
    k.name = k.metadata.name
    for stage in ("source", "ttir", "ttgir"):
        if stage in by:
            k.ir[stage] = parse_mlir_stage(by[stage], stage)
    k.llir = parse_llir(by["llir"]) if "llir" in by else None
    k.ptx = parse_ptx(by["ptx"]) if "ptx" in by else None
    k.cubin = blobs.get("cubin")
    k.mismatches = _mismatches(k)
    return k


def _entries(d: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(d) as it:
            out = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        raise Refusal("unreadable", f"cannot list {d}: {exc.strerror or exc}", field="triton") from None
    for e in out:
        if e.is_symlink():
            raise Refusal(
                "symlink", f"{e.path} is a symbolic link: Triton's cache holds none", field="triton"
            )
    return out


def _groups_in(d: Path) -> list[list[Path]]:
    """The kernels of one directory: its regular files grouped by stem (`__grp__*` left out)."""
    stems: dict[str, list[Path]] = {}
    for e in _entries(d):
        if e.is_dir(follow_symlinks=False):
            continue
        if not stat.S_ISREG(e.stat(follow_symlinks=False).st_mode):
            raise Refusal("not_regular", f"{e.path} is not a regular file", field="triton")
        if e.name.startswith(GROUP_PREFIX) or e.name.startswith("."):
            continue
        if e.name.endswith(".so") and e.name.startswith(HOST_MODULES):
            continue
        stem = e.name.rsplit(".", 1)[0]
        stems.setdefault(stem, []).append(Path(e.path))
    return [stems[s] for s in sorted(stems)]


def kernel_groups(root: str | Path) -> list[list[Path]]:
    """Kernel file groups under a Triton cache directory: the directory itself, its children and
    grandchildren (`cache/<hash>/` or `dir/<label>/<hash>/`), in name order."""
    root = Path(root)
    if root.is_symlink() or not root.is_dir():
        raise Refusal("not_a_directory", f"{root} is not a directory", field="triton")
    out: list[list[Path]] = []
    level = [root]
    for _depth in range(3):
        nxt: list[Path] = []
        for d in level:
            out.extend(_groups_in(d))
            nxt.extend(Path(e.path) for e in _entries(d) if e.is_dir(follow_symlinks=False))
        level = nxt
        if sum(len(g) for g in out) > MAX_FILES or len(out) > MAX_KERNELS:
            raise Refusal(
                "too_many_files", f"more than {MAX_KERNELS} kernels or {MAX_FILES} files", field="triton"
            )
    if not out:
        raise Refusal("no_kernels", f"no Triton kernel files under {root}", field="triton")
    return out
