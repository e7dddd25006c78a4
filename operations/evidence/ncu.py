"""Nsight Compute CSV (`ncu --csv --page raw` and `ncu --csv --page details`) to facts.

What it does, and what it refuses:

* The version. ncu's CSV does not name the ncu that wrote it, so the version comes from the
  caller: `tool_version` ("2025.3.1") or `version_text`, the output of `ncu --version` captured
  when the report was collected (a sidecar file; `cko profile ncu` passes REPORT.version when it
  exists, and `--collect` writes one). Neither given, or a version no dialect below
  covers, is a refusal (`unknown_tool_version`); both given and disagreeing is `version_conflict`.
* The dialect table (`DIALECTS`) lists, per ncu version range, the identity columns a report must
  have, the metrics that become named facts, and the unit vocabulary. A missing identity column
  is `missing_column`; a unit outside the vocabulary is `unknown_unit`; every other column is
  kept, unit-normalised, under `unmodeled`.
* Units are normalised: time to ns, sizes to bytes, rates to per second (byte/s, sector/s, hz),
  percent stays percent; counts (cycle, inst, warp...) stay. The factors were calibrated on one
  report printed twice (auto units and `--print-units base`, tests/fixtures/ncu): ncu's
  Kbyte/Mbyte/... are SI (1 Kbyte = 1000 byte), and a size prefix scales the printed value
  wherever it stands ("%/Kbyte" x 1000 = "%/byte"), while a time in a denominator converts
  ("sector/ns" x 1e9 = "sector/s").
* The lines ncu and the program print before the CSV (`==PROF==`, `==WARNING==`, program
  output) are skipped; ncu's own lines are kept as `tool_messages`, program lines only counted.
* `ERR_NVGPUCTRPERM` anywhere in ncu's messages makes the fact set carry
  `limitation: counters_not_permitted`, and every counter-derived fact of every launch is None
  (never zero); launch configuration (grid, block, registers, shared memory) is kept.
* Streaming: the CSV is read line by line with the csv module; one launch is assembled at a time
  and only its facts are kept. Unmodeled metrics are kept for the first `max_unmodeled_launches`
  launches (the count of the rest is reported), so memory stays bounded by the number of
  launches times a few hundred bytes.
* Rule rows of the details page (ncu's guidance text and estimated speedups) are advice, not
  facts: they are counted (`rule_rows_omitted`) and dropped.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import Field

from .common import (
    Binding,
    Facts,
    FactSet,
    Refusal,
    ReportIdentity,
    identity_mismatches,
    no_gc,
    open_report,
)

PARSER = "operations.evidence.ncu"
PARSER_VERSION = "1"
LINE_LIMIT = 16 << 20  # one CSV line; a raw-page row of the full set is ~45 kB
MAX_TOOL_MESSAGES = 50
DEFAULT_MAX_UNMODELED_LAUNCHES = 100
NOT_AVAILABLE = frozenset({"", "n/a", "N/A", "no data", "(!) n/a"})

Value = float | int | str | None

# ---------------------------------------------------------------------------------------------
# Units


@dataclass(frozen=True)
class UnitVocabulary:
    """Tokens ncu prints in units, each with its canonical token and factor to it."""

    time: dict[str, float]  # to ns
    size: dict[str, float]  # to byte
    frequency: dict[str, float]  # to hz
    counts: frozenset[str]  # kept as they are


UNITS_2025 = UnitVocabulary(
    time={"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9},
    size={"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12, "Pbyte": 1e15},
    frequency={"hz": 1.0, "Khz": 1e3, "Mhz": 1e6, "Ghz": 1e9},
    counts=frozenset(
        {
            "%",
            "block",
            "branches",
            "cluster",
            "cycle",
            "inst",
            "pass",
            "register",
            "thread",
            "request",
            "sample",
            "sector",
            "sectors",
            "SM",
            "warp",
        }
    ),
)


def _term(vocab: UnitVocabulary, token: str, denominator: bool) -> tuple[float, str] | None:
    """(factor the value is multiplied by, canonical token) for one token of a unit."""
    if token in vocab.counts:
        return 1.0, token
    if token in vocab.size:
        # Numerator or denominator alike: ncu's auto-scaled "%/Kbyte" is the base "%/byte" value
        # divided by 1000 (its `--print-units base` output of the same report says so), i.e. the
        # prefix scales the displayed value, not the denominator.
        return vocab.size[token], "byte"
    if token in vocab.frequency:
        return vocab.frequency[token], "hz"
    if token in vocab.time:
        ns = vocab.time[token]
        if denominator:
            return 1e9 / ns, "s"  # x per <token> -> x per second (sector/ns -> sector/s: x 1e9)
        return ns, "ns"
    return None


def normalise_unit(vocab: UnitVocabulary, unit: str) -> tuple[float, str] | None:
    """(factor, canonical unit) for an ncu unit string, or None when a token is unknown."""
    if unit == "":
        return 1.0, ""
    parts = unit.split("/")
    if len(parts) > 3 or any(p == "" for p in parts):
        return None
    head = _term(vocab, parts[0], denominator=False)
    if head is None:
        return None
    factor, canon = head
    for p in parts[1:]:
        t = _term(vocab, p, denominator=True)
        if t is None:
            return None
        factor *= t[0]
        canon += "/" + t[1]
    return factor, canon


# ---------------------------------------------------------------------------------------------
# Dialects

IDENTITY_COLUMNS = (
    "ID",
    "Process ID",
    "Process Name",
    "Host Name",
    "Kernel Name",
    "Context",
    "Stream",
    "Block Size",
    "Grid Size",
    "Device",
    "CC",
)
DETAILS_COLUMNS = ("Section Name", "Metric Name", "Metric Unit", "Metric Value")
DETAILS_RULE_COLUMNS = (
    "Rule Name",
    "Rule Type",
    "Rule Description",
    "Estimated Speedup Type",
    "Estimated Speedup",
)

# Named facts: field -> (kind, raw-page metric, details-page (section, metric name)).
# kind: "counter" facts need performance counters (None under ERR_NVGPUCTRPERM); "launch" facts don't.
MODELED: dict[str, tuple[str, str, tuple[str, str]]] = {
    "duration_ns": ("counter", "gpu__time_duration.sum", ("GPU Speed Of Light Throughput", "Duration")),
    "elapsed_cycles": (
        "counter",
        "gpc__cycles_elapsed.max",
        ("GPU Speed Of Light Throughput", "Elapsed Cycles"),
    ),
    "sm_frequency_hz": (
        "counter",
        "gpc__cycles_elapsed.avg.per_second",
        ("GPU Speed Of Light Throughput", "SM Frequency"),
    ),
    "dram_frequency_hz": (
        "counter",
        "dram__cycles_elapsed.avg.per_second",
        ("GPU Speed Of Light Throughput", "DRAM Frequency"),
    ),
    "sm_throughput_pct": (
        "counter",
        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        ("GPU Speed Of Light Throughput", "Compute (SM) Throughput"),
    ),
    "memory_throughput_pct": (
        "counter",
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
        ("GPU Speed Of Light Throughput", "Memory Throughput"),
    ),
    "dram_throughput_pct": (
        "counter",
        "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
        ("GPU Speed Of Light Throughput", "DRAM Throughput"),
    ),
    "achieved_occupancy_pct": (
        "counter",
        "sm__warps_active.avg.pct_of_peak_sustained_active",
        ("Occupancy", "Achieved Occupancy"),
    ),
    "theoretical_occupancy_pct": (
        "launch",
        "sm__maximum_warps_per_active_cycle_pct",
        ("Occupancy", "Theoretical Occupancy"),
    ),
    "l1_hit_rate_pct": (
        "counter",
        "l1tex__t_sector_hit_rate.pct",
        ("Memory Workload Analysis", "L1/TEX Hit Rate"),
    ),
    "l2_hit_rate_pct": ("counter", "lts__t_sector_hit_rate.pct", ("Memory Workload Analysis", "L2 Hit Rate")),
    "registers_per_thread": (
        "launch",
        "launch__registers_per_thread",
        ("Launch Statistics", "Registers Per Thread"),
    ),
    "static_shared_memory_per_block_bytes": (
        "launch",
        "launch__shared_mem_per_block_static",
        ("Launch Statistics", "Static Shared Memory Per Block"),
    ),
    "dynamic_shared_memory_per_block_bytes": (
        "launch",
        "launch__shared_mem_per_block_dynamic",
        ("Launch Statistics", "Dynamic Shared Memory Per Block"),
    ),
    "driver_shared_memory_per_block_bytes": (
        "launch",
        "launch__shared_mem_per_block_driver",
        ("Launch Statistics", "Driver Shared Memory Per Block"),
    ),
    "shared_memory_config_size_bytes": (
        "launch",
        "launch__shared_mem_config_size",
        ("Launch Statistics", "Shared Memory Configuration Size"),
    ),
    "waves_per_sm": ("launch", "launch__waves_per_multiprocessor", ("Launch Statistics", "Waves Per SM")),
}
# The canonical unit each named fact must have after normalisation (a report that says otherwise
# is refused: the column means something else than this parser assumes).
MODELED_UNITS: dict[str, set[str]] = {
    "duration_ns": {"ns"},
    "elapsed_cycles": {"cycle"},
    "sm_frequency_hz": {"hz"},
    "dram_frequency_hz": {"hz"},
    "sm_throughput_pct": {"%"},
    "memory_throughput_pct": {"%"},
    "dram_throughput_pct": {"%"},
    "achieved_occupancy_pct": {"%"},
    "theoretical_occupancy_pct": {"%"},
    "l1_hit_rate_pct": {"%"},
    "l2_hit_rate_pct": {"%"},
    "registers_per_thread": {"register/thread"},
    "static_shared_memory_per_block_bytes": {"byte/block"},
    "dynamic_shared_memory_per_block_bytes": {"byte/block"},
    "driver_shared_memory_per_block_bytes": {"byte/block"},
    "shared_memory_config_size_bytes": {"byte"},
    "waves_per_sm": {""},
}
INT_FIELDS = frozenset({"registers_per_thread", "elapsed_cycles"})
DEVICE_NAME_METRIC = "device__attribute_display_name"


@dataclass(frozen=True)
class NcuDialect:
    name: str
    versions: str  # human description of the versions covered
    pattern: re.Pattern[str]
    units: UnitVocabulary
    identity_columns: tuple[str, ...] = IDENTITY_COLUMNS
    details_columns: tuple[str, ...] = DETAILS_COLUMNS
    modeled: dict[str, tuple[str, str, tuple[str, str]]] = field(default_factory=lambda: MODELED)


DIALECTS: tuple[NcuDialect, ...] = (
    NcuDialect(
        name="ncu-csv-2025.3",
        versions="2025.3.x",
        pattern=re.compile(r"^2025\.3\.\d+(\.\d+)?$"),
        units=UNITS_2025,
    ),
)

VERSION_RE = re.compile(r"\bVersion\s+(\d{4}\.\d+\.\d+(?:\.\d+)?)\b")


def resolve_version(tool_version: str | None, version_text: str | None) -> tuple[str, str, NcuDialect]:
    """(version, where it came from, dialect) or a refusal."""
    from_file: str | None = None
    if version_text is not None:
        m = VERSION_RE.search(version_text)
        if not m:
            raise Refusal(
                "bad_version_file",
                "the version file is not `ncu --version` output (no 'Version YYYY.N.N' line)",
                field="version_file",
            )
        from_file = m.group(1)
    given = tool_version.strip() if tool_version else None
    if given is not None and not re.fullmatch(r"\d{4}\.\d+\.\d+(\.\d+)?", given):
        raise Refusal(
            "bad_tool_version",
            f"tool version {given!r} is not of the form YYYY.N.N[.N]",
            field="tool_version",
        )
    if given is not None and from_file is not None and not _same_version(given, from_file):
        raise Refusal(
            "version_conflict",
            f"--tool-version {given} disagrees with the version file ({from_file})",
            field="tool_version",
        )
    version = given or from_file
    source = "argument" if given else "version_file"
    if version is None:
        raise Refusal(
            "unknown_tool_version",
            "ncu's CSV does not name its version: give --tool-version or the `ncu --version` output "
            f"captured at collection (--version-file); known: {', '.join(d.versions for d in DIALECTS)}",
            field="tool_version",
        )
    for d in DIALECTS:
        if d.pattern.match(version):
            return version, source, d
    raise Refusal(
        "unknown_tool_version",
        f"ncu {version} is not in the dialect table (known: {', '.join(d.versions for d in DIALECTS)})",
        field="tool_version",
    )


def _same_version(a: str, b: str) -> bool:
    pa, pb = a.split("."), b.split(".")
    n = min(len(pa), len(pb))
    return pa[:n] == pb[:n]


# ---------------------------------------------------------------------------------------------
# Facts


class NcuLaunch(Facts):
    id: int
    name: str
    name_form: Literal["demangled", "mangled"]
    demangled_name: str | None
    mangled_name: str | None
    process_id: int | None
    process_name: str | None
    host: str | None
    context: int | None
    stream: int | None
    device: int | None
    device_name: str | None = None
    compute_capability: str | None
    block: list[int]
    grid: list[int]
    duration_ns: float | None = None
    elapsed_cycles: int | None = None
    sm_frequency_hz: float | None = None
    dram_frequency_hz: float | None = None
    sm_throughput_pct: float | None = None
    memory_throughput_pct: float | None = None
    dram_throughput_pct: float | None = None
    achieved_occupancy_pct: float | None = None
    theoretical_occupancy_pct: float | None = None
    l1_hit_rate_pct: float | None = None
    l2_hit_rate_pct: float | None = None
    registers_per_thread: int | None = None
    static_shared_memory_per_block_bytes: float | None = None
    dynamic_shared_memory_per_block_bytes: float | None = None
    driver_shared_memory_per_block_bytes: float | None = None
    shared_memory_config_size_bytes: float | None = None
    waves_per_sm: float | None = None
    absent: list[str] = Field(default_factory=list)  # named facts the report does not carry
    not_available: list[str] = Field(default_factory=list)  # carried, but n/a in the report
    limitation: str | None = None
    unmodeled: dict[str, Value] | None = None  # None: beyond max_unmodeled_launches


class NcuKernelSummary(Facts):
    name: str
    launches: int
    launches_with_duration: int
    duration_ns_total: float | None
    duration_ns_min: float | None
    duration_ns_max: float | None
    duration_ns_mean: float | None


class NcuFacts(FactSet):
    kind: Literal["ncu"] = "ncu"
    page: Literal["raw", "details"]
    limitation: str | None = None
    launches: list[NcuLaunch]
    kernels: list[NcuKernelSummary]
    modeled_sources: dict[str, str]  # named fact -> the column / section metric it comes from
    units: dict[str, str]  # canonical unit of every metric seen (modeled sources and unmodeled)
    unmodeled_launches_kept: int
    unmodeled_launches_omitted: int
    rule_rows_omitted: int = 0
    tool_messages: list[str]
    tool_messages_omitted: int = 0
    program_output_lines: int = 0


# ---------------------------------------------------------------------------------------------
# Parsing helpers


def _value(text: str) -> Value:
    """A CSV cell: None for n/a, a number (thousands separators removed), else the string."""
    if text in NOT_AVAILABLE:
        return None
    try:
        v = float(text.replace(",", ""))
    except ValueError:
        return text
    if v != v or v in (float("inf"), float("-inf")):
        return text
    if v.is_integer() and abs(v) < 2**53:
        return int(v)
    return v


def _int(text: str, what: str, line: int) -> int | None:
    if text in NOT_AVAILABLE:
        return None
    try:
        return int(text.replace(",", ""))
    except ValueError:
        raise Refusal(
            "bad_value", f"line {line}: {what} {text[:60]!r} is not an integer", field=what
        ) from None


_DIM_RE = re.compile(r"^\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\)$")


def _dims(text: str, what: str, line: int) -> list[int]:
    m = _DIM_RE.match(text)
    if not m:
        raise Refusal("bad_value", f"line {line}: {what} {text[:60]!r} is not '(x, y, z)'", field=what)
    return [int(m.group(1)), int(m.group(2)), int(m.group(3))]


class _Reader:
    """Lines of a report: bounded length, ncu's own messages and blank lines set aside."""

    def __init__(self, f: IO[str]) -> None:
        self.f = f
        self.line_no = 0
        self.messages: list[str] = []
        self.messages_omitted = 0
        self.counters_not_permitted = False

    def raw_lines(self) -> Iterator[str]:
        while True:
            try:
                line = self.f.readline(LINE_LIMIT)
            except UnicodeDecodeError:
                raise Refusal(
                    "not_text", f"line {self.line_no + 1}: the report is not UTF-8 text", field="report"
                ) from None
            if not line:
                return
            self.line_no += 1
            if len(line) >= LINE_LIMIT and not line.endswith("\n"):
                raise Refusal(
                    "line_too_long",
                    f"line {self.line_no} is longer than {LINE_LIMIT} characters",
                    field="report",
                )
            if "\x00" in line:
                raise Refusal(
                    "not_text", f"line {self.line_no} holds a NUL byte: not ncu's text output", field="report"
                )
            yield line

    def note(self, line: str) -> None:
        if "ERR_NVGPUCTRPERM" in line:
            self.counters_not_permitted = True
        if len(self.messages) < MAX_TOOL_MESSAGES:
            self.messages.append(line.rstrip("\r\n")[:500])
        else:
            self.messages_omitted += 1

    def csv_lines(self, lines: Iterator[str]) -> Iterator[str]:
        for line in lines:
            if line.startswith("=="):
                self.note(line)
                continue
            if not line.strip():
                continue
            yield line


def _find_header(reader: _Reader, lines: Iterator[str]) -> tuple[list[str], int]:
    """Skip ncu's messages and program output; return the parsed header row."""
    program_lines = 0
    for line in lines:
        if line.startswith("=="):
            reader.note(line)
            continue
        if line.startswith('"ID"'):
            try:
                row = next(csv.reader([line], strict=True))
            except csv.Error as exc:
                raise Refusal(
                    "not_ncu_csv",
                    f"line {reader.line_no}: the header is not comma-separated CSV ({exc})",
                    field="report",
                ) from None
            if len(row) >= 4 and row[0] == "ID":  # the identity columns are then checked by name
                return row, program_lines
        if line.strip():
            program_lines += 1
    if reader.counters_not_permitted:
        return [], program_lines
    raise Refusal(
        "not_ncu_csv",
        'no ncu CSV header ("ID","Process ID",...,"Kernel Name",...) found: not `ncu --csv` output, '
        "or another delimiter",
        field="report",
    )


@dataclass
class _Launch:
    """One launch being assembled (details page) or built (raw page)."""

    ident: list[str]
    line: int
    values: dict[str, Value] = field(default_factory=dict)  # modeled field -> value
    carried: set[str] = field(default_factory=set)
    unmodeled: dict[str, Value] | None = None
    device_name: str | None = None


class _Builder:
    """Turns assembled launches into facts; keeps per-kernel summaries."""

    def __init__(
        self, dialect: NcuDialect, col: dict[str, int], limitation: str | None, max_unmodeled: int
    ) -> None:
        self.dialect = dialect
        self.col = col
        self.limitation = limitation
        self.max_unmodeled = max_unmodeled
        self.launches: list[NcuLaunch] = []
        self.seen_ids: set[int] = set()
        self.kept = 0
        self.omitted = 0
        self.gpu_names: set[str] = set()
        self.ccs: set[str] = set()

    def want_unmodeled(self) -> bool:
        return self.kept < self.max_unmodeled

    def add(self, la: _Launch) -> None:
        c, ident, line = self.col, la.ident, la.line
        lid = _int(ident[c["ID"]], "ID", line)
        if lid is None:
            raise Refusal("bad_value", f"line {line}: launch ID is empty", field="ID")
        if lid in self.seen_ids:
            raise Refusal("duplicate_launch", f"line {line}: launch ID {lid} appears twice", field="ID")
        self.seen_ids.add(lid)
        name = ident[c["Kernel Name"]]
        if not name:
            raise Refusal("bad_value", f"line {line}: launch {lid} has no kernel name", field="Kernel Name")
        mangled = name.startswith("_Z")
        values: dict[str, Any] = {}
        absent: list[str] = []
        not_available: list[str] = []
        for fname, (kind, _raw, _det) in self.dialect.modeled.items():
            if fname not in la.carried:
                absent.append(fname)
                continue
            v = la.values.get(fname)
            if self.limitation is not None and kind == "counter":
                v = None
            if v is None:
                not_available.append(fname)
                continue
            if isinstance(v, str):
                raise Refusal("bad_value", f"launch {lid}: {fname} is {v[:60]!r}, not a number", field=fname)
            values[fname] = int(v) if fname in INT_FIELDS else float(v)
        cc = ident[c["CC"]] or None
        if cc:
            self.ccs.add(cc)
        if la.device_name:
            self.gpu_names.add(la.device_name)
        unmodeled = la.unmodeled
        if unmodeled is not None and self.kept < self.max_unmodeled:
            self.kept += 1
        else:
            unmodeled = None
            self.omitted += 1
        launch = NcuLaunch(
            id=lid,
            name=name,
            name_form="mangled" if mangled else "demangled",
            demangled_name=None if mangled else name,
            mangled_name=name if mangled else None,
            process_id=_int(ident[c["Process ID"]], "Process ID", line),
            process_name=ident[c["Process Name"]] or None,
            host=ident[c["Host Name"]] or None,
            context=_int(ident[c["Context"]], "Context", line),
            stream=_int(ident[c["Stream"]], "Stream", line),
            device=_int(ident[c["Device"]], "Device", line),
            device_name=la.device_name,
            compute_capability=cc,
            block=_dims(ident[c["Block Size"]], "Block Size", line),
            grid=_dims(ident[c["Grid Size"]], "Grid Size", line),
            absent=absent,
            not_available=not_available,
            limitation=self.limitation,
            unmodeled=unmodeled,
            **values,
        )
        self.launches.append(launch)


def _columns(header: list[str], required: tuple[str, ...]) -> dict[str, int]:
    seen: dict[str, int] = {}
    for i, h in enumerate(header):
        if h in seen:
            raise Refusal("duplicate_column", f"column {h!r} appears twice in the header", field=h)
        seen[h] = i
    for r in required:
        if r not in seen:
            raise Refusal("missing_column", f"the header has no {r!r} column", field=r)
    return seen


def _unit(
    dialect: NcuDialect, cache: dict[str, tuple[float, str]], unit: str, what: str
) -> tuple[float, str]:
    got = cache.get(unit)
    if got is None:
        n = normalise_unit(dialect.units, unit)
        if n is None:
            raise Refusal(
                "unknown_unit",
                f"{what}: unit {unit[:40]!r} is not in the {dialect.name} vocabulary",
                field=what,
            )
        cache[unit] = got = n
    return got


def _scaled(raw: str, factor: float) -> Value:
    v = _value(raw)
    if factor != 1.0 and isinstance(v, int | float):
        s = float(f"{v * factor:.12g}")  # drop binary noise from the scaling (ncu prints <= 9 digits)
        return int(s) if s.is_integer() and abs(s) < 2**53 else s
    return v


def _check_unit(fname: str, canon: str, source: str) -> None:
    if canon not in MODELED_UNITS[fname]:
        raise Refusal(
            "unexpected_unit",
            f"{source} has unit {canon!r} after normalisation; {fname} needs {sorted(MODELED_UNITS[fname])}",
            field=source,
        )


# ---------------------------------------------------------------------------------------------
# The two pages


def _parse_raw(
    reader: _Reader,
    rows: Iterator[list[str]],
    header: list[str],
    dialect: NcuDialect,
    builder_args: dict[str, Any],
) -> tuple[_Builder, dict[str, str], dict[str, str]]:
    col = _columns(header, dialect.identity_columns)
    builder = _Builder(dialect, col, **builder_args)
    try:
        units_row = next(rows)
    except StopIteration:
        raise Refusal("truncated", "the raw page has a header but no units row", field="report") from None
    if len(units_row) != len(header) or any(units_row[col[c]] for c in dialect.identity_columns):
        raise Refusal(
            "missing_units_row",
            f"line {reader.line_no}: the second row of a raw page must be the units row (empty under identity columns)",
            field="report",
        )
    cache: dict[str, tuple[float, str]] = {}
    ident_idx = {col[c] for c in dialect.identity_columns}
    metric_cols: list[tuple[int, str, float, str]] = []
    for i, name in enumerate(header):
        if i in ident_idx:
            continue
        factor, canon = _unit(dialect, cache, units_row[i], name)
        metric_cols.append((i, name, factor, canon))
    by_name = {name: (i, factor, canon) for i, name, factor, canon in metric_cols}
    modeled_idx: list[tuple[str, int, float]] = []
    sources: dict[str, str] = {}
    for fname, (_kind, metric, _det) in dialect.modeled.items():
        if metric in by_name:
            i, factor, canon = by_name[metric]
            _check_unit(fname, canon, metric)
            modeled_idx.append((fname, i, factor))
            sources[fname] = metric
    modeled_cols = {i for _f, i, _x in modeled_idx}
    unmodeled_cols = [(i, name, factor) for i, name, factor, _c in metric_cols if i not in modeled_cols]
    units = {name: canon for _i, name, _f, canon in metric_cols}
    dev_idx = by_name.get(DEVICE_NAME_METRIC, (None,))[0]
    carried = {f for f, _i, _x in modeled_idx}
    n = len(header)
    for row in rows:
        if len(row) != n:
            if row == []:
                continue
            raise Refusal(
                "truncated",
                f"line {reader.line_no}: {len(row)} fields where the header has {n} (truncated or malformed row)",
                field="report",
            )
        if row == header:
            raise Refusal(
                "duplicate_header", f"line {reader.line_no}: the header appears again", field="report"
            )
        la = _Launch(ident=row, line=reader.line_no, carried=carried)
        for fname, i, factor in modeled_idx:
            la.values[fname] = _scaled(row[i], factor)
        if dev_idx is not None:
            la.device_name = row[dev_idx] or None
        if builder.want_unmodeled():
            la.unmodeled = {name: _scaled(row[i], factor) for i, name, factor in unmodeled_cols}
        builder.add(la)
    return builder, sources, units


def _parse_details(
    reader: _Reader,
    rows: Iterator[list[str]],
    header: list[str],
    dialect: NcuDialect,
    builder_args: dict[str, Any],
) -> tuple[_Builder, dict[str, str], dict[str, str], int]:
    col = _columns(header, dialect.identity_columns + dialect.details_columns)
    builder = _Builder(dialect, col, **builder_args)
    si, mi, ui, vi = (col[c] for c in dialect.details_columns)
    need = max(si, mi, ui, vi) + 1
    n = len(header)
    ident_n = max(col[c] for c in dialect.identity_columns) + 1
    id_i, name_i = col["ID"], col["Kernel Name"]
    modeled = {det: fname for fname, (_k, _raw, det) in dialect.modeled.items()}
    cache: dict[str, tuple[float, str]] = {}
    units: dict[str, str] = {}
    sources: dict[str, str] = {}
    rules = 0
    cur: _Launch | None = None
    cur_id = None
    seen: set[str] = set()
    for row in rows:
        if len(row) < need or len(row) > n:
            if row == []:
                continue
            raise Refusal(
                "truncated",
                f"line {reader.line_no}: {len(row)} fields; a details row has {need} to {n} (truncated or malformed)",
                field="report",
            )
        if row == header:
            raise Refusal(
                "duplicate_header", f"line {reader.line_no}: the header appears again", field="report"
            )
        rid = row[id_i]
        if rid != cur_id:
            if cur is not None:
                builder.add(cur)
            if rid in seen:
                raise Refusal(
                    "duplicate_launch",
                    f"line {reader.line_no}: rows of launch {rid} are not contiguous",
                    field="ID",
                )
            seen.add(rid)
            cur_id = rid
            cur = _Launch(ident=row[:ident_n], line=reader.line_no)
            if builder.want_unmodeled():
                cur.unmodeled = {}
        assert cur is not None
        if row[name_i] != cur.ident[name_i]:
            raise Refusal(
                "inconsistent_launch",
                f"line {reader.line_no}: launch {rid} changes kernel name mid-launch",
                field="Kernel Name",
            )
        section, metric = row[si], row[mi]
        if not metric:
            rules += 1  # a rule row: guidance and estimated speedup, not a fact
            continue
        key = (section, metric)
        skey = f"{section}/{metric}"
        factor, canon = _unit(dialect, cache, row[ui], skey)
        prev = units.get(skey)
        if prev is None:
            units[skey] = canon
        elif prev != canon:
            raise Refusal(
                "inconsistent_unit",
                f"line {reader.line_no}: {skey} is {canon!r} here and {prev!r} before",
                field=skey,
            )
        fname = modeled.get(key)
        if fname is not None:
            if fname in cur.carried:
                raise Refusal(
                    "duplicate_metric",
                    f"line {reader.line_no}: {skey} appears twice in launch {rid}",
                    field=skey,
                )
            _check_unit(fname, canon, skey)
            sources[fname] = skey
            cur.carried.add(fname)
            cur.values[fname] = _scaled(row[vi], factor)
        elif cur.unmodeled is not None:
            if skey in cur.unmodeled:
                raise Refusal(
                    "duplicate_metric",
                    f"line {reader.line_no}: {skey} appears twice in launch {rid}",
                    field=skey,
                )
            cur.unmodeled[skey] = _scaled(row[vi], factor)
    if cur is not None:
        builder.add(cur)
    return builder, sources, units, rules


def parse_ncu_csv(
    path: str | Path,
    *,
    tool_version: str | None = None,
    version_text: str | None = None,
    bound_to: Binding | None = None,
    max_unmodeled_launches: int = DEFAULT_MAX_UNMODELED_LAUNCHES,
) -> NcuFacts:
    """Facts from one `ncu --csv --page raw|details` report, or a Refusal."""
    version, source, dialect = resolve_version(tool_version, version_text)
    digest, size = open_report(path)
    if max_unmodeled_launches < 0:
        raise Refusal("bad_request", "max_unmodeled_launches must be >= 0", field="max_unmodeled_launches")
    with open(path, encoding="utf-8-sig", errors="strict", newline="") as f, no_gc():
        reader = _Reader(f)
        lines = reader.raw_lines()
        header, program_lines = _find_header(reader, lines)
        limitation = None
        rules = 0
        page: Literal["raw", "details"] = "raw"
        launches: list[NcuLaunch] = []
        sources: dict[str, str] = {}
        units: dict[str, str] = {}
        kept = omitted = 0
        gpu_names: set[str] = set()
        ccs: set[str] = set()
        if header:
            rows = csv.reader(reader.csv_lines(lines), strict=True)
            page = "details" if "Metric Name" in header else "raw"
            try:
                # ERR_NVGPUCTRPERM may only show up after the header; read it first when it is
                # already known, else fix the facts up below.
                args = {
                    "limitation": "counters_not_permitted" if reader.counters_not_permitted else None,
                    "max_unmodeled": max_unmodeled_launches,
                }
                if page == "details":
                    builder, sources, units, rules = _parse_details(reader, rows, header, dialect, args)
                else:
                    builder, sources, units = _parse_raw(reader, rows, header, dialect, args)
            except csv.Error as exc:
                raise Refusal(
                    "truncated", f"line {reader.line_no}: malformed CSV ({exc})", field="report"
                ) from None
            launches = builder.launches
            kept, omitted = builder.kept, builder.omitted
            gpu_names, ccs = builder.gpu_names, builder.ccs
        else:
            for _line in reader.csv_lines(lines):  # drain, noting ncu messages
                pass
        if reader.counters_not_permitted:
            limitation = "counters_not_permitted"
            launches = [_strip_counters(la) for la in launches]
        kernels = kernel_summaries(launches)
    seen = ReportIdentity(
        gpu_name="; ".join(sorted(gpu_names)) if gpu_names else None,
        compute_capability="; ".join(sorted(ccs)) if ccs else None,
    )
    return NcuFacts(
        report_sha256=digest,
        report_bytes=size,
        tool="ncu",
        tool_version=version,
        tool_version_source=source,
        parser=PARSER,
        parser_version=PARSER_VERSION,
        dialect=dialect.name,
        bound_to=bound_to,
        report_identity=seen,
        identity_mismatch=identity_mismatches(bound_to, seen),
        page=page,
        limitation=limitation,
        launches=launches,
        kernels=kernels,
        modeled_sources=sources,
        units=units,
        unmodeled_launches_kept=kept,
        unmodeled_launches_omitted=omitted,
        rule_rows_omitted=rules,
        tool_messages=reader.messages,
        tool_messages_omitted=reader.messages_omitted,
        program_output_lines=program_lines,
    )


def _strip_counters(la: NcuLaunch) -> NcuLaunch:
    if la.limitation is not None:
        return la
    update: dict[str, Any] = {"limitation": "counters_not_permitted"}
    na = list(la.not_available)
    for fname, (kind, _r, _d) in MODELED.items():
        if kind == "counter" and getattr(la, fname) is not None:
            update[fname] = None
            na.append(fname)
    update["not_available"] = na
    return la.model_copy(update=update)


def kernel_summaries(launches: list[NcuLaunch]) -> list[NcuKernelSummary]:
    """Launch count and duration totals per kernel name, largest total first."""
    groups: dict[str, list[NcuLaunch]] = {}
    for la in launches:
        groups.setdefault(la.name, []).append(la)
    out = []
    for name, ls in groups.items():
        ds = [la.duration_ns for la in ls if la.duration_ns is not None]
        out.append(
            NcuKernelSummary(
                name=name,
                launches=len(ls),
                launches_with_duration=len(ds),
                duration_ns_total=sum(ds) if ds else None,
                duration_ns_min=min(ds) if ds else None,
                duration_ns_max=max(ds) if ds else None,
                duration_ns_mean=sum(ds) / len(ds) if ds else None,
            )
        )
    out.sort(key=lambda k: (-(k.duration_ns_total or 0.0), k.name))
    return out
