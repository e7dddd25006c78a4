"""Execution map: coverage, overlap, idle gaps and the removable-time bound from timed intervals.

An interval is (lane, name, start_ns, end_ns): a lane is where work happens ("cpu",
"gpu:stream7", "copy"...). Inside the measured window (given, or first start to last end):

* coverage per lane and for the union of all lanes (busy time / window);
* overlap between every pair of lanes, and the time at least two lanes are busy;
* idle gaps of the union (the largest, with their count and total), and each lane's largest;
* for a named set of intervals (selected by exact name, substring, regex and lane), the upper
  bound of end-to-end time removable if they vanished: the time in the window when only
  selected intervals are active. Amdahl, respecting overlap: time a selected interval shares
  with any unselected one removes nothing, and overlapping selected intervals count once.

Converters turn parsed reports into intervals: nsys exports (kernels, memcpys, memsets, runtime
API calls, optionally NVTX ranges) and PyTorch traces (kernels, memcpys, memsets, runtime and
driver calls, CPU ops, optionally annotations). Nsight Compute reports have no timeline (each
kernel is replayed in isolation), so there is no ncu converter: asking for one is refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .common import Facts, FactSet, Refusal, no_gc

PARSER = "operations.evidence.execution_map"
PARSER_VERSION = "1"
MAX_INTERVALS = 10_000_000
MAX_LANE_PAIRS = 2000


@dataclass(frozen=True, slots=True)
class Interval:
    lane: str
    name: str
    start_ns: int
    end_ns: int


# ---------------------------------------------------------------------------------------------
# Requests


class _Req(BaseModel):
    model_config = ConfigDict(extra="forbid")


class IntervalIn(_Req):
    lane: str = Field(min_length=1, max_length=200)
    name: str = Field(max_length=10000)
    start_ns: int
    end_ns: int

    @model_validator(mode="after")
    def _ordered(self) -> IntervalIn:
        if self.end_ns < self.start_ns:
            raise ValueError("end_ns is before start_ns")
        return self


class Selector(_Req):
    """Intervals selected by name (exact, substring or regex) and, optionally, lane."""

    label: str = Field(min_length=1, max_length=200)
    names: list[str] = Field(default_factory=list)
    contains: list[str] = Field(default_factory=list)
    regex: str | None = Field(default=None, max_length=500)
    lanes: list[str] | None = None  # exact lane names, or prefixes ending in ':' / '*'

    @model_validator(mode="after")
    def _some(self) -> Selector:
        if not (self.names or self.contains or self.regex):
            raise ValueError("a selector needs names, contains or regex")
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise ValueError(f"regex does not compile: {exc}") from exc
        return self


class Window(_Req):
    start_ns: int
    end_ns: int

    @model_validator(mode="after")
    def _ordered(self) -> Window:
        if self.end_ns <= self.start_ns:
            raise ValueError("window end_ns must be after start_ns")
        return self


class Source(_Req):
    kind: Literal["nsys", "torch", "ncu"]
    report: str
    include: list[str] | None = None  # categories; None: the converter's defaults


class ExecutionMapRequest(_Req):
    intervals: list[IntervalIn] | None = None
    source: Source | None = None
    window: Window | None = None
    exclude: list[Selector] = Field(default_factory=list)  # dropped before anything is computed
    remove: list[Selector] = Field(default_factory=list)
    max_gaps: int = Field(default=10, ge=0, le=10000)

    @model_validator(mode="after")
    def _one_input(self) -> ExecutionMapRequest:
        if (self.intervals is None) == (self.source is None):
            raise ValueError("give exactly one of intervals or source")
        return self


# ---------------------------------------------------------------------------------------------
# Facts


class Gap(Facts):
    start_ns: int
    end_ns: int
    duration_ns: int


class LaneCoverage(Facts):
    lane: str
    intervals: int
    busy_ns: int
    coverage: float
    idle_ns: int
    largest_gaps: list[Gap]


class LaneOverlap(Facts):
    lanes: list[str]
    overlap_ns: int
    fraction_of_window: float


class Removable(Facts):
    label: str
    matched_intervals: int
    selected_total_ns: int  # sum of the selected intervals' clipped durations
    selected_union_ns: int  # time at least one selected interval is active
    overlapped_by_other_ns: int  # of that, time some unselected interval is also active
    removable_ns: int  # time only selected intervals are active: the upper bound
    removable_fraction: float  # of the window
    end_to_end_lower_bound_ns: int  # window minus removable


class ExecutionMapFacts(FactSet):
    kind: Literal["execution_map"] = "execution_map"
    source_kind: str
    window_start_ns: int
    window_end_ns: int
    window_ns: int
    window_given: bool
    intervals: int
    intervals_excluded: int
    intervals_outside_window: int
    lanes: list[LaneCoverage]
    union_busy_ns: int
    union_coverage: float
    concurrent_ns: int  # time at least two lanes are busy
    overlaps: list[LaneOverlap]
    overlaps_omitted: int
    idle_total_ns: int
    idle_gaps: int
    largest_idle_gaps: list[Gap]
    removable: list[Removable]


# ---------------------------------------------------------------------------------------------
# Interval arithmetic (sorted, disjoint lists of [start, end))


def merge(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in sorted(spans):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def total(spans: Sequence[tuple[int, int]]) -> int:
    return sum(e - s for s, e in spans)


def intersect(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        s = max(a[i][0], b[j][0])
        e = min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """a minus b, both merged."""
    out = []
    j = 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            if cur >= e:
                break
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def gaps(spans: Sequence[tuple[int, int]], w0: int, w1: int) -> list[tuple[int, int]]:
    out = []
    cur = w0
    for s, e in spans:
        if s > cur:
            out.append((cur, s))
        cur = max(cur, e)
    if cur < w1:
        out.append((cur, w1))
    return out


def _largest(gs: list[tuple[int, int]], k: int) -> list[Gap]:
    top = sorted(gs, key=lambda g: (g[0] - g[1], g[0]))[:k]
    return [Gap(start_ns=s, end_ns=e, duration_ns=e - s) for s, e in top]


def _concurrent(lane_spans: dict[str, list[tuple[int, int]]]) -> int:
    edges: list[tuple[int, int]] = []
    for spans in lane_spans.values():
        for s, e in spans:
            edges.append((s, 1))
            edges.append((e, -1))
    edges.sort()
    depth = 0
    prev = 0
    out = 0
    for t, d in edges:
        if depth >= 2:
            out += t - prev
        depth += d
        prev = t
    return out


# ---------------------------------------------------------------------------------------------
# Selection


class _Matcher:
    def __init__(self, sel: Selector) -> None:
        self.names = set(sel.names)
        self.contains = tuple(sel.contains)
        self.regex = re.compile(sel.regex) if sel.regex else None
        lanes = sel.lanes
        self.lanes_exact = {lane for lane in lanes or [] if not lane.endswith(("*", ":"))}
        self.lanes_prefix = tuple(lane.rstrip("*") for lane in lanes or [] if lane.endswith(("*", ":")))
        self.any_lane = lanes is None
        self.cache: dict[str, bool] = {}

    def lane_ok(self, lane: str) -> bool:
        return self.any_lane or lane in self.lanes_exact or lane.startswith(self.lanes_prefix)

    def name_ok(self, name: str) -> bool:
        hit = self.cache.get(name)
        if hit is None:
            hit = (
                name in self.names
                or any(c in name for c in self.contains)
                or (self.regex is not None and self.regex.search(name) is not None)
            )
            if len(self.cache) < 100000:
                self.cache[name] = hit
        return hit

    def __call__(self, iv: Interval) -> bool:
        return self.lane_ok(iv.lane) and self.name_ok(iv.name)


# ---------------------------------------------------------------------------------------------
# The map


def execution_map(
    intervals: Sequence[Interval],
    *,
    window: tuple[int, int] | None = None,
    exclude: Sequence[Selector] = (),
    remove: Sequence[Selector] = (),
    max_gaps: int = 10,
    report: dict[str, Any],
) -> ExecutionMapFacts:
    """Compute the map. `report` gives the FactSet fields (sha256, tool, ...) of the input."""
    if len(intervals) > MAX_INTERVALS:
        raise Refusal("too_large", f"{len(intervals)} intervals; at most {MAX_INTERVALS}", field="intervals")
    excluders = [_Matcher(s) for s in exclude]
    kept = [iv for iv in intervals if not any(m(iv) for m in excluders)] if excluders else list(intervals)
    w0, w1 = _window(kept, window)
    wlen = w1 - w0
    clipped, outside = _clip(kept, w0, w1)
    lane_spans, counts = _lane_spans(clipped)
    union = merge(sp for spans in lane_spans.values() for sp in spans)
    ubusy = total(union)
    overlaps, omitted = _overlaps(lane_spans, wlen)
    idle = gaps(union, w0, w1)
    return ExecutionMapFacts(
        **report,
        window_start_ns=w0,
        window_end_ns=w1,
        window_ns=wlen,
        window_given=window is not None,
        intervals=len(clipped),
        intervals_excluded=len(intervals) - len(kept),
        intervals_outside_window=outside,
        lanes=[
            _coverage(lane, lane_spans[lane], counts[lane], w0, w1, max_gaps) for lane in sorted(lane_spans)
        ],
        union_busy_ns=ubusy,
        union_coverage=ubusy / wlen,
        concurrent_ns=_concurrent(lane_spans),
        overlaps=overlaps,
        overlaps_omitted=omitted,
        idle_total_ns=total(idle),
        idle_gaps=len(idle),
        largest_idle_gaps=_largest(idle, max_gaps),
        removable=[_removable(sel, clipped, wlen) for sel in remove],
    )


def _window(kept: Sequence[Interval], window: tuple[int, int] | None) -> tuple[int, int]:
    """The window given, or the span of the kept intervals (refused when they span no time)."""
    if window is not None:
        return window
    if not kept:
        raise Refusal("empty", "no intervals (after exclusions) and no window", field="intervals")
    w0 = min(iv.start_ns for iv in kept)
    w1 = max(iv.end_ns for iv in kept)
    if w1 <= w0:
        raise Refusal("empty", "the intervals span no time", field="intervals")
    return w0, w1


def _clip(kept: Sequence[Interval], w0: int, w1: int) -> tuple[list[Interval], int]:
    """The intervals cut to the window, and how many fell wholly outside it."""
    clipped: list[Interval] = []
    outside = 0
    for iv in kept:
        s, e = max(iv.start_ns, w0), min(iv.end_ns, w1)
        if e <= s:
            outside += 1
            continue
        clipped.append(iv if (s, e) == (iv.start_ns, iv.end_ns) else Interval(iv.lane, iv.name, s, e))
    return clipped, outside


def _lane_spans(clipped: Sequence[Interval]) -> tuple[dict[str, list[tuple[int, int]]], dict[str, int]]:
    """Each lane's busy time as merged spans, and its interval count."""
    by_lane: dict[str, list[tuple[int, int]]] = {}
    counts: dict[str, int] = {}
    for iv in clipped:
        by_lane.setdefault(iv.lane, []).append((iv.start_ns, iv.end_ns))
        counts[iv.lane] = counts.get(iv.lane, 0) + 1
    return {lane: merge(sp) for lane, sp in by_lane.items()}, counts


def _coverage(
    lane: str, spans: list[tuple[int, int]], intervals: int, w0: int, w1: int, max_gaps: int
) -> LaneCoverage:
    busy = total(spans)
    return LaneCoverage(
        lane=lane,
        intervals=intervals,
        busy_ns=busy,
        coverage=busy / (w1 - w0),
        idle_ns=(w1 - w0) - busy,
        largest_gaps=_largest(gaps(spans, w0, w1), max_gaps),
    )


def _overlaps(lane_spans: dict[str, list[tuple[int, int]]], wlen: int) -> tuple[list[LaneOverlap], int]:
    """The lane pairs that overlap, largest first; at most MAX_LANE_PAIRS pairs are compared, the
    number left uncompared is returned beside them."""
    names = sorted(lane_spans)
    overlaps = []
    pairs = 0
    omitted = 0
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if pairs >= MAX_LANE_PAIRS:
                omitted += 1
                continue
            pairs += 1
            ov = total(intersect(lane_spans[a], lane_spans[b]))
            if ov:
                overlaps.append(LaneOverlap(lanes=[a, b], overlap_ns=ov, fraction_of_window=ov / wlen))
    overlaps.sort(key=lambda o: (-o.overlap_ns, o.lanes))
    return overlaps, omitted


def _removable(sel: Selector, clipped: Sequence[Interval], wlen: int) -> Removable:
    """What removing the selected intervals could save: the time only they occupy."""
    m = _Matcher(sel)
    chosen: list[tuple[int, int]] = []
    others: list[tuple[int, int]] = []
    for iv in clipped:
        (chosen if m(iv) else others).append((iv.start_ns, iv.end_ns))
    su = merge(chosen)
    ou = merge(others)
    only = subtract(su, ou)
    r = total(only)
    return Removable(
        label=sel.label,
        matched_intervals=len(chosen),
        selected_total_ns=sum(e - s for s, e in chosen),
        selected_union_ns=total(su),
        overlapped_by_other_ns=total(su) - r,
        removable_ns=r,
        removable_fraction=r / wlen,
        end_to_end_lower_bound_ns=wlen - r,
    )


# ---------------------------------------------------------------------------------------------
# Converters

NSYS_DEFAULT = ("kernel", "memcpy", "memset", "runtime")
NSYS_ALL = (*NSYS_DEFAULT, "nvtx")
TORCH_DEFAULT = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "cpu_op")
TORCH_ALL = (*TORCH_DEFAULT, "user_annotation", "python_function", "gpu_user_annotation")


def _gpu_lane(kind: str, device: Any, stream: Any) -> str:
    dev = "" if device in (0, None) else str(device)
    if kind == "copy":
        return f"copy{dev}" if stream is None else f"copy{dev}:stream{stream}"
    return f"gpu{dev}:stream{stream}"


def _include(
    include: Sequence[str] | None, default: Sequence[str], allowed: Sequence[str], what: str
) -> set[str]:
    chosen = set(default if include is None else include)
    bad = sorted(chosen - set(allowed))
    if bad:
        raise Refusal(
            "bad_request",
            f"{what} has no interval category {bad[0]!r} (known: {', '.join(allowed)})",
            field="include",
        )
    return chosen


def intervals_from_nsys(path: str | Path, include: Sequence[str] | None = None) -> list[Interval]:
    """Intervals from an nsys export: kernels and memsets on gpu:streamN, memcpys on copy:streamN,
    runtime API calls on cpu, NVTX ranges (optional) on nvtx."""
    from .nsys import MEMCPY_KINDS, open_export

    want = _include(include, NSYS_DEFAULT, NSYS_ALL, "an nsys export")
    db, *_rest, present, _absent = open_export(path)
    out: list[Interval] = []
    try:
        if "kernel" in want and "CUPTI_ACTIVITY_KIND_KERNEL" in present:
            for s, e, dev, stream, name in db.it(
                "SELECT k.start, k.end, k.deviceId, k.streamId, coalesce(d.value, '?') FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                "LEFT JOIN StringIds d ON d.id = k.demangledName"
            ):
                out.append(Interval(_gpu_lane("gpu", dev, stream), name, int(s), int(e)))
        if "memcpy" in want and "CUPTI_ACTIVITY_KIND_MEMCPY" in present:
            for s, e, dev, stream, kind in db.it(
                "SELECT start, end, deviceId, streamId, copyKind FROM CUPTI_ACTIVITY_KIND_MEMCPY"
            ):
                out.append(
                    Interval(
                        _gpu_lane("copy", dev, stream),
                        f"memcpy {MEMCPY_KINDS.get(kind, kind)}",
                        int(s),
                        int(e),
                    )
                )
        if "memset" in want and "CUPTI_ACTIVITY_KIND_MEMSET" in present:
            for s, e, dev, stream in db.it(
                "SELECT start, end, deviceId, streamId FROM CUPTI_ACTIVITY_KIND_MEMSET"
            ):
                out.append(Interval(_gpu_lane("gpu", dev, stream), "memset", int(s), int(e)))
        if "runtime" in want and "CUPTI_ACTIVITY_KIND_RUNTIME" in present:
            for s, e, name in db.it(
                "SELECT r.start, r.end, coalesce(s.value, '?') FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
                "LEFT JOIN StringIds s ON s.id = r.nameId"
            ):
                out.append(Interval("cpu", name, int(s), int(e)))
        if "nvtx" in want and "NVTX_EVENTS" in present:
            for s, e, text in db.it(
                "SELECT n.start, n.end, coalesce(n.text, s.value, '?') FROM NVTX_EVENTS n LEFT JOIN StringIds s "
                "ON s.id = n.textId WHERE n.eventType IN (59, 60) AND n.end IS NOT NULL"
            ):
                out.append(Interval("nvtx", text, int(s), int(e)))
    except (TypeError, ValueError):
        raise Refusal("bad_value", "an interval row has a non-integer start or end", field="report") from None
    finally:
        db.conn.close()
    return out


def intervals_from_torch(path: str | Path, include: Sequence[str] | None = None) -> list[Interval]:
    """Intervals from a PyTorch trace: kernels and memsets on gpu:streamN, memcpys on copy:streamN,
    runtime/driver calls and CPU ops on cpu, annotations (optional) on annotation lanes."""
    from .torch_trace import load_trace

    want = _include(include, TORCH_DEFAULT, TORCH_ALL, "a PyTorch trace")
    with no_gc():
        return _torch_intervals(load_trace(path), want)


def _torch_intervals(doc: dict[str, Any], want: set[str]) -> list[Interval]:
    out: list[Interval] = []
    for i, e in enumerate(doc["traceEvents"]):
        if type(e) is not dict or e.get("ph") != "X":
            continue
        cat = e.get("cat")
        if cat not in want:
            continue
        ts, dur, name = e.get("ts"), e.get("dur"), e.get("name")
        if (
            isinstance(ts, bool)
            or not isinstance(ts, int | float)
            or isinstance(dur, bool)
            or not isinstance(dur, int | float)
        ):
            raise Refusal(
                "missing_field", f"traceEvents[{i}] has no usable ts/dur", field=f"traceEvents[{i}]"
            )
        if dur < 0:
            raise Refusal("bad_value", f"traceEvents[{i}] has a negative dur", field=f"traceEvents[{i}].dur")
        s = round(ts * 1000)
        end = s + round(dur * 1000)
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        assert isinstance(args, dict)
        if cat in ("kernel", "gpu_memset"):
            lane = _gpu_lane("gpu", args.get("device"), args.get("stream"))
        elif cat == "gpu_memcpy":
            lane = _gpu_lane("copy", args.get("device"), args.get("stream"))
        elif cat == "gpu_user_annotation":
            lane = "gpu_annotation"
        elif cat in ("user_annotation", "python_function"):
            lane = "annotation" if cat == "user_annotation" else "python"
        else:
            lane = "cpu"
        out.append(Interval(lane, name if isinstance(name, str) else "?", s, end))
    return out


def intervals_from_request(items: Sequence[IntervalIn]) -> list[Interval]:
    return [Interval(i.lane, i.name, i.start_ns, i.end_ns) for i in items]


def intervals_from_source(src: Source, report_path: str | Path) -> list[Interval]:
    if src.kind == "ncu":
        raise Refusal(
            "no_timeline",
            "Nsight Compute replays each kernel in isolation: its report has no timeline to map (use nsys or torch)",
            field="source.kind",
        )
    if src.kind == "nsys":
        return intervals_from_nsys(report_path, src.include)
    return intervals_from_torch(report_path, src.include)
