"""PyTorch Profiler Chrome trace (`prof.export_chrome_trace(path)`) to facts.

* Three paths, one result. First the compiled scanner (native/trace_scan.c through
  trace_native.py): it validates the whole file as strict JSON in one pass and keeps only what
  the facts need (per-category counts, per (category, name) duration summaries, the GPU events
  joined with their launch call and op, the window), building no Python object per event; the
  few values it returns as bytes (top-level fields, the kept GPU events' args) are decoded by
  msgspec exactly as the next path decodes them. On anything it cannot vouch for (an escape in
  a string it reads, a duplicate key it reads, a value of a type it does not model, an integer
  past int64, deep nesting, ...) it declines, and the Python fast path takes the bytes: msgspec
  into typed structs holding only the fields the facts read, then one loop. That path in turn
  never refuses: on anything it cannot vouch for (a decode or type error, a missing or odd
  field, invalid UTF-8 in a skipped string, an event without a phase of the Chrome format, a
  schemaVersion it does not accept) it hands the bytes to the reference path, which decodes the
  whole document (pydantic-core) and checks every event, so every refusal and its message comes
  from one place. Tests hold the three paths equal (tests/test_trace_native.py fuzzes the
  scanner against the reference). Measured on 1M events (250 MB, one core, dev machine,
  benchmarks/parse_speed.py, reading and hashing the file included): ~1.26M events/s with the
  scanner (1.17M on the H200 host), ~700k on the Python fast path, ~250k on the reference path;
  peak memory 0.35 GB with the scanner (the file's bytes and ~0.1 GB), 0.6 GB without. Without
  the scanner built the fast path leads; without msgspec the reference path runs alone.
* Complete events ("ph": "X") are sorted by category: CPU ops and user annotations, CUDA
  runtime and driver calls, kernels, memcpys and memsets. Durations become ns (the trace's
  unit is us).
* Correlation: a GPU event's `args.correlation` names the runtime/driver call that launched it
  (`launched_by`, `launch_start_ns`, and `launch_delay_ns` from that call's start to the GPU
  start); its `args["External id"]` names the CPU op it ran under (`op`).
* Device properties and the CUDA runtime, driver and CUPTI versions the trace carries are
  facts; the torch version is not in the trace and comes from the caller (`tool_version`).
* Refusals: not JSON (`not_json`), no `traceEvents` list or no `schemaVersion`
  (`not_torch_trace`), a schemaVersion this parser does not know (`unknown_schema_version`),
  an event of a known category without its name, `ts` or `dur`, or with a negative, non-numeric
  or out-of-range one (`missing_field` / `bad_value`, naming traceEvents[i].field), or whose
  correlation / External id is a list or an object (`bad_value`). Events of other categories
  are counted under `unmodeled_categories`.
* Summaries cover every event; the per-event lists hold at most `max_events` of each kind.
* One known difference between the paths: pydantic-core refuses JSON nested deeper than 200
  levels; the fast path reads such a file when the depth is in keys it skips (msgspec's own
  limit is higher). No profiler writes such nesting.
"""

from __future__ import annotations

import codecs
import hashlib
import os
from array import array
from operator import itemgetter
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import TypeAdapter
from pydantic_core import from_json  # the reference decoder: faster than the stdlib's (~1.7x), same result

from . import trace_native
from .common import Binding, Facts, FactSet, Refusal, ReportIdentity, identity_mismatches, no_gc

try:
    import msgspec
except ImportError:  # an environment without it still parses, on the reference path
    msgspec = None  # type: ignore[assignment]

PARSER = "operations.evidence.torch_trace"
PARSER_VERSION = "1"
SCHEMA_VERSIONS = {1}
DIALECT = "torch-chrome-trace-1"
DEFAULT_MAX_EVENTS = 20000
MAX_BYTES = 2 << 30
# the top-level fields the facts read
HEAD_KEYS = trace_native.TOP_KEYS

CPU_CATS = frozenset({"cpu_op", "user_annotation", "python_function", "cpu_instant_event"})
API_CATS = frozenset({"cuda_runtime", "cuda_driver"})
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
OTHER_KNOWN = frozenset({"gpu_user_annotation", "overhead", "Trace", "ac2g", "fwdbwd"})
# 0: GPU activity, 1: runtime/driver call, 2: CPU op (the one whose External id names GPU work), 3: other CPU
KINDS = {
    **dict.fromkeys(GPU_CATS, 0),
    **dict.fromkeys(API_CATS, 1),
    **dict.fromkeys(CPU_CATS, 3),
    "cpu_op": 2,
}


class TorchGpuEvent(Facts):
    category: Literal["kernel", "gpu_memcpy", "gpu_memset"]
    name: str
    start_ns: int
    duration_ns: int
    device: int | None
    stream: int | None
    correlation_id: int | None
    external_id: int | None
    op: str | None  # the CPU op with the same External id
    launched_by: str | None  # the runtime/driver call with the same correlation id
    launch_start_ns: int | None
    launch_delay_ns: int | None  # GPU start minus launch call start
    grid: list[int] | None = None
    block: list[int] | None = None
    registers_per_thread: int | None = None
    shared_memory_bytes: int | None = None
    bytes: int | None = None


_GPU_EVENTS = TypeAdapter(list[TorchGpuEvent])


class NameSummary(Facts):
    name: str
    count: int
    total_ns: int
    min_ns: int
    max_ns: int


class TorchDevice(Facts):
    id: int | None
    name: str | None
    compute_capability: str | None
    total_memory_bytes: int | None
    sm_count: int | None
    properties: dict[str, Any]


class TorchTraceFacts(FactSet):
    kind: Literal["torch"] = "torch"
    schema_version: int
    cuda_runtime_version: str | None
    cuda_driver_version: str | None
    cupti_version: int | None
    base_time_ns: int | None
    devices: list[TorchDevice]
    events: int
    counts: dict[str, int]  # complete events per category
    unmodeled_categories: dict[str, int]
    window_start_ns: int | None
    window_end_ns: int | None
    gpu_events: int
    gpu_events_correlated: int  # with a runtime/driver call of the same correlation id
    kernel_summary: list[NameSummary]
    memcpy_summary: list[NameSummary]
    memset_summary: list[NameSummary]
    api_summary: list[NameSummary]
    cpu_op_summary: list[NameSummary]
    gpu: list[TorchGpuEvent]  # kernels, memcpys and memsets in start order, at most max_events
    gpu_omitted: int
    summary_limit: int
    summaries_omitted: dict[str, int]


def _cuda_version(v: Any) -> str | None:
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
        return f"{v // 1000}.{(v % 1000) // 10}"
    return None


def read_trace(path: str | Path) -> bytes:
    """The file's bytes, read once: both paths decode these, and the recorded sha256 is theirs
    (a file rewritten while being parsed cannot get one file's digest on another's facts)."""
    p = Path(path)
    try:
        if not p.is_file():
            raise Refusal("unreadable", f"{p} is not a regular file", field="report")
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_BYTES:
                raise Refusal(
                    "too_large", f"{p} is {size} bytes; at most {MAX_BYTES} are read", field="report"
                )
            data = f.read()
    except OSError as exc:
        raise Refusal("unreadable", f"cannot read {p}: {exc.strerror or exc}", field="report") from None
    if len(data) > MAX_BYTES:  # grew since the stat
        raise Refusal("too_large", f"{p} is {len(data)} bytes; at most {MAX_BYTES} are read", field="report")
    return data


def decode_trace(data: bytes, name: str = "trace") -> dict[str, Any]:
    """The reference decode: the whole document, then the checks that make it a known trace."""
    try:
        doc = from_json(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Refusal("not_json", f"{name} is not JSON ({str(exc)[:200]})", field="report") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise Refusal("not_torch_trace", "no traceEvents list: not a Chrome trace", field="traceEvents")
    sv = doc.get("schemaVersion")
    if sv is None:
        raise Refusal(
            "not_torch_trace", "no schemaVersion: not a PyTorch Profiler trace", field="schemaVersion"
        )
    if not _known_schema(sv):
        raise Refusal(
            "unknown_schema_version",
            f"trace schemaVersion {repr(sv)[:100]} is not known (known: {sorted(SCHEMA_VERSIONS)})",
            field="schemaVersion",
        )
    return doc


def _known_schema(sv: Any) -> bool:
    # type() first: a list is unhashable, and True == 1
    return type(sv) in (int, float) and sv in SCHEMA_VERSIONS


def load_trace(path: str | Path) -> dict[str, Any]:
    """Decode a trace file and check it is a PyTorch Profiler trace of a known schema."""
    return decode_trace(read_trace(path), Path(path).name)


def _missing(i: int, field: str) -> Refusal:
    return Refusal(
        "missing_field", f"traceEvents[{i}] has no usable {field}", field=f"traceEvents[{i}].{field}"
    )


def _ns(us: int | float, i: int, field: str) -> int:
    try:
        return round(us * 1000)
    except (OverflowError, ValueError):  # inf or NaN (the reference decoder reads NaN/Infinity)
        raise Refusal(
            "bad_value", f"traceEvents[{i}] has a {field} out of range", field=f"traceEvents[{i}].{field}"
        ) from None


def _key(v: Any, i: int, field: str) -> Any:
    if isinstance(v, list | dict):  # used as a dict key: a list or object cannot name a call or op
        raise Refusal(
            "bad_value",
            f"traceEvents[{i}].args has a non-scalar {field}",
            field=f"traceEvents[{i}].args.{field}",
        )
    return v


def scan_events(doc: dict[str, Any]) -> dict[str, Any]:
    """The reference pass over traceEvents: every event checked, refusals naming its index.

    Returns a dict with keys events (how many), counts {category: complete events} (in order of
    first appearance), other {unmodeled category: count}, durations {category: {name: [ns]}},
    gpu [(start, dur, cat, name, correlation, External id, args)] in file order (args: the
    event's dict here, `scan_fast`'s struct there; `_gpu_args` reads either), ops {ext: name},
    launches {corr: (name, start)}, window (first start, last end) or None. `scan_fast`
    returns the same.
    """
    counts: dict[str, int] = {}
    other: dict[str, int] = {}
    durations: dict[str, dict[str, list[int]]] = {}
    gpu: list[tuple[Any, ...]] = []
    ops: dict[Any, str] = {}
    launches: dict[Any, tuple[str, int]] = {}
    lo: int | None = None
    hi: int | None = None
    events = doc["traceEvents"]
    for i, e in enumerate(events):
        if type(e) is not dict:
            raise Refusal("bad_value", f"traceEvents[{i}] is not an object", field=f"traceEvents[{i}]")
        if e.get("ph") != "X":
            continue
        cat: Any = e.get("cat")
        kind = KINDS.get(cat) if type(cat) is str else None
        if kind is None:
            key = cat if isinstance(cat, str) else repr(cat)
            if key in OTHER_KNOWN:
                counts[key] = counts.get(key, 0) + 1
            else:
                other[key] = other.get(key, 0) + 1
            continue
        counts[cat] = counts.get(cat, 0) + 1
        name: Any = e.get("name")
        ts: Any = e.get("ts")
        dur: Any = e.get("dur")
        if type(name) is not str:
            raise _missing(i, "name")
        t = type(ts)
        if t is not float and t is not int:  # bool is neither
            raise _missing(i, "ts")
        t = type(dur)
        if t is not float and t is not int:
            raise _missing(i, "dur")
        if dur < 0:
            raise Refusal("bad_value", f"traceEvents[{i}] has a negative dur", field=f"traceEvents[{i}].dur")
        start = _ns(ts, i, "ts")
        d = _ns(dur, i, "dur")
        args: Any = e.get("args")
        if type(args) is not dict:
            args = {}
        durations.setdefault(cat, {}).setdefault(name, []).append(d)
        end = start + d
        if lo is None or start < lo:
            lo = start
        if hi is None or end > hi:
            hi = end
        if kind == 0:
            corr = _key(args.get("correlation"), i, "correlation")
            ext = _key(args.get("External id"), i, "External id")
            gpu.append((start, d, cat, name, corr, ext, args))
        elif kind == 1:
            corr = _key(args.get("correlation"), i, "correlation")
            if corr is not None and corr not in launches:
                launches[corr] = (name, start)
        elif kind == 2:
            ext = _key(args.get("External id"), i, "External id")
            if ext is not None and ext not in ops:
                ops[ext] = name
    return {
        "events": len(events),
        "counts": counts,
        "other": other,
        "durations": durations,
        "gpu": gpu,
        "ops": ops,
        "launches": launches,
        "window": None if lo is None or hi is None else (lo, hi),
    }


# every phase of the Chrome Trace Event Format, deprecated ones too
PHASES = "BEXiICbneSTpFstfPNODMVvRc()"

if msgspec is not None:

    class _Args(msgspec.Struct, gc=False):
        """The args the facts read; msgspec skips every other key without building it."""

        device: Any = None
        stream: Any = None
        correlation: Any = None
        external_id: Any = msgspec.field(default=None, name="External id")
        grid: Any = None
        block: Any = None
        registers: Any = msgspec.field(default=None, name="registers per thread")
        shared_memory: Any = msgspec.field(default=None, name="shared memory")
        bytes: Any = None

    class _Complete(msgspec.Struct, tag_field="ph", tag="X", gc=False):
        # typed where the reference path would refuse another type: such an event fails the
        # decode and the file goes to the reference path (bool is not accepted for int | float)
        cat: str | None = None
        name: str | None = None
        ts: int | float | None = None
        dur: int | float | None = None
        args: _Args | None = None

    # Events are a union tagged by ph: a complete event ("X") is a _Complete, any other phase an
    # empty struct, its keys skipped unbuilt (measured: ~0.2 s less per 1M events of the real
    # trace's mix than one struct for all). An event without ph, or with one outside PHASES (or
    # two different ones), fails the decode: the reference path takes the file.
    _OTHER_PHASES = tuple(
        msgspec.defstruct(f"_Phase{ord(p)}", [], tag_field="ph", tag=p, gc=False) for p in PHASES if p != "X"
    )
    _EVENT: Any = Union[(_Complete, *_OTHER_PHASES)]

    _Trace = msgspec.defstruct(
        "_Trace",
        [
            ("traceEvents", list[_EVENT]),
            ("schemaVersion", Any, None),
            ("deviceProperties", Any, None),
            ("cuda_runtime_version", Any, None),
            ("cuda_driver_version", Any, None),
            ("cupti_version", Any, None),
            ("baseTimeNanoseconds", Any, None),
        ],
        gc=False,
    )
    _DECODER = msgspec.json.Decoder(_Trace)
    _ARGS_DECODER = msgspec.json.Decoder(_Args)  # a kept GPU event's args, from the compiled scanner
    _DECODE_ERRORS: tuple[type[Exception], ...] = (msgspec.MsgspecError, RecursionError)


def _utf8(data: bytes) -> bool:
    """Whether the whole file is UTF-8 (msgspec checks only the strings it decodes)."""
    if data.isascii():
        return True
    check = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(data)
    step = 1 << 22  # bounded memory: the decoded text is dropped chunk by chunk
    try:
        for i in range(0, len(data), step):
            check.decode(view[i : i + step])
        check.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    return True


def decode_fast(data: bytes) -> Any:
    """The fast path's decode (a `_Trace`), or None where only the reference path can tell:
    msgspec absent, not JSON, an event without a phase of PHASES, a field of another type than
    `_Complete` declares, invalid UTF-8 anywhere, a schemaVersion the reference path would
    refuse."""
    if msgspec is None:
        return None
    try:
        trace: Any = _DECODER.decode(data)
    except _DECODE_ERRORS:
        return None
    if not _utf8(data) or not _known_schema(trace.schemaVersion):
        return None
    return trace


def scan_fast(data: bytes) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(top-level fields, scan as `scan_events` returns it), or None where the reference path
    must decide (see `decode_fast` and `scan_decoded`)."""
    trace = decode_fast(data)
    return None if trace is None else scan_decoded(trace)


def scan_decoded(trace: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """One loop over the decoded events, or None on anything the reference path would refuse
    (an event of a known category without a name, ts or dur, a negative or out-of-range one, a
    list or object as correlation / External id)."""
    counts: dict[str, int] = {}
    other: dict[str, int] = {}
    # array('q'): the durations are kept as machine ints, not one int object each (nothing to
    # free); a duration past int64 raises OverflowError, which hands the file to the reference path
    durations: dict[str, dict[str, array[int]]] = {}
    gpu: list[tuple[Any, ...]] = []
    ops: dict[Any, str] = {}
    launches: dict[Any, tuple[str, int]] = {}
    table: dict[str | None, tuple[int, dict[Any, array[int]]]] = {}  # category -> (kind, {name: [ns]})
    lo: float = float("inf")
    hi: float = float("-inf")
    kinds, other_known, complete = KINDS, OTHER_KNOWN, _Complete
    gpu_add = gpu.append
    events = trace.traceEvents
    try:
        for e in events:
            if type(e) is not complete:
                continue
            cat: Any = e.cat
            slot = table.get(cat)
            if slot is None:
                kind = kinds.get(cat) if cat is not None else None
                if kind is None:
                    key = "None" if cat is None else cat  # the reference path's repr(None)
                    if key in other_known:
                        counts[key] = counts.get(key, 0) + 1
                    else:
                        other[key] = other.get(key, 0) + 1
                    continue
                counts[cat] = 0  # holds the order of first appearance; the count comes after the loop
                slot = table[cat] = (kind, durations.setdefault(cat, {}))
            kind, names = slot
            dur: Any = e.dur
            if dur < 0:  # None < 0 is a TypeError: both go to the reference path
                return None
            ts: Any = e.ts
            # round(x) is x.__round__(); called directly it skips the builtin's lookup (~25 ns each)
            start = (ts * 1000).__round__()  # None: TypeError; inf: OverflowError
            d = (dur * 1000).__round__()
            name: Any = e.name  # None is checked once after the loop
            acc = names.get(name)
            if acc is None:
                acc = names[name] = array("q")
            acc.append(d)
            if start < lo:
                lo = start
            end = start + d
            if end > hi:
                hi = end
            if kind == 0:
                a = e.args
                if a is None:
                    gpu_add((start, d, cat, name, None, None, None))
                else:
                    corr = a.correlation
                    ext = a.external_id
                    hash(corr)  # looked up later: a list or an object is the reference path's refusal
                    hash(ext)
                    gpu_add((start, d, cat, name, corr, ext, a))
            elif kind == 1:
                a = e.args
                if a is not None:
                    corr = a.correlation
                    if corr is not None:  # the first call wins; unhashable: TypeError
                        launches.setdefault(corr, (name, start))
            elif kind == 2:
                a = e.args
                if a is not None:
                    ext = a.external_id
                    if ext is not None:
                        ops.setdefault(ext, name)
    except (TypeError, OverflowError, ValueError):
        return None
    for cat, names in durations.items():
        if None in names:  # an event of a known category without a name
            return None
        counts[cat] = sum(map(len, names.values()))
    head = {
        "schemaVersion": trace.schemaVersion,
        "deviceProperties": trace.deviceProperties,
        "cuda_runtime_version": trace.cuda_runtime_version,
        "cuda_driver_version": trace.cuda_driver_version,
        "cupti_version": trace.cupti_version,
        "baseTimeNanoseconds": trace.baseTimeNanoseconds,
    }
    scan = {
        "events": len(events),
        "counts": counts,
        "other": other,
        "durations": durations,
        "gpu": gpu,
        "ops": ops,
        "launches": launches,
        "window": None if lo == float("inf") else (lo, hi),
    }
    return head, scan


def _summarise(groups: list[dict[str, tuple[int, int, int, int]]]) -> dict[str, list[int]]:
    """{name: [count, total, min, max]} over the per-category {name: (count, total, min, max)}
    of one summary."""
    acc: dict[str, list[int]] = {}
    for names in groups:
        for name, (n, total, lo, hi) in names.items():
            s = acc.get(name)
            if s is None:
                acc[name] = [n, total, lo, hi]
            else:
                s[0] += n
                s[1] += total
                s[2] = min(s[2], lo)
                s[3] = max(s[3], hi)
    return acc


def _summaries(acc: dict[str, list[int]], limit: int) -> tuple[list[NameSummary], int]:
    ranked = sorted(acc.items(), key=lambda kv: (-kv[1][1], kv[0]))
    out = [
        NameSummary(name=k, count=v[0], total_ns=v[1], min_ns=v[2], max_ns=v[3]) for k, v in ranked[:limit]
    ]
    return out, max(0, len(ranked) - limit)


# type() rather than isinstance(): a decoded JSON value is exactly int, bool, float, str, list,
# dict or None, so `type(v) is int` is "an int and not a bool" in one test
def _ints(v: Any) -> list[int] | None:
    if type(v) is list and all(type(x) is int for x in v):
        return list(v)
    return None


def _int_or_none(v: Any) -> int | None:
    return v if type(v) is int else None


def _gpu_args(a: Any) -> tuple[Any, ...]:
    """(device, stream, grid, block, registers, shared memory, bytes) from either path's args."""
    if a is None:
        return (None,) * 7
    if type(a) is dict:
        g = a.get
        return (
            g("device"),
            g("stream"),
            g("grid"),
            g("block"),
            g("registers per thread"),
            g("shared memory"),
            g("bytes"),
        )
    return (a.device, a.stream, a.grid, a.block, a.registers, a.shared_memory, a.bytes)


def _devices(doc: dict[str, Any]) -> list[TorchDevice]:
    props = doc.get("deviceProperties")
    out: list[TorchDevice] = []
    if not isinstance(props, list):
        return out
    for p in props:
        if not isinstance(p, dict):
            continue
        major, minor = p.get("computeMajor"), p.get("computeMinor")
        cc = f"{major}.{minor}" if isinstance(major, int) and isinstance(minor, int) else None
        out.append(
            TorchDevice(
                id=_int_or_none(p.get("id")),
                name=p.get("name") if isinstance(p.get("name"), str) else None,
                compute_capability=cc,
                total_memory_bytes=_int_or_none(p.get("totalGlobalMem")),
                sm_count=_int_or_none(p.get("numSms")),
                properties={k: v for k, v in p.items() if isinstance(v, int | float | str | bool)},
            )
        )
    return out


def parse_torch_trace(
    path: str | Path,
    *,
    tool_version: str | None = None,
    bound_to: Binding | None = None,
    max_events: int = DEFAULT_MAX_EVENTS,
    summary_limit: int = 200,
) -> TorchTraceFacts:
    """Facts from a PyTorch Profiler Chrome trace, or a Refusal."""
    if max_events < 0 or summary_limit < 0:
        raise Refusal("bad_request", "max_events and summary_limit must be >= 0", field="max_events")
    with no_gc():  # the whole parse: millions of live objects, none of them in a cycle
        # the bytes are passed, not kept here, so _facts can free them before building the facts
        return _facts(path, read_trace(path), tool_version, bound_to, max_events, summary_limit)


def scan_native(data: bytes, max_events: int) -> dict[str, Any] | None:
    """The compiled scanner's findings in the form `_joined` gives, or None where it is not built
    or declines (the Python paths then decide). Needs msgspec: the few values it hands back as
    bytes (top-level fields, the kept GPU events' args) are decoded exactly as the fast path
    decodes them."""
    if msgspec is None or not trace_native.available():
        return None
    found = trace_native.scan(data, KINDS, max_events)
    if found is None:
        return None
    try:
        head = {k: msgspec.json.decode(found.top[k]) if k in found.top else None for k in HEAD_KEYS}
    except _DECODE_ERRORS:
        return None
    if not _known_schema(head["schemaVersion"]):
        return None
    cats = [("None" if c is None else c, kind, n) for c, kind, n in found.cats]
    counts: dict[str, int] = {}
    other: dict[str, int] = {}
    durations: dict[str, dict[str, tuple[int, int, int, int]]] = {}
    for cat, kind, n in cats:
        into = counts if kind >= 0 or cat in OTHER_KNOWN else other
        into[cat] = into.get(cat, 0) + n
        if kind >= 0:
            durations[cat] = {}
    names = [name for _, name, *_ in found.names]
    for ci, name, n, total, lo, hi in found.names:
        durations[cats[ci][0]][name] = (n, total, lo, hi)
    gpu = []
    for start, d, ci, ni, corr, ext, args, op, launch, launch_start in found.gpu:
        try:  # valid JSON, yet msgspec may refuse a value in it (1e400): then so would the fast path
            a = None if args is None else _ARGS_DECODER.decode(args)
        except _DECODE_ERRORS:
            return None
        gpu.append(
            (
                start,
                d,
                cats[ci][0],
                names[ni],
                corr,
                ext,
                a,
                None if op is None else names[op],
                None if launch is None else (names[launch], launch_start),
            )
        )
    return {
        "head": head,
        "events": found.events,
        "counts": counts,
        "other": other,
        "durations": durations,
        "gpu_total": found.gpu_total,
        "correlated": found.correlated,
        "gpu": gpu,
        "window": found.window,
    }


def _joined(head: dict[str, Any], scan: dict[str, Any], max_events: int) -> dict[str, Any]:
    """A Python path's scan (see `scan_events`) in the form the facts are built from: durations
    summarised per (category, name), the GPU events sorted by start and the first max_events of
    them joined with their op and launch call."""
    ops, launches, gpu = scan["ops"], scan["launches"], scan["gpu"]
    gpu.sort(key=itemgetter(0))  # by start; stable, so equal starts keep the file's order
    # launches holds no None key, so a GPU event without a correlation id is not counted
    correlated = sum(map(launches.__contains__, map(itemgetter(4), gpu)))
    kept = [
        (
            start,
            d,
            cat,
            name,
            corr,
            ext,
            a,
            ops.get(ext) if ext is not None else None,
            launches.get(corr) if corr is not None else None,
        )
        for start, d, cat, name, corr, ext, a in gpu[:max_events]
    ]
    durations = {
        cat: {name: (len(ds), sum(ds), min(ds), max(ds)) for name, ds in names.items()}
        for cat, names in scan["durations"].items()
    }
    return {
        "head": {k: head.get(k) for k in HEAD_KEYS},
        "events": scan["events"],
        "counts": scan["counts"],
        "other": scan["other"],
        "durations": durations,
        "gpu_total": len(gpu),
        "correlated": correlated,
        "gpu": kept,
        "window": scan["window"],
    }


def _facts(
    path: str | Path,
    data: bytes,
    tool_version: str | None,
    bound_to: Binding | None,
    max_events: int,
    summary_limit: int,
) -> TorchTraceFacts:
    digest, size = hashlib.sha256(data).hexdigest(), len(data)
    scan = scan_native(data, max_events)
    if scan is None:
        fast = scan_fast(data)
        if fast is None:
            doc = decode_trace(data, Path(path).name)
            del data
            scan = _joined(doc, scan_events(doc), max_events)
        else:
            del data
            scan = _joined(*fast, max_events)
    else:
        del data
    gpu_out: list[dict[str, Any]] = []
    for start, d, cat, name, corr, ext, a, op, launch in scan["gpu"]:
        device, stream, grid, block, regs, smem, nbytes = _gpu_args(a)
        ev: dict[str, Any] = {
            "category": cat,
            "name": name,
            "start_ns": start,
            "duration_ns": d,
            "device": _int_or_none(device),
            "stream": _int_or_none(stream),
            "correlation_id": _int_or_none(corr),
            "external_id": _int_or_none(ext),
            "op": op,
            "launched_by": launch[0] if launch else None,
            "launch_start_ns": launch[1] if launch else None,
            "launch_delay_ns": start - launch[1] if launch else None,
        }
        if cat == "kernel":
            ev["grid"] = _ints(grid)
            ev["block"] = _ints(block)
            ev["registers_per_thread"] = _int_or_none(regs)
            ev["shared_memory_bytes"] = _int_or_none(smem)
        else:
            ev["bytes"] = _int_or_none(nbytes)
        gpu_out.append(ev)
    durations = scan["durations"]

    def group(cats: tuple[str, ...]) -> list[dict[str, tuple[int, int, int, int]]]:
        return [durations[c] for c in cats if c in durations]

    omitted: dict[str, int] = {}
    ksum, omitted["kernels"] = _summaries(_summarise(group(("kernel",))), summary_limit)
    msum, omitted["memcpys"] = _summaries(_summarise(group(("gpu_memcpy",))), summary_limit)
    ssum, omitted["memsets"] = _summaries(_summarise(group(("gpu_memset",))), summary_limit)
    asum, omitted["api"] = _summaries(_summarise(group(tuple(sorted(API_CATS)))), summary_limit)
    csum, omitted["cpu_ops"] = _summaries(_summarise(group(tuple(sorted(CPU_CATS)))), summary_limit)
    window = scan["window"]
    head = scan["head"]
    devices = _devices(head)
    seen = ReportIdentity(
        gpu_name="; ".join(sorted({d.name for d in devices if d.name})) or None,
        compute_capability="; ".join(sorted({d.compute_capability for d in devices if d.compute_capability}))
        or None,
    )
    base = head.get("baseTimeNanoseconds")
    cupti = head.get("cupti_version")
    return TorchTraceFacts(
        report_sha256=digest,
        report_bytes=size,
        tool="torch.profiler",
        tool_version=tool_version,
        tool_version_source="argument" if tool_version else None,
        parser=PARSER,
        parser_version=PARSER_VERSION,
        dialect=DIALECT,
        bound_to=bound_to,
        report_identity=seen,
        identity_mismatch=identity_mismatches(bound_to, seen),
        schema_version=int(head["schemaVersion"]),
        cuda_runtime_version=_cuda_version(head.get("cuda_runtime_version")),
        cuda_driver_version=_cuda_version(head.get("cuda_driver_version")),
        cupti_version=_int_or_none(cupti),
        base_time_ns=_int_or_none(base),
        devices=devices,
        events=scan["events"],
        counts=scan["counts"],
        unmodeled_categories=scan["other"],
        window_start_ns=window[0] if window else None,
        window_end_ns=window[1] if window else None,
        gpu_events=scan["gpu_total"],
        gpu_events_correlated=scan["correlated"],
        kernel_summary=ksum,
        memcpy_summary=msum,
        memset_summary=ssum,
        api_summary=asum,
        cpu_op_summary=csum,
        gpu=_GPU_EVENTS.validate_python(gpu_out),  # one call for the list: ~25% less than one each
        gpu_omitted=scan["gpu_total"] - len(gpu_out),
        summary_limit=summary_limit,
        summaries_omitted=omitted,
    )
