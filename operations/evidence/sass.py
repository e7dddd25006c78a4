"""Compiler evidence: `ptxas -v` reports, `cuobjdump --dump-sass` and `--dump-resource-usage` output.

* ptxas (`nvcc -Xptxas -v` or `ptxas -v`, stderr): per function and target, registers, barriers,
  stack frame, spill stores and loads, shared, constant (per bank) and local memory, cumulative
  stack, compile time. Items of a "Used ..." line this parser does not know are kept verbatim
  under `unmodeled`.
* SASS (`cuobjdump --dump-sass` of an executable, object, fatbin or cubin): per function and
  target, the instruction count, a histogram of opcodes without predicate and modifiers
  ("LDG") and with modifiers ("LDG.E.128.CONSTANT"), predicated instructions, and flags:
  tensor-core instructions (HMMA, HGMMA, IMMA, QGMMA, ...), local memory (LDL/STL), global load
  and store widths in bytes (LDG.E.128 -> 16, LDG.E.U8 -> 1, no size modifier -> 4), cp.async
  (LDGSTS), TMA (UTMALDG, UTMASTG, UBLKCP, ...).
* Resource usage (`cuobjdump --dump-resource-usage`): REG, STACK, SHARED, LOCAL, CONSTANT[n],
  TEXTURE, SURFACE, SAMPLER per function.
* Input that carries none of these structures is refused (`not_ptxas_output`,
  `not_sass_dump`, `not_resource_usage`). Lines are read one at a time (bounded length).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import Field

from .common import (
    Binding,
    Facts,
    FactSet,
    IdentityMismatch,
    Refusal,
    ReportIdentity,
    norm_cc,
    open_report,
    text_lines,
)
from .compiler import KernelStages, StageSummary, merge
from .ptx import PtxModule
from .triton_stages import TritonReport

PARSER = "operations.evidence.sass"
PARSER_VERSION = "1"
DIALECT = "ptxas-v+cuobjdump-sass-1"
LINE_LIMIT = 1 << 20

TENSOR_CORE = (
    "HMMA",
    "HGMMA",
    "IMMA",
    "IGMMA",
    "QGMMA",
    "BGMMA",
    "DMMA",
    "OMMA",
    "QMMA",
    "UTCHMMA",
    "UTCQMMA",
    "UTCIMMA",
)
TMA = ("UTMALDG", "UTMASTG", "UTMAPF", "UTMAREDG", "UTMACCTL", "UBLKCP", "UBLKRED", "UBLKPF")
WIDTH_OPS = ("LDG", "STG", "LDS", "STS", "LDL", "STL", "LD", "ST", "LDGSTS", "ATOMG", "RED")
SIZE_MODS = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "32": 4, "64": 8, "128": 16}


def _lines(path: str | Path) -> Iterator[tuple[int, str]]:
    return text_lines(path, LINE_LIMIT, field="report")


# ---------------------------------------------------------------------------------------------
# ptxas -v


class PtxasFunction(Facts):
    name: str
    arch: str | None
    entry: bool
    registers: int | None = None
    barriers: int | None = None
    stack_frame_bytes: int | None = None
    spill_stores_bytes: int | None = None
    spill_loads_bytes: int | None = None
    shared_memory_bytes: int | None = None
    local_memory_bytes: int | None = None
    cumulative_stack_bytes: int | None = None
    constant_memory_bytes: dict[str, int] = Field(default_factory=dict)  # bank -> bytes
    textures: int | None = None
    samplers: int | None = None
    surfaces: int | None = None
    compile_time_ms: float | None = None
    unmodeled: list[str] = Field(default_factory=list)


class PtxasReport(Facts):
    sha256: str
    bytes: int
    global_memory_bytes: dict[str, int]  # arch -> bytes of gmem
    functions: list[PtxasFunction]
    warnings: list[str]


_COMPILING = re.compile(r"^ptxas info\s*: Compiling (entry )?function '([^']+)' for '([^']+)'")
_PROPS = re.compile(r"^ptxas info\s*: Function properties for (\S+)")
_FRAME = re.compile(r"^\s*(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"^ptxas info\s*: Used (.*)$")
_GMEM = re.compile(r"^ptxas info\s*: (\d+) bytes gmem")
_TIME = re.compile(r"^ptxas info\s*: Compile time = ([\d.]+) ms")
_USED_ITEMS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^(\d+) registers$"), "registers"),
    (re.compile(r"^used (\d+) barriers$"), "barriers"),
    (re.compile(r"^(\d+) bytes smem$"), "shared_memory_bytes"),
    (re.compile(r"^(\d+) bytes lmem$"), "local_memory_bytes"),
    (re.compile(r"^(\d+) bytes cumulative stack size$"), "cumulative_stack_bytes"),
    (re.compile(r"^(\d+) textures$"), "textures"),
    (re.compile(r"^(\d+) samplers$"), "samplers"),
    (re.compile(r"^(\d+) surfaces$"), "surfaces"),
)
_CMEM = re.compile(r"^(\d+) bytes cmem\[(\d+)\]$")


def parse_ptxas(path: str | Path) -> PtxasReport:
    digest, size = open_report(path)
    funcs: dict[tuple[str, str | None], PtxasFunction] = {}
    order: list[tuple[str, str | None]] = []
    gmem: dict[str, int] = {}
    warnings: list[str] = []
    cur: PtxasFunction | None = None
    arch: str | None = None
    seen_ptxas = False

    def get(name: str, entry: bool) -> PtxasFunction:
        key = (name, arch)
        f = funcs.get(key)
        if f is None:
            f = funcs[key] = PtxasFunction(name=name, arch=arch, entry=entry)
            order.append(key)
        elif entry:
            f.entry = True
        return f

    for _n, line in _lines(path):
        if line.startswith("ptxas"):
            seen_ptxas = True
        if (
            line.startswith("ptxas warning")
            or line.startswith("ptxas error")
            or line.startswith("ptxas fatal")
        ):
            warnings.append(line[:500])
            continue
        m = _COMPILING.match(line)
        if m:
            arch = m.group(3)
            cur = get(m.group(2), entry=bool(m.group(1)))
            continue
        m = _PROPS.match(line)
        if m:
            cur = get(m.group(1), entry=False)
            continue
        m = _FRAME.match(line)
        if m and cur is not None:
            cur.stack_frame_bytes, cur.spill_stores_bytes, cur.spill_loads_bytes = (
                int(g) for g in m.groups()
            )
            continue
        m = _USED.match(line)
        if m and cur is not None:
            for item in (i.strip() for i in m.group(1).split(",")):
                for pat, attr in _USED_ITEMS:
                    mm = pat.match(item)
                    if mm:
                        setattr(cur, attr, int(mm.group(1)))
                        break
                else:
                    mc = _CMEM.match(item)
                    if mc:
                        cur.constant_memory_bytes[mc.group(2)] = int(mc.group(1))
                    elif item:
                        cur.unmodeled.append(item[:200])
            continue
        m = _GMEM.match(line)
        if m:
            gmem[arch or "?"] = int(m.group(1))
            continue
        m = _TIME.match(line)
        if m and cur is not None:
            cur.compile_time_ms = float(m.group(1))
    if not seen_ptxas or not funcs and not gmem:
        raise Refusal(
            "not_ptxas_output",
            "no 'ptxas info' lines: not `ptxas -v` / `nvcc -Xptxas -v` output",
            field="ptxas",
        )
    return PtxasReport(
        sha256=digest,
        bytes=size,
        global_memory_bytes=gmem,
        functions=[funcs[k] for k in order],
        warnings=warnings[:100],
    )


# ---------------------------------------------------------------------------------------------
# cuobjdump --dump-sass


class SassFunction(Facts):
    name: str
    arch: str | None
    instructions: int
    predicated: int
    opcodes: dict[str, int]  # without predicate and modifiers
    opcodes_full: dict[str, int]  # with modifiers
    tensor_core: dict[str, int]  # HMMA, HGMMA, ... -> count
    tma: dict[str, int]
    local_loads: int  # LDL
    local_stores: int  # STL
    uses_local_memory: bool
    ldgsts: int
    global_load_widths: dict[str, int]  # bytes -> count
    global_store_widths: dict[str, int]
    shared_load_widths: dict[str, int]
    shared_store_widths: dict[str, int]
    flags: list[str]


class SassReport(Facts):
    sha256: str
    bytes: int
    archs: list[str]
    elf_sections: int
    ptx_sections: int
    functions: list[SassFunction]


_CODE_FOR = re.compile(r"^\s*code for (sm_\w+)")
_ARCH = re.compile(r"^arch = (\w+)")
_FUNCTION = re.compile(r"^\s*Function : (\S+)")
_INSN = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")


class _Acc:
    def __init__(self, name: str, arch: str | None) -> None:
        self.name, self.arch = name, arch
        self.full: dict[str, int] = {}
        self.n = 0
        self.pred = 0

    def add(self, text: str) -> None:
        if text.startswith("@"):
            self.pred += 1
            sp = text.find(" ")
            text = text[sp + 1 :].lstrip() if sp > 0 else ""
        sp = text.find(" ")
        op = text if sp < 0 else text[:sp]
        if not op:
            return
        self.n += 1
        self.full[op] = self.full.get(op, 0) + 1

    def facts(self) -> SassFunction:
        base: dict[str, int] = {}
        tc: dict[str, int] = {}
        tma: dict[str, int] = {}
        widths: dict[str, dict[str, int]] = {"LDG": {}, "STG": {}, "LDS": {}, "STS": {}}
        ldl = stl = ldgsts = 0
        for full, k in self.full.items():
            parts = full.split(".")
            op = parts[0]
            base[op] = base.get(op, 0) + k
            if op in TENSOR_CORE:
                tc[op] = tc.get(op, 0) + k
            if op in TMA:
                tma[op] = tma.get(op, 0) + k
            if op == "LDL":
                ldl += k
            elif op == "STL":
                stl += k
            elif op == "LDGSTS":
                ldgsts += k
            if op in widths:
                w = 4
                for mod in parts[1:]:
                    if mod in SIZE_MODS:
                        w = SIZE_MODS[mod]
                key = str(w)
                widths[op][key] = widths[op].get(key, 0) + k
        flags = sorted(set(tc) | set(tma))
        if ldl or stl:
            flags.append("local_memory")
        if ldgsts:
            flags.append("LDGSTS")
        if "16" in widths["LDG"]:
            flags.append("LDG.128")
        return SassFunction(
            name=self.name,
            arch=self.arch,
            instructions=self.n,
            predicated=self.pred,
            opcodes=dict(sorted(base.items(), key=lambda kv: (-kv[1], kv[0]))),
            opcodes_full=dict(sorted(self.full.items(), key=lambda kv: (-kv[1], kv[0]))),
            tensor_core=tc,
            tma=tma,
            local_loads=ldl,
            local_stores=stl,
            uses_local_memory=bool(ldl or stl),
            ldgsts=ldgsts,
            global_load_widths=widths["LDG"],
            global_store_widths=widths["STG"],
            shared_load_widths=widths["LDS"],
            shared_store_widths=widths["STS"],
            flags=flags,
        )


def parse_sass(path: str | Path) -> SassReport:
    digest, size = open_report(path)
    out: list[SassFunction] = []
    archs: list[str] = []
    elf = ptx = 0
    in_ptx = False
    arch: str | None = None
    cur: _Acc | None = None
    for _n, line in _lines(path):
        if line.startswith("Fatbin elf code"):
            elf += 1
            in_ptx = False
            continue
        if line.startswith("Fatbin ptx code"):
            ptx += 1
            in_ptx = True
            if cur is not None:
                out.append(cur.facts())
                cur = None
            continue
        if in_ptx:
            continue
        m = _ARCH.match(line)
        if m:
            arch = m.group(1)
            continue
        m = _CODE_FOR.match(line)
        if m:
            arch = m.group(1)
            if arch not in archs:
                archs.append(arch)
            continue
        m = _FUNCTION.match(line)
        if m:
            if cur is not None:
                out.append(cur.facts())
            cur = _Acc(m.group(1), arch)
            continue
        if cur is not None:
            mi = _INSN.match(line)
            if mi:
                cur.add(mi.group(1))
            elif line.strip().startswith(".........."):
                out.append(cur.facts())
                cur = None
    if cur is not None:
        out.append(cur.facts())
    if not out and not elf and not archs:
        raise Refusal(
            "not_sass_dump",
            "no 'Fatbin elf code', 'code for sm_XX' or 'Function :' lines: not cuobjdump --dump-sass output",
            field="sass",
        )
    return SassReport(
        sha256=digest, bytes=size, archs=archs, elf_sections=elf, ptx_sections=ptx, functions=out
    )


# ---------------------------------------------------------------------------------------------
# cuobjdump --dump-resource-usage


class ResourceUsage(Facts):
    name: str
    arch: str | None
    values: dict[str, int]  # REG, STACK, SHARED, LOCAL, CONSTANT[0], TEXTURE, SURFACE, SAMPLER


class ResourceReport(Facts):
    sha256: str
    bytes: int
    functions: list[ResourceUsage]


_RES_FUNC = re.compile(r"^\s*Function (\S+):\s*$")
_RES_ITEM = re.compile(r"([A-Z_]+(?:\[\d+\])?):(\d+)")


def parse_resource_usage(path: str | Path) -> ResourceReport:
    digest, size = open_report(path)
    out: list[ResourceUsage] = []
    arch: str | None = None
    name: str | None = None
    seen = False
    for _n, line in _lines(path):
        m = _ARCH.match(line)
        if m:
            arch = m.group(1)
            continue
        if line.startswith("Resource usage"):
            seen = True
            continue
        m = _RES_FUNC.match(line)
        if m:
            name = m.group(1)
            continue
        if name is not None:
            items = _RES_ITEM.findall(line)
            if items:
                out.append(ResourceUsage(name=name, arch=arch, values={k: int(v) for k, v in items}))
                name = None
    if not seen:
        raise Refusal(
            "not_resource_usage",
            "no 'Resource usage' section: not cuobjdump --dump-resource-usage output",
            field="resource",
        )
    return ResourceReport(sha256=digest, bytes=size, functions=out)


# ---------------------------------------------------------------------------------------------
# The fact set


class SassFacts(FactSet):
    """The one result model of compiler evidence (`cko sass`): the detailed reports it was given
    and, per kernel, stage -> the facts every stage states alike (operations/evidence/compiler.py)."""

    kind: Literal["sass", "ptx", "triton"] = "sass"
    sass: SassReport | None = None
    ptxas: PtxasReport | None = None
    resource_usage: ResourceReport | None = None
    ptx: PtxModule | None = None
    triton: TritonReport | None = None
    kernels: list[KernelStages] = Field(default_factory=list)


CompilerFacts = SassFacts


def _summaries(s: SassReport | None, p: PtxasReport | None, r: ResourceReport | None) -> list[KernelStages]:
    out: list[KernelStages] = []
    if s is not None:
        for f in s.functions:
            async_copy = {"LDGSTS": f.ldgsts} if f.ldgsts else {}
            merge(out, f.name, "sass", StageSummary(
                source_sha256=s.sha256, arch=f.arch, operations=f.instructions,
                tensor_core=f.tensor_core, async_copy=async_copy, tma=f.tma, flags=f.flags,
            ))  # fmt: skip
    if p is not None:
        for g in p.functions:
            spill = (
                None if g.spill_stores_bytes is None else g.spill_stores_bytes + (g.spill_loads_bytes or 0)
            )
            merge(out, g.name, "ptxas", StageSummary(
                source_sha256=p.sha256, arch=g.arch, registers=g.registers,
                shared_static_bytes=g.shared_memory_bytes, spill_bytes=spill,
            ))  # fmt: skip
    if r is not None:
        for u in r.functions:
            merge(out, u.name, "resource_usage", StageSummary(
                source_sha256=r.sha256, arch=u.arch, registers=u.values.get("REG"),
                shared_static_bytes=u.values.get("SHARED"),
            ))  # fmt: skip
    return out


def parse_compiler_evidence(
    *,
    sass: str | Path | None = None,
    ptxas: str | Path | None = None,
    resource: str | Path | None = None,
    tool_version: str | None = None,
    bound_to: Binding | None = None,
) -> SassFacts:
    """Facts from any of: a SASS dump, a ptxas -v report, a resource-usage dump."""
    if sass is None and ptxas is None and resource is None:
        raise Refusal(
            "bad_request", "give a SASS dump, a ptxas report or a resource-usage dump", field="sass"
        )
    s = parse_sass(sass) if sass is not None else None
    p = parse_ptxas(ptxas) if ptxas is not None else None
    r = parse_resource_usage(resource) if resource is not None else None
    first = s or p or r
    assert first is not None
    archs: list[str] = []
    for a in (s.archs if s else []) + [f.arch for f in (p.functions if p else []) if f.arch]:
        if a not in archs:
            archs.append(a)
    ccs = sorted({c for c in (norm_cc(a) for a in archs) if c})
    seen = ReportIdentity(compute_capability="; ".join(ccs) or None)
    mismatch: list[IdentityMismatch] = []
    if (
        bound_to is not None
        and bound_to.compute_capability
        and ccs
        and norm_cc(bound_to.compute_capability) not in ccs
    ):
        mismatch.append(
            IdentityMismatch(
                field="compute_capability", bound=bound_to.compute_capability, report="; ".join(archs)
            )
        )
    return SassFacts(
        report_sha256=first.sha256,
        report_bytes=first.bytes,
        tool="cuobjdump" if s or r else "ptxas",
        tool_version=tool_version,
        tool_version_source="argument" if tool_version else None,
        parser=PARSER,
        parser_version=PARSER_VERSION,
        dialect=DIALECT,
        bound_to=bound_to,
        report_identity=seen,
        identity_mismatch=mismatch,
        sass=s,
        ptxas=p,
        resource_usage=r,
        kernels=_summaries(s, p, r),
    )
