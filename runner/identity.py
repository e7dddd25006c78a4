"""Environment identity (DESIGN.md): who ran what on which exact environment.

Captured for every invocation from three places: the engine (image id, digests, engine version,
runtime), pynvml on the host (driver, devices), and a probe inside the container (tool
versions). Frozen into a Target; `compare` says which fields that matter differ.
"""

from __future__ import annotations

import hashlib
import os
import platform
import socket
from typing import Any

from pydantic import Field

from .models import Closed


class ImageIdentity(Closed):
    name: str
    ref: str
    id: str
    repo_digests: list[str] = Field(default_factory=list)


class EngineIdentity(Closed):
    version: str
    runtime: str
    api_version: str | None = None
    cgroup_version: str | None = None


class DeviceIdentity(Closed):
    index: int
    uuid: str
    name: str
    compute_capability: str  # "9.0"
    memory_total_bytes: int
    mig_mode: str | None = None
    ecc_mode: str | None = None
    power_limit_w: float | None = None
    max_sm_clock_mhz: int | None = None
    max_mem_clock_mhz: int | None = None
    pci_bus_id: str | None = None


class HostIdentity(Closed):
    host_id: str
    kernel: str
    cpu_model: str
    cpu_count: int


class EnvironmentIdentity(Closed):
    image: ImageIdentity | None = None
    engine: EngineIdentity | None = None
    passthrough: str = "none"
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    devices: list[DeviceIdentity] = Field(default_factory=list)
    host: HostIdentity
    tools: dict[str, str] = Field(default_factory=dict)
    # The names the in-container probe looked for (operations/probe.py): one of them missing from
    # `tools` is not installed. None on identities recorded before the probe said so: then a
    # missing name cannot be told from one never looked for.
    probed: list[str] | None = None

    @property
    def arch(self) -> str | None:
        if not self.devices:
            return None
        return "sm_" + self.devices[0].compute_capability.replace(".", "")


# Fields whose difference makes two measurements incomparable, and why.
MATTERS: dict[str, str] = {
    "image.id": "different image: different tool code and libraries",
    "passthrough": "different GPU passthrough mode",
    "driver_version": "different driver",
    "devices.name": "different GPU model",
    "devices.compute_capability": "different architecture",
    "devices.mig_mode": "different MIG mode",
    "devices.power_limit_w": "different power limit",
    "devices.max_sm_clock_mhz": "different clock limits",
    "host.cpu_model": "different CPU",
    "tools": "different tool versions inside the container",
}


def _field_values(identity: EnvironmentIdentity, path: str) -> Any:
    if path.startswith("devices."):
        attr = path.split(".", 1)[1]
        return [getattr(d, attr) for d in identity.devices]
    obj: Any = identity
    for part in path.split("."):
        obj = getattr(obj, part, None) if obj is not None else None
    return obj


def compare(frozen: EnvironmentIdentity, seen: EnvironmentIdentity) -> list[dict[str, Any]]:
    """Differences that matter between a frozen identity and a new one (empty = comparable)."""
    out = []
    for path, why in MATTERS.items():
        a, b = _field_values(frozen, path), _field_values(seen, path)
        if a != b:
            out.append({"field": path, "frozen": a, "seen": b, "why": why})
    return out


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_identity() -> HostIdentity:
    try:
        machine_id = open("/etc/machine-id").read().strip()
    except OSError:
        machine_id = ""
    raw = machine_id or socket.gethostname()
    return HostIdentity(
        host_id=hashlib.sha256(raw.encode()).hexdigest()[:16],
        kernel=platform.release(),
        cpu_model=_cpu_model(),
        cpu_count=os.cpu_count() or 1,
    )
