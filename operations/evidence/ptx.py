"""PTX facts: the module header and, per `.entry` / `.func`, what it declares and what it executes.

* Header: `.version` (checked against PTX_VERSIONS), `.target` (checked against PTX_TARGETS, and
  the target must exist in that version), `.address_size`. A version or target outside the tables
  is refused (`unknown_ptx_version`, `unknown_ptx_target`, `target_needs_newer_ptx`), never guessed.
* Per function: name, kind, the performance directives (`.maxntid`, `.reqntid`, `.minnctapersm`,
  `.maxnreg`, `.reqnctapercluster`, ...), virtual registers declared per type (`.reg .b32 %r<113>`
  counts 113), static `.shared` and `.local` bytes declared in the body, the instruction mix
  (full opcodes, families) with loads and stores by state space and width in bytes, and the
  tensor-core, async-copy, bulk-copy, TMA, barrier and tcgen05 instructions.
* Module scope: static `.shared` bytes and the names of `.extern .shared` (dynamic) arrays, whose
  size the PTX does not say (absent, not zero).

PTX registers are virtual: ptxas allocates the real ones (`cko sass --ptxas`). Lines are read one
at a time, bounded in length; a file over MAX_BYTES is refused before it is read.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pydantic import Field

from .common import Facts, Refusal, open_report, text_lines

MAX_BYTES = 64 << 20

# PTX ISA version -> the CUDA release that introduced it (PTX ISA document, "PTX ISA versions").
PTX_VERSIONS: dict[str, str] = {
    "7.0": "11.0",
    "7.1": "11.1",
    "7.2": "11.2",
    "7.3": "11.3",
    "7.4": "11.4",
    "7.5": "11.5",
    "7.6": "11.6",
    "7.7": "11.7",
    "7.8": "11.8",
    "8.0": "12.0",
    "8.1": "12.1",
    "8.2": "12.2",
    "8.3": "12.3",
    "8.4": "12.4",
    "8.5": "12.5",
    "8.6": "12.7",
    "8.7": "12.8",
    "8.8": "12.9",
    "9.0": "13.0",
}
# .target -> the first PTX version that accepts it.
PTX_TARGETS: dict[str, str] = {
    **{f"sm_{n}": "7.0" for n in (50, 52, 53, 60, 61, 62, 70, 72, 75, 80)},
    "sm_86": "7.1",
    "sm_87": "7.4",
    "sm_89": "7.8",
    "sm_90": "7.8",
    "sm_90a": "8.0",
    "sm_100": "8.6",
    "sm_100a": "8.6",
    "sm_101": "8.6",
    "sm_101a": "8.6",
    "sm_120": "8.7",
    "sm_120a": "8.7",
    "sm_100f": "8.8",
    "sm_103": "8.8",
    "sm_103a": "8.8",
    "sm_103f": "8.8",
    "sm_121": "8.8",
    "sm_121a": "8.8",
    "sm_120f": "8.8",
    "sm_121f": "8.8",
    "sm_110": "9.0",
    "sm_110a": "9.0",
    "sm_110f": "9.0",
}
TARGET_OPTIONS = ("texmode_unified", "texmode_independent", "debug", "map_f64_to_f32")
PERF_DIRECTIVES = (
    "maxntid",
    "reqntid",
    "minnctapersm",
    "maxnctapersm",
    "maxnreg",
    "reqnctapercluster",
    "maxclusterrank",
    "explicitcluster",
    "noreturn",
    "pragma",
)
TYPE_BYTES = {"8": 1, "16": 2, "32": 4, "64": 8, "128": 16}
SPACES = ("global", "shared::cluster", "shared::cta", "shared", "local", "param", "const", "tex")
LOADS, STORES = ("ld", "ldu"), ("st",)


class PtxFunction(Facts):
    name: str
    kind: str  # "entry" or "func"
    visible: bool
    directives: dict[str, list[int]] = Field(default_factory=dict)  # maxntid -> [128, 1, 1]
    registers: dict[str, int] = Field(default_factory=dict)  # .reg type -> virtual registers declared
    registers_total: int = 0
    shared_static_bytes: int = 0  # .shared declared in the body
    local_bytes: int = 0  # .local declared in the body (stack depot)
    instructions: int = 0
    predicated: int = 0
    opcodes: dict[str, int] = Field(default_factory=dict)  # "ld.global.v4.b32" -> n
    families: dict[str, int] = Field(default_factory=dict)  # "ld" -> n
    loads: dict[str, dict[str, int]] = Field(default_factory=dict)  # space -> bytes -> n
    stores: dict[str, dict[str, int]] = Field(default_factory=dict)
    tensor_core: dict[str, int] = Field(default_factory=dict)  # mma.*, wgmma.mma_async.*, tcgen05.mma*
    async_copy: dict[str, int] = Field(default_factory=dict)  # cp.async (non-bulk) and its groups
    bulk_copy: dict[str, int] = Field(default_factory=dict)  # cp.async.bulk.* (not .tensor)
    tma: dict[str, int] = Field(default_factory=dict)  # cp.async.bulk.tensor.*, cp.reduce.async.bulk.tensor
    barriers: dict[str, int] = Field(default_factory=dict)  # bar.*, barrier.*, mbarrier.*, fence.*
    flags: list[str] = Field(default_factory=list)


class PtxModule(Facts):
    sha256: str
    bytes: int
    version: str
    cuda_release: str  # the CUDA release that introduced this PTX version
    target: str
    target_options: list[str]
    address_size: int | None
    shared_static_bytes: int  # module-scope .shared
    shared_dynamic: list[str]  # .extern .shared arrays: size set at launch, not in the PTX
    functions: list[PtxFunction]


_VERSION = re.compile(r"^\.version\s+(\d+\.\d+)\s*$")
_TARGET = re.compile(r"^\.target\s+(.+?)\s*$")
_ADDR = re.compile(r"^\.address_size\s+(\d+)\s*$")
_FUNC = re.compile(r"^((?:\.\w+\s+)*)\.(entry|func)\b\s*(?:\([^)]*\)\s*)?([\w$.]+)")
_REG = re.compile(r"^\.reg\s+(?:\.v\d\s+)?\.(\w+)\s+(.*)$")
_REG_RANGE = re.compile(r"^%[\w$]+<(\d+)>$")
_ARRAY = re.compile(r"^(?:\.extern\s+)?\.(shared|local)\b.*?\.([bsuf])(\d+)\s+([\w$]+)((?:\[\d*\])*)\s*$")
_DIRECTIVE = re.compile(r"^\.(\w+)\s*(.*)$")
_LABEL = re.compile(r"^[\w$]+:")


def _header(lines: list[str]) -> tuple[str, str, list[str], int | None]:
    version = target = None
    options: list[str] = []
    addr: int | None = None
    for s in lines:
        if m := _VERSION.match(s):
            version = m.group(1)
        elif m := _TARGET.match(s):
            parts = [p.strip() for p in m.group(1).split(",")]
            target, options = parts[0], parts[1:]
        elif m := _ADDR.match(s):
            addr = int(m.group(1))
    return _check_header(version, target, options), target or "", options, addr


def _check_header(version: str | None, target: str | None, options: list[str]) -> str:
    if version is None or target is None:
        raise Refusal("not_ptx", "no `.version` and `.target` directives: not PTX", field="ptx")
    if version not in PTX_VERSIONS:
        raise Refusal(
            "unknown_ptx_version",
            f".version {version} is not in the known PTX versions ({min(PTX_VERSIONS)}..{max(PTX_VERSIONS)})",
            field="ptx.version",
            version=version,
        )
    if target not in PTX_TARGETS:
        raise Refusal("unknown_ptx_target", f".target {target} is not a known target", field="ptx.target")
    if _vkey(PTX_TARGETS[target]) > _vkey(version):
        raise Refusal(
            "target_needs_newer_ptx",
            f".target {target} needs PTX {PTX_TARGETS[target]}; the file says .version {version}",
            field="ptx.target",
        )
    bad = [o for o in options if o not in TARGET_OPTIONS]
    if bad:
        raise Refusal("unknown_ptx_target", f".target option {bad[0]!r} is not known", field="ptx.target")
    return version


def _vkey(v: str) -> tuple[int, int]:
    a, b = v.split(".")
    return int(a), int(b)


def _array_bytes(m: re.Match[str]) -> int | None:
    """Bytes of `.shared .align 16 .b8 name[1024]` (None for `name[]`: dynamic)."""
    size = TYPE_BYTES.get(m.group(3))
    if size is None:
        return None
    for dim in re.findall(r"\[(\d*)\]", m.group(5)):
        if not dim:
            return None
        size *= int(dim)
    return size


def _pieces(code: str) -> list[tuple[str, bool]]:
    """Split one comment-free line into (statement, ended by ';'), block braces on their own."""
    out: list[tuple[str, bool]] = []
    parts = code.split(";")
    for i, raw in enumerate(parts):
        s, ended = raw.strip(), i < len(parts) - 1
        while s.startswith("{") and not s[1:].lstrip().startswith("%"):
            out.append(("{", False))
            s = s[1:].strip()
        tail = 0
        if "{" not in s:  # operand braces come in pairs: a lone closing one ends a block
            while s.endswith("}"):
                s, tail = s[:-1].rstrip(), tail + 1
        if s:
            out.append((s, ended))
        out.extend(("}", False) for _ in range(tail))
    return out


def _statements(path: str | Path) -> list[tuple[str, bool]]:
    """The file's statements without comments: (text, ended by ';'), braces of blocks apart."""
    out: list[tuple[str, bool]] = []
    block_comment = False
    for _n, line in text_lines(path, field="ptx"):
        if block_comment:
            end = line.find("*/")
            if end < 0:
                continue
            line, block_comment = line[end + 2 :], False
        if "/*" in line:
            start = line.find("/*")
            end = line.find("*/", start + 2)
            block_comment = end < 0
            line = line[:start] + ("" if end < 0 else line[end + 2 :])
        code = line.split("//", 1)[0].strip()
        if code:
            out.extend(_pieces(code))
    return out


class _Fn:
    """One function's facts while its body is read."""

    def __init__(self, name: str, kind: str, visible: bool) -> None:
        self.f = PtxFunction(name=name, kind=kind, visible=visible)

    def directive(self, s: str) -> None:
        m = _DIRECTIVE.match(s)
        if not m:
            return
        name, rest = m.groups()
        if name == "reg":
            self._reg(s)
        elif name in ("shared", "local", "extern"):
            a = _ARRAY.match(s)
            size = _array_bytes(a) if a else None
            if a and size is not None:
                attr = "shared_static_bytes" if a.group(1) == "shared" else "local_bytes"
                setattr(self.f, attr, getattr(self.f, attr) + size)
        elif name in PERF_DIRECTIVES:
            self.f.directives[name] = [int(x) for x in re.findall(r"\d+", rest)]

    def _reg(self, s: str) -> None:
        m = _REG.match(s)
        if not m:
            return
        n = 0
        for name in (x.strip() for x in m.group(2).split(",")):
            r = _REG_RANGE.match(name)
            n += int(r.group(1)) if r else 1 if name else 0
        kind = m.group(1)
        self.f.registers[kind] = self.f.registers.get(kind, 0) + n
        self.f.registers_total += n

    def instruction(self, s: str) -> None:
        if s.startswith("@"):
            self.f.predicated += 1
            s = s.split(None, 1)[1] if " " in s or "\t" in s else ""
        op = s.split(None, 1)[0] if s else ""
        if not op:
            return
        self.f.instructions += 1
        self.f.opcodes[op] = self.f.opcodes.get(op, 0) + 1

    def facts(self) -> PtxFunction:
        from .ptx_mix import classify

        f = self.f
        f.opcodes = dict(sorted(f.opcodes.items(), key=lambda kv: (-kv[1], kv[0])))
        classify(f)
        return f


class _Module:
    """The statement stream's state: module scope, a function header, a body, a skipped block."""

    def __init__(self) -> None:
        self.functions: list[PtxFunction] = []
        self.shared_static = 0
        self.shared_dynamic: list[str] = []
        self.pending: _Fn | None = None
        self.cur: _Fn | None = None
        self.depth = 0  # block depth inside a function body or a skipped module-scope block

    def feed(self, s: str, ended: bool) -> None:
        if self.depth:
            self._inside(s)
        elif self.pending is not None:
            self._header(s, ended)
        elif s == "{":  # a .section or other module-scope block: not code
            self.depth = 1
        elif m := _FUNC.match(s):
            quals = m.group(1).split()
            self.pending = _Fn(m.group(3), m.group(2), ".visible" in quals)
            if ended:  # a prototype on one line
                self.pending = None
        elif s.startswith((".shared", ".extern")):
            self._module_shared(s)

    def _header(self, s: str, ended: bool) -> None:
        assert self.pending is not None
        if s == "{":
            self.cur, self.pending, self.depth = self.pending, None, 1
        elif ended:  # `.extern .func ... (...);`: a declaration, no body
            self.pending = None
        elif s.startswith("."):
            self.pending.directive(s)

    def _inside(self, s: str) -> None:
        if s == "{":
            self.depth += 1
        elif s == "}":
            self.depth -= 1
            if self.depth == 0 and self.cur is not None:
                self.functions.append(self.cur.facts())
                self.cur = None
        elif self.cur is None:
            return
        elif s.startswith("."):
            self.cur.directive(s)
        else:
            m = _LABEL.match(s)
            rest = s[m.end() :].strip() if m else s
            if rest:
                self.cur.instruction(rest)

    def _module_shared(self, s: str) -> None:
        a = _ARRAY.match(s)
        if not a or a.group(1) != "shared":
            return
        size = _array_bytes(a)
        if size is None:
            self.shared_dynamic.append(a.group(4))
        else:
            self.shared_static += size


def parse_ptx(path: str | Path) -> PtxModule:
    """Facts of one PTX file, or a Refusal naming what it does not know."""
    p = Path(path)
    try:
        size = os.stat(p).st_size
    except OSError as exc:
        raise Refusal("unreadable", f"cannot read {p}: {exc.strerror or exc}", field="ptx") from None
    if size > MAX_BYTES:
        raise Refusal("too_large", f"{p} is {size} bytes; at most {MAX_BYTES} are read", field="ptx")
    digest, nbytes = open_report(p)
    stmts = _statements(p)
    version, target, options, addr = _header([s for s, _e in stmts[:200] if s.startswith(".")])
    mod = _Module()
    for s, ended in stmts:
        mod.feed(s, ended)
    if mod.depth or mod.pending is not None:
        raise Refusal("truncated", "the file ends inside a function or block: truncated PTX", field="ptx")
    return PtxModule(
        sha256=digest,
        bytes=nbytes,
        version=version,
        cuda_release=PTX_VERSIONS[version],
        target=target,
        target_options=options,
        address_size=addr,
        shared_static_bytes=mod.shared_static,
        shared_dynamic=mod.shared_dynamic,
        functions=mod.functions,
    )
