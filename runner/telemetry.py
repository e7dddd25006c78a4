"""Host-side telemetry during a measuring invocation (issue 5).

Every 100 ms: per used GPU (pynvml) SM and memory clocks, temperature, power, utilisation,
throttle reasons and compute processes that are not the invocation's own; on a host with no GPU,
CPU load from other processes. `summary` states the window's foreign load; the verdict
(runner/workflow/decide.py) holds it against the plan's declared ceiling and tests it for balance
between the arms. A shared host by itself voids nothing.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any

INTERVAL_S = 0.1
# Throttle reasons that mean the chip slowed for something other than our own load.
BAD_THROTTLE = {
    0x0000000000000008: "hw_slowdown",
    0x0000000000000020: "sw_thermal_slowdown",
    0x0000000000000040: "hw_thermal_slowdown",
    0x0000000000000080: "hw_power_brake_slowdown",
    0x0000000000000100: "display_clock_setting",
}
CLOCK_CHANGE_FRACTION = 0.10  # SM clock moving more than this inside the window is a clock change


def _cpu_times() -> tuple[float, float]:
    with open("/proc/stat") as f:
        parts = [float(x) for x in f.readline().split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0.0)
    return sum(parts), idle


def _self_cpu_ns() -> float:
    """CPU time of this controller process (all threads): ours, not foreign load."""
    t = os.times()
    return (t.user + t.system + t.children_user + t.children_system) * 1e9


def _containers_cpu_ns(short_ids: list[str]) -> float | None:
    """CPU time of all of an invocation's containers (a stage's supervisor and its workers)."""
    if not short_ids:
        return None
    vals = [_container_cpu_ns(c) for c in short_ids]
    return None if any(v is None for v in vals) else sum(v for v in vals if v is not None)


def _container_cpu_ns(short_id: str | None) -> float | None:
    if not short_id:
        return None
    for root in ("/sys/fs/cgroup/cpuacct/docker", "/sys/fs/cgroup/cpu,cpuacct/docker"):
        with contextlib.suppress(OSError):
            for name in os.listdir(root):
                if name.startswith(short_id):
                    return float(open(f"{root}/{name}/cpuacct.usage").read())
    for root in ("/sys/fs/cgroup/system.slice", "/sys/fs/cgroup/docker"):
        with contextlib.suppress(OSError):
            for name in os.listdir(root):
                if short_id in name:
                    for line in open(f"{root}/{name}/cpu.stat"):
                        if line.startswith("usage_usec"):
                            return float(line.split()[1]) * 1000.0
    return None


class Sampler:
    def __init__(self, uuids: list[str], interval_s: float = INTERVAL_S) -> None:
        self.uuids = uuids
        self.interval = interval_s
        self.samples: list[dict[str, Any]] = []
        self.container_ids: list[str] = []  # short ids of the invocation's own containers
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.error: str | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join(timeout=5)
        return {
            "interval_s": self.interval,
            "uuids": self.uuids,
            "samples": self.samples,
            "error": self.error,
            "summary": summarize(self.samples, bool(self.uuids), self.error),
        }

    def _ours(self, pid: int) -> bool:
        if not self.container_ids:
            return False
        try:
            cg = open(f"/proc/{pid}/cgroup").read()
            return any(c in cg for c in self.container_ids)
        except OSError:
            return False

    def _loop(self) -> None:
        if self.uuids:
            self._gpu_loop()
        else:
            self._cpu_loop()

    def _gpu_loop(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:
            self.error = f"NVML unavailable: {exc}"
            return
        try:
            handles = {u: pynvml.nvmlDeviceGetHandleByUUID(u) for u in self.uuids}
            while not self._stop.is_set():
                t = time.time()
                for u, h in handles.items():
                    s: dict[str, Any] = {"t": round(t, 3), "uuid": u}
                    with contextlib.suppress(pynvml.NVMLError):
                        s["sm_mhz"] = pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
                        s["mem_mhz"] = pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)
                    with contextlib.suppress(pynvml.NVMLError):
                        s["temp_c"] = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
                    with contextlib.suppress(pynvml.NVMLError):
                        s["power_w"] = pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0
                    with contextlib.suppress(pynvml.NVMLError):
                        ut = pynvml.nvmlDeviceGetUtilizationRates(h)
                        s["util_gpu"] = ut.gpu
                        s["util_mem"] = ut.memory
                    with contextlib.suppress(pynvml.NVMLError):
                        reasons = int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(h))
                        s["throttle"] = [n for bit, n in BAD_THROTTLE.items() if reasons & bit]
                    with contextlib.suppress(pynvml.NVMLError):
                        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
                        s["foreign_pids"] = [p.pid for p in procs if not self._ours(p.pid)]
                    self.samples.append(s)
                self._stop.wait(self.interval)
        finally:
            with contextlib.suppress(Exception):
                pynvml.nvmlShutdown()

    def _cpu_loop(self) -> None:
        ncpu = os.cpu_count() or 1
        prev = _cpu_times()
        prev_c = _containers_cpu_ns(self.container_ids)
        prev_s = _self_cpu_ns()
        prev_t = time.monotonic()
        while not self._stop.wait(self.interval):
            cur = _cpu_times()
            cur_c = _containers_cpu_ns(self.container_ids)
            cur_s = _self_cpu_ns()
            now = time.monotonic()
            dt_total = cur[0] - prev[0]
            busy_cores = ncpu * (1.0 - (cur[1] - prev[1]) / dt_total) if dt_total > 0 else 0.0
            ours = (
                (cur_c - prev_c + cur_s - prev_s) / 1e9 / (now - prev_t)
                if (cur_c is not None and prev_c is not None)
                else None
            )
            foreign = max(0.0, busy_cores - (ours or 0.0)) if ours is not None else None
            self.samples.append(
                {
                    "t": round(time.time(), 3),
                    "busy_cores": round(busy_cores, 3),
                    "ours_cores": None if ours is None else round(ours, 3),
                    "foreign_cores": None if foreign is None else round(foreign, 3),
                    "loadavg1": os.getloadavg()[0],
                }
            )
            prev, prev_c, prev_s, prev_t = cur, cur_c, cur_s, now


def summarize(samples: list[dict[str, Any]], gpu: bool, error: str | None) -> dict[str, Any]:
    """Facts about the window's foreign load; no verdict (decide.py applies the plan's ceiling)."""
    notes: list[str] = []
    if error:
        return {"reasons": [], "samples": 0, "note": error, "host_cpus": os.cpu_count()}
    if gpu:
        foreign = sorted({p for s in samples for p in s.get("foreign_pids", [])})
        if foreign:
            notes.append(f"foreign GPU processes during the window: pids {foreign[:10]}")
        throttled = [s for s in samples if s.get("throttle")]
        if throttled:
            kinds = sorted({k for s in throttled for k in s["throttle"]})
            notes.append(f"throttling in {len(throttled)}/{len(samples)} samples: {', '.join(kinds)}")
        clocks = [s["sm_mhz"] for s in samples if s.get("sm_mhz") and (s.get("util_gpu") or 0) > 0]
        clock_note = None
        if (
            len(clocks) >= 3
            and max(clocks) > 0
            and (max(clocks) - min(clocks)) / max(clocks) > CLOCK_CHANGE_FRACTION
        ):
            clock_note = f"SM clock changed while busy: {min(clocks)}..{max(clocks)} MHz"
            notes.append(clock_note)
        return {
            "reasons": notes,
            "samples": len(samples),
            "foreign_gpu_contexts": len(foreign),
            "throttled_share": len(throttled) / len(samples) if samples else None,
            "clock_note": clock_note,
            "sm_mhz_min": min(clocks) if clocks else None,
            "sm_mhz_max": max(clocks) if clocks else None,
        }
    foreign_vals = sorted(s["foreign_cores"] for s in samples if s.get("foreign_cores") is not None)
    return {
        "reasons": notes,
        "samples": len(samples),
        "host_cpus": os.cpu_count(),
        "foreign_cores_median": foreign_vals[len(foreign_vals) // 2] if foreign_vals else None,
        "foreign_cores_p90": foreign_vals[int(0.9 * (len(foreign_vals) - 1))] if foreign_vals else None,
    }
