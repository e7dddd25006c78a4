"""The supervisor's view of the GPU, from its own CUDA context and NVML: is the device idle (probes
before, during and after a worker's commands), the L2 evicted before a cold window, and per block
the SM clock, the compute contexts and the throttle reasons."""

from __future__ import annotations

import time

from .integrity import (
    BAD_THROTTLE,
    CALIBRATION_PAUSE_S,
    CALIBRATION_TRIES,
    LEFT_RUNNING_PROBES,
    calibration_busy,
)
from .timing import L2_FLUSH_BYTES, SmClock


class GpuProbe:
    """Is the device idle? A one-element add in the supervisor's own context, timed on the host.

    A kernel still running in another process's context (work a frozen worker left queued) delays it
    by a time slice; calibrated at start while every worker is frozen."""

    def __init__(self) -> None:
        """The supervisor's CUDA context: made while the workers load (it is most of the probe's cost)."""
        import torch

        self.torch = torch
        self.x = torch.zeros(1, device="cuda")
        self.scratch = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
        self.limit_ns = 0
        self.calibration: dict[str, int] = {}

    def calibrate(self) -> bool:
        """Only while every worker is frozen: the limit is the idle device's time, nothing else's.
        False when every try found the device busy (the limit is then left unset: see _start)."""
        for tries in range(1, CALIBRATION_TRIES + 1):
            samples = sorted(self.once() for _ in range(50))
            self.calibration = {"p50_ns": samples[25], "p98_ns": samples[48], "tries": tries}
            if not calibration_busy(samples[25]):
                self.limit_ns = 4 * samples[48] + 300_000
                return True
            time.sleep(CALIBRATION_PAUSE_S)  # work a subject's import left (a compile's kernel) may end
        return False

    def once(self) -> int:
        t0 = time.perf_counter_ns()
        self.x.add_(1)
        self.torch.cuda.synchronize()
        return time.perf_counter_ns() - t0

    def flush_l2(self) -> int:
        """Evict the device's L2 from this context (the L2 is the device's, shared by every context),
        between a cold block's staging and its window; its time in ns. Here and not in the worker:
        the worker's clock code runs in the subject's process, which could make its flush a no-op
        and time its window on a warm cache."""
        t0 = time.perf_counter_ns()
        self.scratch.zero_()
        self.torch.cuda.synchronize()
        return time.perf_counter_ns() - t0

    def busy(self) -> str:
        t = self.once()
        if t > self.limit_ns:
            return f"the device was busy before the window (idle probe took {t} ns, limit {self.limit_ns})"
        return ""

    def still_busy(self) -> str:
        """Busy on LEFT_RUNNING_PROBES probes in a row ("" when any one found it idle)."""
        times = []
        for _ in range(LEFT_RUNNING_PROBES):
            times.append(self.once())
            if times[-1] <= self.limit_ns:
                return ""
        return f"{len(times)} probes in a row took {min(times)}-{max(times)} ns (limit {self.limit_ns})"

    def busy_for(self, limit_s: float) -> float:
        """Seconds the device stays busy, probe after probe, up to `limit_s` (less: one found it idle)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < limit_s:
            if self.once() <= self.limit_ns:
                break
        return time.monotonic() - t0


class GpuWatch:
    """Probes the device while a worker runs an untimed command: compute it launches there (work
    deferred past its window) contends with the probe. A no-op without a probe (CPU stages)."""

    def __init__(self, probe: GpuProbe | None) -> None:
        self.probe = probe
        self.busy = ""
        self.probes = 0
        self.probe_ns = 0

    def poll(self) -> None:
        """One turn of a wait: a probe, or a short sleep where there is nothing to probe."""
        if self.probe is None:
            time.sleep(50e-6)
        else:
            self.once()

    def once(self) -> None:
        """One probe, until one has found the device busy."""
        if self.probe is not None and not self.busy:
            t0 = time.perf_counter_ns()
            self.busy = self.probe.busy()
            self.probe_ns += time.perf_counter_ns() - t0
            self.probes += 1


class Clocks(SmClock):
    """SM clock and compute contexts from NVML in the supervisor's container, read per block."""

    def contexts(self) -> int | None:
        """Compute contexts on the device (this stage's own included)."""
        if self.handle is None:
            return None
        try:
            return len(self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle))
        except Exception:
            return None

    def throttle(self) -> list[str] | None:
        if self.handle is None:
            return None
        try:
            reasons = int(self.nvml.nvmlDeviceGetCurrentClocksEventReasons(self.handle))
        except Exception:
            return None
        return [name for bit, name in BAD_THROTTLE.items() if reasons & bit]
