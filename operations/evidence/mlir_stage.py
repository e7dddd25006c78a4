"""Facts of one Triton MLIR stage (the `.source`, TTIR and TTGIR files of Triton's cache).

Every operation (`%x = tt.load ...`, `"tt.reduce"(...)`, `scf.for ...`) is counted by its full
name and by its dialect; every dialect named by an operation, a type (`!ttg.memdesc`) or an
attribute (`#ttg.blocked`) must be in DIALECTS, or the stage is refused (`unknown_dialect`):
an op of a dialect cko does not know could be anything, so it is not counted as nothing.
TTGIR layouts (`#mma = #ttg.nvidia_mma<{versionMajor = 3, ...}>`) and the module attributes
(`ttg.num-warps`, `ttg.target`, ...) are kept as written.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field

from .common import Facts, Refusal, open_report, text_lines

# The dialects Triton 3.6's NVIDIA pipeline writes into .source/TTIR/TTGIR.
DIALECTS: dict[str, str] = {
    "tt": "Triton",
    "ttg": "TritonGPU",
    "ttng": "TritonNvidiaGPU",
    "nvws": "NVIDIA warp specialization",
    "nvg": "NVIDIA GPU (Triton's nvgpu)",
    "nvgpu": "NVGPU",
    "arith": "MLIR arith",
    "scf": "MLIR structured control flow",
    "cf": "MLIR control flow",
    "math": "MLIR math",
    "ub": "MLIR undefined behaviour (ub.poison)",
    "gpu": "MLIR gpu",
    "llvm": "MLIR LLVM dialect",
    "proton": "Proton profiler",
    "builtin": "MLIR builtin",
}
TENSOR_CORE_OPS = (
    "tt.dot",
    "tt.dot_scaled",
    "ttng.warp_group_dot",
    "ttng.tc_gen5_mma",
    "ttng.tc_gen5_mma_scaled",
)
MAX_LINE = 1 << 22  # TTGIR signatures with many arguments are long lines

_OP = re.compile(r'^\s*(?:%[^=]*?=\s*)?"?([A-Za-z_]\w*)\.([\w.$]+)"?(?=[\s(<{:]|$)')
_ALIAS = re.compile(r"^#(\w+)\s*=\s*#(\w+)\.(\w+)(?:<\{(.*)\}>)?")
_REF = re.compile(r"(?<![\w.])[#!]([A-Za-z_]\w*)\.\w")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_MOD_ATTR = re.compile(r'"?((?:ttg|ttng|tt)\.[\w-]+)"?\s*=\s*("[^"]*"|-?\d+)')
_PARAM = re.compile(r"(\w+)\s*=\s*(\[[^\]]*\]|[\w.-]+)")


class Layout(Facts):
    alias: str  # "mma"
    kind: str  # "ttg.nvidia_mma"
    params: dict[str, str] = Field(default_factory=dict)  # versionMajor -> "3", instrShape -> "[16, 128, 16]"


class MlirStage(Facts):
    stage: str  # "source", "ttir", "ttgir"
    sha256: str
    bytes: int
    lines: int
    functions: list[str]  # tt.func names
    operations: int
    ops: dict[str, int]  # full op name -> count
    dialects: dict[str, int]  # dialect -> ops
    module_attributes: dict[str, str] = Field(default_factory=dict)
    layouts: list[Layout] = Field(default_factory=list)
    mma_versions: list[str] = Field(default_factory=list)  # "3.0" from #ttg.nvidia_mma
    tensor_core: dict[str, int] = Field(default_factory=dict)
    async_copy: dict[str, int] = Field(default_factory=dict)  # ttg.async_*
    tma: dict[str, int] = Field(default_factory=dict)  # *tma*, tt.descriptor_*
    barriers: dict[str, int] = Field(default_factory=dict)  # ttng.*barrier*


def _check_dialect(name: str, stage: str, n: int) -> None:
    if name not in DIALECTS:
        raise Refusal(
            "unknown_dialect",
            f"{stage} line {n}: dialect {name!r} is not one cko knows ({', '.join(sorted(DIALECTS))})",
            field=stage,
            dialect=name,
            line=n,
        )


def _layout(m: re.Match[str], stage: str, n: int) -> Layout:
    _check_dialect(m.group(2), stage, n)
    params = {k: v for k, v in _PARAM.findall(m.group(4) or "")}
    return Layout(alias=m.group(1), kind=f"{m.group(2)}.{m.group(3)}", params=params)


class _Acc:
    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.ops: dict[str, int] = {}
        self.layouts: list[Layout] = []
        self.attrs: dict[str, str] = {}
        self.functions: list[str] = []
        self.lines = 0

    def line(self, n: int, line: str) -> None:
        self.lines = n
        if line.startswith("#loc") or not line.strip():
            return
        if line.startswith("#"):
            m = _ALIAS.match(line)
            if m:
                self.layouts.append(_layout(m, self.stage, n))
            return
        if line.startswith("module"):
            self.attrs.update({k: v.strip('"') for k, v in _MOD_ATTR.findall(line)})
        m = _OP.match(line)
        if m:
            _check_dialect(m.group(1), self.stage, n)
            op = f"{m.group(1)}.{m.group(2)}"
            self.ops[op] = self.ops.get(op, 0) + 1
            if op == "tt.func":
                f = re.search(r'@("[^"]+"|[\w$.]+)', line)
                self.functions.append(f.group(1).strip('"') if f else "?")
        for d in _REF.findall(_STRING.sub('""', line)):
            _check_dialect(d, self.stage, n)


def _classes(ops: dict[str, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {"tensor_core": {}, "async_copy": {}, "tma": {}, "barriers": {}}
    for op, k in ops.items():
        if op in TENSOR_CORE_OPS or op.startswith("ttng.warp_group_dot"):
            out["tensor_core"][op] = k
        if op.startswith("ttg.async_"):
            out["async_copy"][op] = k
        if "tma" in op or op.startswith(("tt.descriptor_", "tt.make_tensor_descriptor")):
            out["tma"][op] = k
        if "barrier" in op:
            out["barriers"][op] = k
    return out


def parse_mlir_stage(path: str | Path, stage: str) -> MlirStage:
    digest, size = open_report(path)
    acc = _Acc(stage)
    for n, line in text_lines(path, MAX_LINE, field=stage):
        acc.line(n, line)
    if not acc.ops:
        raise Refusal("not_mlir", f"no MLIR operations: not a Triton {stage} file", field=stage)
    dialects: dict[str, int] = {}
    for op, k in acc.ops.items():
        d = op.split(".", 1)[0]
        dialects[d] = dialects.get(d, 0) + k
    mma = sorted(
        {
            f"{la.params.get('versionMajor')}.{la.params.get('versionMinor', '0')}"
            for la in acc.layouts
            if la.kind == "ttg.nvidia_mma"
        }
    )
    return MlirStage(
        stage=stage,
        sha256=digest,
        bytes=size,
        lines=acc.lines,
        functions=acc.functions,
        operations=sum(acc.ops.values()),
        ops=dict(sorted(acc.ops.items(), key=lambda kv: (-kv[1], kv[0]))),
        dialects=dict(sorted(dialects.items(), key=lambda kv: (-kv[1], kv[0]))),
        module_attributes=acc.attrs,
        layouts=acc.layouts,
        mma_versions=mma,
        **_classes(acc.ops),
    )
