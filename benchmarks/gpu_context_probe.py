"""How long a one-element add plus synchronise takes in one process while another process holds a
CUDA context on the same device: alone, beside an idle context, beside a stopped (SIGSTOP) one, and
beside one that is busy. The supervisor's idle probe and the worker's window both depend on it.

    python benchmarks/gpu_context_probe.py      # on a GPU host
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import threading
import time

CHILD = """
import sys, time, torch
mode = sys.argv[1]
if mode == "initonly":
    torch.cuda.is_available()  # cuInit, no context: what a worker has done when it says hello
else:
    x = torch.zeros(1 << 20, device="cuda"); torch.cuda.synchronize()
print("ready", flush=True)
if mode == "busy":
    while True:
        torch.cuda._sleep(1_000_000); torch.cuda.synchronize()
time.sleep(3600)
"""


def probe_ms(n: int = 200) -> tuple[float, float]:
    import torch

    x = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        x.add_(1)
        torch.cuda.synchronize()
        ts.append((time.perf_counter_ns() - t0) / 1e6)
    ts.sort()
    return statistics.median(ts), ts[int(0.98 * (n - 1))]


def beside(mode: str) -> tuple[float, float]:
    child = {"busy": "busy", "init-only stopped": "initonly", "init-only frozen": "initonly"}.get(
        mode, "idle"
    )
    p = subprocess.Popen([sys.executable, "-c", CHILD, child], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    if mode.endswith("stopped"):
        os.kill(p.pid, signal.SIGSTOP)
    if mode.endswith("frozen"):  # cgroup v2 freezer, as cko's host controller freezes a worker
        cg = f"/sys/fs/cgroup/cko-probe-{p.pid}"
        os.mkdir(cg)
        with open(f"{cg}/cgroup.procs", "w") as f:
            f.write(str(p.pid))
        with open(f"{cg}/cgroup.freeze", "w") as f:
            f.write("1")
    time.sleep(0.2)
    try:
        return probe_ms()
    finally:
        if mode.endswith("frozen"):
            with open(f"/sys/fs/cgroup/cko-probe-{p.pid}/cgroup.freeze", "w") as f:
                f.write("0")
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        if mode.endswith("frozen"):
            os.rmdir(f"/sys/fs/cgroup/cko-probe-{p.pid}")


def main() -> None:
    rows = [("alone", probe_ms())]
    modes = ["idle", "stopped", "busy", "init-only stopped"]
    if (
        os.geteuid() == 0
        and os.path.exists("/sys/fs/cgroup/cgroup.freeze") is False
        and os.path.exists("/sys/fs/cgroup/cgroup.subtree_control")
    ):
        modes += ["frozen", "init-only frozen"]
    for mode in modes:
        rows.append((f"beside a {mode} process", beside(mode)))
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    rows.append(("alone, NVML open in-process", probe_ms()))
    stop = threading.Event()

    def poll() -> None:  # what cko's host sampler does every 100 ms
        while not stop.wait(0.1):
            pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            pynvml.nvmlDeviceGetUtilizationRates(h)
            pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    rows.append(("alone, NVML polled at 10 Hz", probe_ms()))
    stop.set()
    print(f"{'add_(1) + synchronize':<32}{'p50 ms':>10}{'p98 ms':>10}")
    for name, (p50, p98) in rows:
        print(f"{name:<32}{p50:>10.3f}{p98:>10.3f}")


if __name__ == "__main__":
    main()
