"""What the container sees of its own stack: tool versions and visible GPUs.

Runs at the start of every invocation (operations.ops.run), so each Invocation's identity
includes the versions inside the pinned image, not the host's.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
from typing import Any

PACKAGES = (
    "numpy",
    "scipy",
    "pydantic",
    "torch",
    "triton",
    "cupy-cuda12x",
    "cupy-cuda13x",
    "jax",
    "nvidia-ml-py",
    # the CUDA runtime a wheel-based stack carries (torch's CUDA builds depend on these)
    "nvidia-cuda-runtime-cu12",
    "nvidia-cuda-runtime-cu13",
    "nvidia-cuda-runtime",
)
# What the probe looks for besides PACKAGES. Recorded as `probed`, so that a name missing from
# `tools` reads "looked for, not installed" rather than "never looked for" (cko audit --stack).
COMMANDS = ("python", "nvcc", "ncu", "nsys", "cuobjdump", "cuda_version_env")


def _version_of(cmd: list[str], pattern: str) -> str | None:
    exe = shutil.which(cmd[0])
    if not exe:
        return None
    try:
        out = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(pattern, out.stdout + out.stderr)
    return m.group(1) if m else None


def tool_versions() -> dict[str, str]:
    tools: dict[str, str | None] = {
        "python": platform.python_version(),
        "nvcc": _version_of(["nvcc", "--version"], r"release ([0-9.]+)"),
        "ncu": _version_of(["ncu", "--version"], r"Version ([0-9][0-9.]*)"),
        "nsys": _version_of(["nsys", "--version"], r"([0-9]{4}\.[0-9][0-9.]*)"),
        "cuobjdump": _version_of(["cuobjdump", "--version"], r"release ([0-9.]+)"),
        # NVIDIA's CUDA base images name their toolkit/runtime here; absent in cko's own CPU images
        "cuda_version_env": os.environ.get("CUDA_VERSION"),
    }
    for pkg in PACKAGES:
        try:
            tools[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {k: v for k, v in tools.items() if v}


def probed() -> list[str]:
    """Every tool and package name `tool_versions` looks for, found or not."""
    return sorted({*COMMANDS, *PACKAGES})


def visible_gpus() -> dict[str, Any]:
    """GPUs this container can see, by UUID (NVML inside the container)."""
    try:
        import pynvml
    except ImportError:
        return {"ok": False, "reason": "pynvml missing", "uuids": []}
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no driver library mounted: no GPU visible
        return {"ok": True, "uuids": [], "reason": f"NVML not usable: {exc}"}
    try:
        uuids = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            u = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            uuids.append(u.decode() if isinstance(u, bytes) else str(u))
        drv = pynvml.nvmlSystemGetDriverVersion()
        return {
            "ok": True,
            "uuids": uuids,
            "driver_version": drv.decode() if isinstance(drv, bytes) else str(drv),
        }
    finally:
        pynvml.nvmlShutdown()


def check_granted(granted: list[str], seen: list[str]) -> str | None:
    """A reason if the visible GPUs are not exactly the granted ones."""
    if sorted(granted) != sorted(seen):
        extra = sorted(set(seen) - set(granted))
        missing = sorted(set(granted) - set(seen))
        parts = []
        if extra:
            parts.append(f"visible but not granted: {', '.join(extra)}")
        if missing:
            parts.append(f"granted but not visible: {', '.join(missing)}")
        return "GPU visibility mismatch: " + "; ".join(parts)
    return None


def probe() -> dict[str, Any]:
    gpus = visible_gpus()
    return {
        "tools": tool_versions(),
        "probed": probed(),
        "gpus": gpus,
        "uid": os.getuid(),
        "gid": os.getgid(),
        "kernel": platform.release(),
        "env_nvidia_visible_devices": os.environ.get("NVIDIA_VISIBLE_DEVICES"),
    }
