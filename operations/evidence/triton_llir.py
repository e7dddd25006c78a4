"""Facts of Triton's LLVM IR stage (`<kernel>.llir`): size, functions defined and declared, the
`llvm.*` intrinsics it calls and the first opcode of each inline-asm string (Triton writes wgmma
and cp.async.bulk as inline PTX). An intrinsic of another target (`llvm.amdgcn.*`, `llvm.x86.*`)
or a `target triple` other than NVPTX's is refused: these are facts of NVIDIA kernels only."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field

from .common import Facts, Refusal, open_report, text_lines

TRIPLES = ("nvptx64-nvidia-cuda", "nvptx-nvidia-cuda")
# llvm.<namespace>.* intrinsics: generic ones have no target namespace; NVPTX's is nvvm.
TARGET_NAMESPACES = (
    "amdgcn",
    "r600",
    "x86",
    "aarch64",
    "arm",
    "wasm",
    "riscv",
    "ppc",
    "spv",
    "hexagon",
    "s390",
)
MAX_LINE = 1 << 22

_DEFINE = re.compile(r"^define\b[^@]*@([\w$.\"]+)")
_DECLARE = re.compile(r"^declare\b[^@]*@([\w$.\"]+)")
_CALL = re.compile(r"@(llvm\.[\w.]+)\(")
_ASM = re.compile(r'asm\s+(?:sideeffect\s+)?(?:convergent\s+)?"\s*(?:@\$\d+\s+)?([a-z][\w.:]*)')
_TRIPLE = re.compile(r'^target triple\s*=\s*"([^"]*)"')


class LlirStage(Facts):
    sha256: str
    bytes: int
    lines: int
    triple: str | None
    functions_defined: list[str]
    declarations: int
    intrinsics: dict[str, int] = Field(default_factory=dict)  # llvm.nvvm.wgmma.fence... -> calls
    inline_asm: dict[str, int] = Field(default_factory=dict)  # "wgmma.mma_async.sync..." -> uses


def _refuse_foreign(name: str, n: int) -> None:
    ns = name.split(".")[1] if name.count(".") >= 2 else ""
    if ns in TARGET_NAMESPACES:
        raise Refusal(
            "foreign_intrinsic",
            f"llir line {n}: intrinsic {name} is not NVPTX's: cko reads NVIDIA kernels only",
            field="llir",
        )


def _add(d: dict[str, int], k: str) -> None:
    d[k] = d.get(k, 0) + 1


def parse_llir(path: str | Path) -> LlirStage:
    digest, size = open_report(path)
    defined: list[str] = []
    intr: dict[str, int] = {}
    asm: dict[str, int] = {}
    triple: str | None = None
    decls = lines = 0
    for n, line in text_lines(path, MAX_LINE, field="llir"):
        lines = n
        if m := _DEFINE.match(line):
            defined.append(m.group(1).strip('"'))
        elif _DECLARE.match(line):
            decls += 1
            continue
        elif m := _TRIPLE.match(line):
            triple = m.group(1)
            if triple not in TRIPLES:
                raise Refusal("unknown_target_triple", f"target triple {triple!r} is not NVPTX", field="llir")
        for name in _CALL.findall(line):
            _refuse_foreign(name, n)
            _add(intr, name)
        for op in _ASM.findall(line):
            _add(asm, op)
    if not defined:
        raise Refusal("not_llvm_ir", "no `define` of a function: not LLVM IR", field="llir")
    return LlirStage(
        sha256=digest,
        bytes=size,
        lines=lines,
        triple=triple,
        functions_defined=defined,
        declarations=decls,
        intrinsics=dict(sorted(intr.items(), key=lambda kv: (-kv[1], kv[0]))),
        inline_asm=dict(sorted(asm.items(), key=lambda kv: (-kv[1], kv[0]))),
    )
