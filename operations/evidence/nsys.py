"""Nsight Systems SQLite export (`nsys export --type sqlite`) to facts.

Reads kernels (CUPTI_ACTIVITY_KIND_KERNEL), memcpy and memset activity, CUDA runtime API calls
(CUPTI_ACTIVITY_KIND_RUNTIME) and NVTX ranges (NVTX_EVENTS), names resolved through StringIds,
per NVIDIA's documented export schema.

* The file is opened read-only and immutable (`file:...?mode=ro&immutable=1`), with
  `query_only` and `trusted_schema=OFF`, and only objects of type `table` are read, so a
  hostile file is never modified and cannot run a view of its own. A query that runs too long
  is interrupted (`too_slow`).
* A file that is not SQLite is `not_sqlite`; SQLite without the export's StringIds or
  META_DATA_EXPORT tables is `not_nsys_export`, naming the missing table.
* The schema version (META_DATA_EXPORT EXPORT_SCHEMA_VERSION) must be in `SCHEMA_DIALECTS`;
  else `unknown_schema_version`. Each activity table that is present must have the columns
  this parser reads (`missing_column` names TABLE.column); a table that is absent means the
  report recorded nothing of that kind and is listed in `tables_absent` (nsys creates tables
  lazily).
* Summaries (count, total, min, max per name) cover every row; the per-event lists hold at most
  `max_events` rows per kind, the rest counted in `*_omitted`.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from .common import Binding, Facts, FactSet, Refusal, ReportIdentity, identity_mismatches, open_report

PARSER = "operations.evidence.nsys"
PARSER_VERSION = "1"
DEFAULT_MAX_EVENTS = 20000
QUERY_SECONDS = 120.0


@dataclass(frozen=True)
class SchemaDialect:
    name: str
    major: int
    minors: range
    seen: str  # the documented schemas this range rests on


# Documented export schemas: 3.16.1 (nsys 2024.6.2), 3.24.14 (2026.1.1), 3.25.0 (2026.2.1). The
# columns read below exist unchanged in all three; the versions between add tables and columns
# only, so the range is accepted and every column is still checked.
SCHEMA_DIALECTS = (
    SchemaDialect(
        name="nsys-sqlite-3",
        major=3,
        minors=range(16, 26),
        seen="3.16.1 (2024.6.2), 3.24.14 (2026.1.1), 3.25.0 (2026.2.1)",
    ),
)

REQUIRED_TABLES: dict[str, tuple[str, ...]] = {
    "StringIds": ("id", "value"),
    "META_DATA_EXPORT": ("name", "value"),
}
ACTIVITY_TABLES: dict[str, tuple[str, ...]] = {
    "CUPTI_ACTIVITY_KIND_KERNEL": (
        "start",
        "end",
        "deviceId",
        "contextId",
        "streamId",
        "correlationId",
        "demangledName",
        "shortName",
        "registersPerThread",
        "gridX",
        "gridY",
        "gridZ",
        "blockX",
        "blockY",
        "blockZ",
        "staticSharedMemory",
        "dynamicSharedMemory",
        "localMemoryPerThread",
    ),
    "CUPTI_ACTIVITY_KIND_MEMCPY": (
        "start",
        "end",
        "deviceId",
        "streamId",
        "correlationId",
        "bytes",
        "copyKind",
    ),
    "CUPTI_ACTIVITY_KIND_MEMSET": ("start", "end", "deviceId", "streamId", "correlationId", "bytes", "value"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("start", "end", "globalTid", "correlationId", "nameId", "returnValue"),
    "NVTX_EVENTS": ("start", "end", "eventType", "text", "textId", "globalTid", "domainId"),
}
OPTIONAL_COLUMNS = {"CUPTI_ACTIVITY_KIND_KERNEL": ("mangledName",)}

# CUPTI memcpy kinds (ENUM_CUDA_MEMCPY_OPER), used when the export has no enum table.
MEMCPY_KINDS = {
    0: "Unknown",
    1: "Host-to-Device",
    2: "Device-to-Host",
    3: "Host-to-Array",
    4: "Array-to-Host",
    5: "Array-to-Array",
    6: "Array-to-Device",
    7: "Device-to-Array",
    8: "Device-to-Device",
    9: "Host-to-Host",
    10: "Peer-to-Peer",
    11: "Unified Host-to-Device",
    12: "Unified Device-to-Host",
    13: "Unified Device-to-Device",
}
NVTX_TYPES = {34: "mark", 59: "push_pop", 60: "start_end"}


class NsysKernel(Facts):
    start_ns: int
    end_ns: int
    duration_ns: int
    device: int
    context: int
    stream: int
    correlation_id: int | None
    name: str | None
    short_name: str | None
    mangled_name: str | None
    grid: list[int]
    block: list[int]
    registers_per_thread: int
    static_shared_memory_bytes: int
    dynamic_shared_memory_bytes: int
    local_memory_per_thread_bytes: int
    launched_by: str | None  # the runtime API call with the same correlation id


class NsysMemcpy(Facts):
    start_ns: int
    end_ns: int
    duration_ns: int
    device: int
    stream: int
    correlation_id: int | None
    bytes: int
    kind: str


class NsysMemset(Facts):
    start_ns: int
    end_ns: int
    duration_ns: int
    device: int
    stream: int
    correlation_id: int | None
    bytes: int
    value: int


class NsysApiCall(Facts):
    start_ns: int
    end_ns: int
    duration_ns: int
    name: str | None
    correlation_id: int | None
    thread: int | None
    return_value: int


class NsysNvtx(Facts):
    start_ns: int
    end_ns: int | None
    type: str
    text: str | None
    thread: int | None
    domain: int | None


class NameSummary(Facts):
    name: str | None
    count: int
    total_ns: int
    min_ns: int
    max_ns: int
    mean_ns: float


class NsysGpu(Facts):
    id: int | None
    name: str | None
    compute_capability: str | None
    sm_count: int | None
    total_memory_bytes: int | None


class NsysFacts(FactSet):
    kind: Literal["nsys"] = "nsys"
    schema_version: str
    tables_present: list[str]
    tables_absent: list[str]
    gpus: list[NsysGpu]
    window_start_ns: int | None
    window_end_ns: int | None
    counts: dict[str, int]
    kernel_summary: list[NameSummary]
    api_summary: list[NameSummary]
    memcpy_summary: list[NameSummary]  # by kind
    kernels: list[NsysKernel]
    memcpys: list[NsysMemcpy]
    memsets: list[NsysMemset]
    api_calls: list[NsysApiCall]
    nvtx: list[NsysNvtx]
    omitted: dict[str, int]
    unresolved_string_ids: int


class _Db:
    def __init__(self, path: str | Path) -> None:
        uri = f"file:{quote(str(Path(path).absolute()))}?mode=ro&immutable=1"
        try:
            self.conn = sqlite3.connect(uri, uri=True)
        except sqlite3.Error as exc:
            raise Refusal("not_sqlite", f"cannot open {path} as SQLite: {exc}", field="report") from None
        self.deadline = time.monotonic() + QUERY_SECONDS
        self.conn.set_progress_handler(self._progress, 10000)
        try:
            self.conn.execute("PRAGMA query_only=ON")
            self.conn.execute("PRAGMA trusted_schema=OFF")
            rows = self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
        except sqlite3.DatabaseError as exc:
            self.conn.close()
            raise Refusal(
                "not_sqlite", f"{Path(path).name} is not an SQLite database ({exc})", field="report"
            ) from None
        self.tables = {str(r[0]) for r in rows}

    def _progress(self) -> int:
        return 1 if time.monotonic() > self.deadline else 0

    def columns(self, table: str) -> set[str]:
        return {str(r[1]) for r in self.q(f'PRAGMA table_info("{table}")')}

    def q(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return list(self.it(sql, args))

    def it(self, sql: str, args: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
        try:
            yield from self.conn.execute(sql, args)
        except sqlite3.OperationalError as exc:
            if "interrupted" in str(exc):
                raise Refusal("too_slow", f"a query ran past {QUERY_SECONDS:.0f} s", field="report") from None
            raise Refusal("bad_export", f"query failed: {exc}", field="report") from None
        except sqlite3.DatabaseError as exc:
            raise Refusal("bad_export", f"the database is damaged: {exc}", field="report") from None


def _schema_version(db: _Db) -> tuple[str, str | None, SchemaDialect]:
    meta = {
        str(k): (None if v is None else str(v)) for k, v in db.q("SELECT name, value FROM META_DATA_EXPORT")
    }
    version = meta.get("EXPORT_SCHEMA_VERSION")
    product = meta.get("EXPORT_PRODUCT_VERSION")
    if not version:
        raise Refusal(
            "unknown_schema_version",
            "META_DATA_EXPORT has no EXPORT_SCHEMA_VERSION",
            field="EXPORT_SCHEMA_VERSION",
        )
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?", version.strip())
    if m:
        major, minor = int(m.group(1)), int(m.group(2))
        for d in SCHEMA_DIALECTS:
            if d.major == major and minor in d.minors:
                return version, product, d
    known = "; ".join(
        f"{d.major}.{d.minors.start}-{d.major}.{d.minors.stop - 1} (seen {d.seen})" for d in SCHEMA_DIALECTS
    )
    raise Refusal(
        "unknown_schema_version",
        f"export schema {version!r} is not in the dialect table ({known})",
        field="EXPORT_SCHEMA_VERSION",
    )


def open_export(path: str | Path) -> tuple[_Db, str, str | None, SchemaDialect, list[str], list[str]]:
    """Open and check an export: (db, schema version, product version, dialect, present, absent)."""
    db = _Db(path)
    try:
        for table, cols in REQUIRED_TABLES.items():
            if table not in db.tables:
                raise Refusal(
                    "not_nsys_export", f"not an nsys SQLite export: it has no {table} table", field=table
                )
            missing = [c for c in cols if c not in db.columns(table)]
            if missing:
                raise Refusal(
                    "missing_column", f"{table} has no column {missing[0]}", field=f"{table}.{missing[0]}"
                )
        version, product, dialect = _schema_version(db)
        present, absent = [], []
        for table, cols in ACTIVITY_TABLES.items():
            if table not in db.tables:
                absent.append(table)
                continue
            have = db.columns(table)
            for c in cols:
                if c not in have:
                    raise Refusal("missing_column", f"{table} has no column {c}", field=f"{table}.{c}")
            present.append(table)
    except BaseException:
        db.conn.close()
        raise
    return db, version, product, dialect, present, absent


def _summary(db: _Db, sql: str) -> list[NameSummary]:
    out = []
    for name, n, tot, lo, hi in db.it(sql):
        out.append(
            NameSummary(
                name=name, count=int(n), total_ns=int(tot), min_ns=int(lo), max_ns=int(hi), mean_ns=tot / n
            )
        )
    return out


def _gpus(db: _Db) -> list[NsysGpu]:
    if "TARGET_INFO_GPU" not in db.tables:
        return []
    have = db.columns("TARGET_INFO_GPU")
    want = [c for c in ("id", "name", "computeMajor", "computeMinor", "smCount", "totalMemory") if c in have]
    if not want:
        return []
    out = []
    for row in db.it(f"SELECT {', '.join(want)} FROM TARGET_INFO_GPU"):
        r = dict(zip(want, row, strict=True))
        cc = None
        if r.get("computeMajor") is not None and r.get("computeMinor") is not None:
            cc = f"{r['computeMajor']}.{r['computeMinor']}"
        out.append(
            NsysGpu(
                id=r.get("id"),
                name=r.get("name"),
                compute_capability=cc,
                sm_count=r.get("smCount"),
                total_memory_bytes=r.get("totalMemory"),
            )
        )
    return out


def _launchers(db: _Db, correlation_ids: set[int]) -> dict[int, str]:
    """Runtime API name per correlation id, for the given ids (one pass over the runtime table)."""
    name_ids: dict[int, int] = {}
    for cid, nid in db.it("SELECT correlationId, nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME"):
        if cid in correlation_ids and cid not in name_ids:
            name_ids[cid] = nid
    names: dict[int, str] = {}
    wanted = sorted(set(name_ids.values()))
    for i in range(0, len(wanted), 500):
        chunk = wanted[i : i + 500]
        marks = ",".join("?" * len(chunk))
        for sid, value in db.it(f"SELECT id, value FROM StringIds WHERE id IN ({marks})", tuple(chunk)):
            names[sid] = value
    return {cid: names[nid] for cid, nid in name_ids.items() if nid in names}


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise Refusal("bad_value", f"expected an integer, found {str(v)[:40]!r}", field="report")
    return v


def parse_nsys_sqlite(
    path: str | Path,
    *,
    tool_version: str | None = None,
    bound_to: Binding | None = None,
    max_events: int = DEFAULT_MAX_EVENTS,
) -> NsysFacts:
    """Facts from an nsys SQLite export, or a Refusal."""
    digest, size = open_report(path)
    if max_events < 0:
        raise Refusal("bad_request", "max_events must be >= 0", field="max_events")
    db, schema, product, dialect, present, absent = open_export(path)
    try:
        return _facts(
            _Export(
                db,
                digest,
                size,
                schema,
                product,
                dialect,
                present,
                absent,
                tool_version,
                bound_to,
                max_events,
            )
        )
    finally:
        db.conn.close()


@dataclass(frozen=True)
class _Export:
    """An opened, checked export and what was asked of it: what every reader of its tables shares."""

    db: _Db
    digest: str
    size: int
    schema: str
    product: str | None  # the nsys version that wrote it (EXPORT_PRODUCT_VERSION)
    dialect: SchemaDialect
    present: list[str]
    absent: list[str]
    tool_version: str | None  # the caller's --tool-version
    bound_to: Binding | None
    max_events: int


@dataclass
class _Events:
    """The activity read so far: the events kept per kind (at most max_events each), the summaries
    over every row, and what was counted on the way."""

    counts: dict[str, int]
    omitted: dict[str, int] = field(default_factory=dict)
    kernels: list[NsysKernel] = field(default_factory=list)
    memcpys: list[NsysMemcpy] = field(default_factory=list)
    memsets: list[NsysMemset] = field(default_factory=list)
    api_calls: list[NsysApiCall] = field(default_factory=list)
    nvtx: list[NsysNvtx] = field(default_factory=list)
    kernel_summary: list[NameSummary] = field(default_factory=list)
    api_summary: list[NameSummary] = field(default_factory=list)
    memcpy_summary: list[NameSummary] = field(default_factory=list)
    unresolved: int = 0


def _facts(x: _Export) -> NsysFacts:
    version, source = _tool_version(x.product, x.tool_version)
    ev = _read_events(x)
    w0, w1 = _analysis_window(x.db)
    gpus = _gpus(x.db)
    seen = ReportIdentity(
        gpu_name="; ".join(sorted({g.name for g in gpus if g.name})) or None,
        compute_capability="; ".join(sorted({g.compute_capability for g in gpus if g.compute_capability}))
        or None,
    )
    return NsysFacts(
        report_sha256=x.digest,
        report_bytes=x.size,
        tool="nsys",
        tool_version=version,
        tool_version_source=source,
        parser=PARSER,
        parser_version=PARSER_VERSION,
        dialect=x.dialect.name,
        bound_to=x.bound_to,
        report_identity=seen,
        identity_mismatch=identity_mismatches(x.bound_to, seen),
        schema_version=x.schema,
        tables_present=x.present,
        tables_absent=x.absent,
        gpus=gpus,
        window_start_ns=w0,
        window_end_ns=w1,
        counts=ev.counts,
        kernel_summary=ev.kernel_summary,
        api_summary=ev.api_summary,
        memcpy_summary=ev.memcpy_summary,
        kernels=ev.kernels,
        memcpys=ev.memcpys,
        memsets=ev.memsets,
        api_calls=ev.api_calls,
        nvtx=ev.nvtx,
        omitted=ev.omitted,
        unresolved_string_ids=ev.unresolved,
    )


def _tool_version(product: str | None, given: str | None) -> tuple[str | None, str | None]:
    """The nsys version and where it was read: the export's own, else the caller's (which must not
    contradict the export's)."""
    if given and product and not (product.startswith(given) or given.startswith(product)):
        raise Refusal(
            "version_conflict",
            f"--tool-version {given} disagrees with the export ({product})",
            field="tool_version",
        )
    return (product, "report") if product else (given, "argument" if given else None)


def _read_events(x: _Export) -> _Events:
    """Every activity table present, read in one fixed order (the first bad value refuses)."""
    ev = _Events(counts={table: int(x.db.q(f"SELECT count(*) FROM {table}")[0][0]) for table in x.present})
    if "CUPTI_ACTIVITY_KIND_KERNEL" in x.present:
        _read_kernels(x, ev)
    labels = _memcpy_labels(x.db)
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in x.present:
        _read_memcpys(x, ev, labels)
    if "CUPTI_ACTIVITY_KIND_MEMSET" in x.present:
        _read_memsets(x, ev)
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in x.present:
        _read_api_calls(x, ev)
    if "NVTX_EVENTS" in x.present:
        _read_nvtx(x, ev)
    return ev


def _read_kernels(x: _Export, ev: _Events) -> None:
    """The first max_events kernels by start, each with the runtime call that launched it, and the
    per-name summary over all of them."""
    has_mangled = "mangledName" in x.db.columns("CUPTI_ACTIVITY_KIND_KERNEL")
    mangled = "m.value" if has_mangled else "NULL"
    join_m = "LEFT JOIN StringIds m ON m.id = k.mangledName" if has_mangled else ""
    sql = (
        "SELECT k.start, k.end, k.deviceId, k.contextId, k.streamId, k.correlationId, d.value, sh.value, "
        f"{mangled}, k.gridX, k.gridY, k.gridZ, k.blockX, k.blockY, k.blockZ, k.registersPerThread, "
        "k.staticSharedMemory, k.dynamicSharedMemory, k.localMemoryPerThread "
        "FROM CUPTI_ACTIVITY_KIND_KERNEL k LEFT JOIN StringIds d ON d.id = k.demangledName "
        f"LEFT JOIN StringIds sh ON sh.id = k.shortName {join_m} ORDER BY k.start LIMIT ?"
    )
    kernels: list[NsysKernel] = []
    for r in x.db.it(sql, (x.max_events,)):
        if r[6] is None:
            ev.unresolved += 1
        kernels.append(_kernel(r))
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in x.present and kernels:
        launchers = _launchers(x.db, {k.correlation_id for k in kernels if k.correlation_id is not None})
        kernels = [
            k.model_copy(update={"launched_by": launchers.get(k.correlation_id)})
            if k.correlation_id in launchers
            else k
            for k in kernels
        ]
    ev.kernels = kernels
    ev.omitted["kernels"] = ev.counts["CUPTI_ACTIVITY_KIND_KERNEL"] - len(kernels)
    ev.kernel_summary = _summary(
        x.db,
        "SELECT d.value, count(*), sum(k.end - k.start), min(k.end - k.start), max(k.end - k.start) "
        "FROM CUPTI_ACTIVITY_KIND_KERNEL k LEFT JOIN StringIds d ON d.id = k.demangledName "
        "GROUP BY k.demangledName ORDER BY sum(k.end - k.start) DESC, d.value",
    )


def _kernel(r: tuple[Any, ...]) -> NsysKernel:
    """One row of _read_kernels' query (its launcher is filled in afterwards)."""
    start, end = _int(r[0]), _int(r[1])
    return NsysKernel(
        start_ns=start,
        end_ns=end,
        duration_ns=end - start,
        device=_int(r[2]),
        context=_int(r[3]),
        stream=_int(r[4]),
        correlation_id=r[5],
        name=r[6],
        short_name=r[7],
        mangled_name=r[8],
        grid=[_int(r[9]), _int(r[10]), _int(r[11])],
        block=[_int(r[12]), _int(r[13]), _int(r[14])],
        registers_per_thread=_int(r[15]),
        static_shared_memory_bytes=_int(r[16]),
        dynamic_shared_memory_bytes=_int(r[17]),
        local_memory_per_thread_bytes=_int(r[18]),
        launched_by=None,
    )


def _memcpy_labels(db: _Db) -> dict[int, str]:
    """Copy kind names: the documented table, overridden by the export's own enum where it has one."""
    kind_label = dict(MEMCPY_KINDS)
    if "ENUM_CUDA_MEMCPY_OPER" in db.tables and {"id", "label"} <= db.columns("ENUM_CUDA_MEMCPY_OPER"):
        for i, label in db.it("SELECT id, label FROM ENUM_CUDA_MEMCPY_OPER"):
            if isinstance(i, int) and isinstance(label, str):
                kind_label[i] = label
    return kind_label


def _read_memcpys(x: _Export, ev: _Events, kind_label: dict[int, str]) -> None:
    """Every copy, in one pass: the first max_events kept, each kind's count, total, min and max."""
    per_kind: dict[str, list[int]] = {}
    for r in x.db.it(
        "SELECT start, end, deviceId, streamId, correlationId, bytes, copyKind FROM CUPTI_ACTIVITY_KIND_MEMCPY ORDER BY start"
    ):
        start, end = _int(r[0]), _int(r[1])
        kind = kind_label.get(r[6], f"kind {r[6]}")
        s = per_kind.setdefault(kind, [0, 0, 2**63, -(2**63)])
        d = end - start
        s[0] += 1
        s[1] += d
        s[2] = min(s[2], d)
        s[3] = max(s[3], d)
        if len(ev.memcpys) < x.max_events:
            ev.memcpys.append(
                NsysMemcpy(
                    start_ns=start,
                    end_ns=end,
                    duration_ns=d,
                    device=_int(r[2]),
                    stream=_int(r[3]),
                    correlation_id=r[4],
                    bytes=_int(r[5]),
                    kind=kind,
                )
            )
    ev.omitted["memcpys"] = ev.counts["CUPTI_ACTIVITY_KIND_MEMCPY"] - len(ev.memcpys)
    ev.memcpy_summary = [
        NameSummary(name=k, count=v[0], total_ns=v[1], min_ns=v[2], max_ns=v[3], mean_ns=v[1] / v[0])
        for k, v in sorted(per_kind.items(), key=lambda kv: (-kv[1][1], kv[0]))
    ]


def _read_memsets(x: _Export, ev: _Events) -> None:
    """The first max_events memsets by start."""
    for r in x.db.it(
        "SELECT start, end, deviceId, streamId, correlationId, bytes, value FROM CUPTI_ACTIVITY_KIND_MEMSET "
        "ORDER BY start LIMIT ?",
        (x.max_events,),
    ):
        start, end = _int(r[0]), _int(r[1])
        ev.memsets.append(
            NsysMemset(
                start_ns=start,
                end_ns=end,
                duration_ns=end - start,
                device=_int(r[2]),
                stream=_int(r[3]),
                correlation_id=r[4],
                bytes=_int(r[5]),
                value=_int(r[6]),
            )
        )
    ev.omitted["memsets"] = ev.counts["CUPTI_ACTIVITY_KIND_MEMSET"] - len(ev.memsets)


def _read_api_calls(x: _Export, ev: _Events) -> None:
    """The first max_events CUDA runtime calls by start, and the per-name summary over all of them."""
    for r in x.db.it(
        "SELECT r.start, r.end, s.value, r.correlationId, r.globalTid, r.returnValue FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
        "LEFT JOIN StringIds s ON s.id = r.nameId ORDER BY r.start LIMIT ?",
        (x.max_events,),
    ):
        start, end = _int(r[0]), _int(r[1])
        if r[2] is None:
            ev.unresolved += 1
        ev.api_calls.append(
            NsysApiCall(
                start_ns=start,
                end_ns=end,
                duration_ns=end - start,
                name=r[2],
                correlation_id=r[3],
                thread=r[4],
                return_value=_int(r[5]),
            )
        )
    ev.omitted["api_calls"] = ev.counts["CUPTI_ACTIVITY_KIND_RUNTIME"] - len(ev.api_calls)
    ev.api_summary = _summary(
        x.db,
        "SELECT s.value, count(*), sum(r.end - r.start), min(r.end - r.start), max(r.end - r.start) "
        "FROM CUPTI_ACTIVITY_KIND_RUNTIME r LEFT JOIN StringIds s ON s.id = r.nameId "
        "GROUP BY r.nameId ORDER BY sum(r.end - r.start) DESC, s.value",
    )


def _read_nvtx(x: _Export, ev: _Events) -> None:
    """NVTX marks, push/pop and start/end ranges (the event types cko reads), the first max_events."""
    for r in x.db.it(
        "SELECT n.start, n.end, n.eventType, coalesce(n.text, s.value), n.globalTid, n.domainId FROM NVTX_EVENTS n "
        "LEFT JOIN StringIds s ON s.id = n.textId WHERE n.eventType IN (34, 59, 60) ORDER BY n.start LIMIT ?",
        (x.max_events,),
    ):
        ev.nvtx.append(
            NsysNvtx(
                start_ns=_int(r[0]),
                end_ns=r[1] if isinstance(r[1], int) else None,
                type=NVTX_TYPES.get(r[2], str(r[2])),
                text=r[3],
                thread=r[4],
                domain=r[5],
            )
        )
    n_nvtx = int(x.db.q("SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (34, 59, 60)")[0][0])
    ev.omitted["nvtx"] = n_nvtx - len(ev.nvtx)


def _analysis_window(db: _Db) -> tuple[int | None, int | None]:
    """The span the capture covered (ANALYSIS_DETAILS), where the export records it."""
    if "ANALYSIS_DETAILS" in db.tables and {"startTime", "stopTime"} <= db.columns("ANALYSIS_DETAILS"):
        row = db.q("SELECT min(startTime), max(stopTime) FROM ANALYSIS_DETAILS")
        if row and isinstance(row[0][0], int) and isinstance(row[0][1], int):
            return row[0][0], row[0][1]
    return None, None
