"""From what the measuring path recorded to the typed load input of `decide` (verdicts.Telemetry).

The one place that knows where foreign load is recorded: per sample on each Series where the
measuring path records it (foreign CPU cores, foreign GPU contexts, throttle reasons, clocks, one
value per rep), else per invocation window in the host sampler's summary (runner/telemetry.py).
"""

from __future__ import annotations

import os
from typing import Any

from cko_perf.operations.protocol import DriverResult, Series

from .verdicts import SampleLoad, Telemetry, WindowLoad

PER_SAMPLE_FIELDS = ("foreign_cpu_cores", "foreign_gpu_contexts", "throttle")


def window_load(summary: dict[str, Any] | None) -> WindowLoad:
    s = summary or {}
    return WindowLoad(
        host_cpus=s.get("host_cpus"),
        foreign_cpu_cores_median=s.get("foreign_cores_median"),
        foreign_gpu_contexts=s.get("foreign_gpu_contexts"),
        throttled_share=s.get("throttled_share"),
        clock_note=s.get("clock_note"),
        sampler_note=s.get("note"),
    )


def _per_rep(s: Series, name: str) -> list[Any] | None:
    vals = getattr(s, name, None)  # recorded by measuring paths that time load per block
    return list(vals) if isinstance(vals, list) and len(vals) == len(s.reps) else None


def _sm_mhz(s: Series, i: int) -> float | None:
    if i < len(s.sm_mhz) and len(s.sm_mhz[i]) == 2 and s.sm_mhz[i][1]:
        return float(s.sm_mhz[i][1])  # type: ignore[arg-type]
    return None


def sample_loads(result: DriverResult | None) -> list[SampleLoad]:
    out: list[SampleLoad] = []
    for s in result.series if result is not None else []:
        cols = {n: _per_rep(s, n) for n in PER_SAMPLE_FIELDS}
        if not any(cols.values()) and not s.sm_mhz:
            continue
        for i, rep in enumerate(s.reps):
            cpu, ctx, thr = (cols[n][i] if cols[n] is not None else None for n in PER_SAMPLE_FIELDS)  # type: ignore[index]
            wall = s.bracket_ns[i] if len(s.bracket_ns) == len(s.reps) else None
            out.append(
                SampleLoad(
                    subject=s.subject,
                    case=s.case,
                    rep=rep,
                    foreign_cpu_cores=None if cpu is None else float(cpu),
                    wall_ns=wall,
                    foreign_gpu_contexts=None if ctx is None else int(ctx),
                    sm_mhz=_sm_mhz(s, i),
                    throttle=None if thr is None else list(thr),
                )
            )
    return out


def telemetry_input(summaries: list[dict[str, Any] | None], result: DriverResult | None) -> Telemetry:
    windows = [window_load(s) for s in summaries]
    cpus = next((w.host_cpus for w in windows if w.host_cpus), None) or os.cpu_count()
    return Telemetry(host_cpus=cpus, samples=sample_loads(result), windows=windows)
