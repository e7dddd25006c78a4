"""GPU discovery on the host (pynvml) and passthrough modes (DESIGN.md, GPU passthrough).

Modes: `nvidia` (Docker device request; needs nvidia-container-toolkit), `cdi` (CDI device names;
needs an engine with CDI and a spec), `devices` (no toolkit: pass /dev/nvidia* nodes and bind
the driver's user-space libraries read-only), `none`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .identity import DeviceIdentity

MODES = ("nvidia", "cdi", "devices", "none")
# Driver libraries a CUDA program needs from the host, by soname (facts/machines.md).
DRIVER_LIBS = (
    "libcuda.so.1",
    "libnvidia-ml.so.1",
    "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-nvvm.so.4",
    "libnvidia-gpucomp.so",
    "libcudadebugger.so.1",
)
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
IN_CONTAINER_LIB = "/opt/cko/driver/lib"
IN_CONTAINER_BIN = "/opt/cko/driver/bin"


@dataclass
class HostGpus:
    available: bool
    reason: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    devices: list[DeviceIdentity] = field(default_factory=list)
    minors: dict[str, int] = field(default_factory=dict)


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def host_gpus() -> HostGpus:
    """Driver and devices via pynvml; on a host with no GPU, says so."""
    try:
        import pynvml
    except ImportError:
        return HostGpus(False, "pynvml (nvidia-ml-py) is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return HostGpus(False, f"NVML not usable: {exc} (no NVIDIA driver on this host)")
    try:
        out = HostGpus(True)
        out.driver_version = _s(pynvml.nvmlSystemGetDriverVersion())
        cv = pynvml.nvmlSystemGetCudaDriverVersion()
        out.cuda_driver_version = f"{cv // 1000}.{(cv % 1000) // 10}"
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)

            def opt(fn: Any, *a: Any) -> Any:
                try:
                    return fn(*a)
                except pynvml.NVMLError:
                    return None

            mig = opt(pynvml.nvmlDeviceGetMigMode, h)
            ecc = opt(pynvml.nvmlDeviceGetEccMode, h)
            power = opt(pynvml.nvmlDeviceGetPowerManagementLimit, h)
            uuid = _s(pynvml.nvmlDeviceGetUUID(h))
            out.devices.append(
                DeviceIdentity(
                    index=i,
                    uuid=uuid,
                    name=_s(pynvml.nvmlDeviceGetName(h)),
                    compute_capability=f"{major}.{minor}",
                    memory_total_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                    mig_mode=None if mig is None else ("enabled" if mig[0] else "disabled"),
                    ecc_mode=None if ecc is None else ("enabled" if ecc[0] else "disabled"),
                    power_limit_w=None if power is None else power / 1000.0,
                    max_sm_clock_mhz=opt(pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_SM),
                    max_mem_clock_mhz=opt(pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_MEM),
                    pci_bus_id=_s(pynvml.nvmlDeviceGetPciInfo(h).busId),
                )
            )
            m = opt(pynvml.nvmlDeviceGetMinorNumber, h)
            if m is not None:
                out.minors[uuid] = int(m)
        return out
    finally:
        pynvml.nvmlShutdown()


def driver_libraries() -> dict[str, str]:
    """soname -> real host path, from `ldconfig -p` (and /usr/local/nvidia/lib64 as a fallback)."""
    found: dict[str, str] = {}
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        text = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        text = ""
    for line in text.splitlines():
        line = line.strip()
        if "=>" not in line:
            continue
        name = line.split()[0]
        path = line.split("=>", 1)[1].strip()
        if "x86-64" not in line and "64bit" not in line and "x86_64" not in line and "AArch64" not in line:
            continue
        for lib in DRIVER_LIBS:
            if (name == lib or (lib.endswith(".so") and name.startswith(lib))) and lib not in found:
                found[lib] = str(Path(path).resolve())
    for d in ("/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu"):
        for lib in DRIVER_LIBS:
            p = Path(d) / lib
            if lib not in found and p.exists():
                found[lib] = str(p.resolve())
    return found


def nvidia_smi() -> str | None:
    p = shutil.which("nvidia-smi")
    return str(Path(p).resolve()) if p else None


@dataclass
class ModeCheck:
    mode: str
    usable: bool
    reason: str | None = None
    next_step: str | None = None


def check_modes(engine_info: dict[str, Any] | None, gpus: HostGpus) -> list[ModeCheck]:
    out = []
    runtimes = (engine_info or {}).get("Runtimes") or {}
    if not gpus.available:
        why = gpus.reason or "no GPU"
        out.append(ModeCheck("nvidia", False, why, "run on a host with an NVIDIA GPU and driver"))
        out.append(ModeCheck("cdi", False, why, "run on a host with an NVIDIA GPU and driver"))
        out.append(ModeCheck("devices", False, why, "run on a host with an NVIDIA GPU and driver"))
    else:
        if "nvidia" in runtimes or shutil.which("nvidia-container-cli"):
            out.append(ModeCheck("nvidia", True))
        else:
            out.append(
                ModeCheck(
                    "nvidia",
                    False,
                    "nvidia-container-toolkit not installed (no nvidia runtime)",
                    "install nvidia-container-toolkit, or use --gpu-mode devices",
                )
            )
        specs = [p for d in ("/etc/cdi", "/var/run/cdi") for p in Path(d).glob("*nvidia*")]
        version = str((engine_info or {}).get("ServerVersion", "0"))
        major = int(version.split(".")[0]) if version.split(".")[0].isdigit() else 0
        if specs and major >= 25:
            out.append(ModeCheck("cdi", True))
        else:
            out.append(
                ModeCheck(
                    "cdi",
                    False,
                    "no CDI spec for nvidia" if not specs else f"engine {version} has no CDI support",
                    "nvidia-ctk cdi generate, with Docker >= 25; or use --gpu-mode devices",
                )
            )
        libs = driver_libraries()
        missing_nodes = [n for n in ("/dev/nvidiactl",) if not os.path.exists(n)]
        if "libcuda.so.1" not in libs or missing_nodes:
            out.append(
                ModeCheck(
                    "devices",
                    False,
                    f"missing {'libcuda.so.1' if 'libcuda.so.1' not in libs else missing_nodes[0]}",
                    "check the driver installation (ldconfig -p | grep libcuda)",
                )
            )
        else:
            out.append(ModeCheck("devices", True))
    out.append(ModeCheck("none", True))
    return out


def pick_mode(checks: list[ModeCheck]) -> str:
    for preferred in ("nvidia", "cdi", "devices"):
        if any(c.mode == preferred and c.usable for c in checks):
            return preferred
    return "none"


@dataclass
class GpuGrant:
    """What a container gets for the GPUs it was granted."""

    mode: str
    uuids: list[str]
    devices: list[str] = field(default_factory=list)  # host:container:perm
    binds: list[tuple[str, str]] = field(default_factory=list)  # host path, container path (ro)
    device_requests: list[Any] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


def grant(mode: str, uuids: list[str], gpus: HostGpus) -> GpuGrant:
    g = GpuGrant(mode=mode, uuids=list(uuids))
    # Never let an image's NVIDIA_VISIBLE_DEVICES=all widen the grant (a toolkit hook reads it).
    g.env["NVIDIA_VISIBLE_DEVICES"] = ",".join(uuids) if uuids else "void"
    g.env["CKO_GRANTED_GPUS"] = ",".join(uuids)
    if not uuids or mode == "none":
        g.env["CUDA_VISIBLE_DEVICES"] = ""
        return g
    if mode == "nvidia":
        import docker

        g.device_requests.append(
            docker.types.DeviceRequest(
                driver="nvidia", device_ids=list(uuids), capabilities=[["gpu", "compute", "utility"]]
            )
        )
    elif mode == "cdi":
        import docker

        g.device_requests.append(
            docker.types.DeviceRequest(driver="cdi", device_ids=[f"nvidia.com/gpu={u}" for u in uuids])
        )
    elif mode == "devices":
        for node in CONTROL_NODES:
            if os.path.exists(node):
                g.devices.append(f"{node}:{node}:rwm")
        for u in uuids:
            minor = gpus.minors.get(u)
            if minor is None:
                raise ValueError(f"no device node known for {u}")
            g.devices.append(f"/dev/nvidia{minor}:/dev/nvidia{minor}:rwm")
        for soname, path in driver_libraries().items():
            # Under the soname and under the real file name: a library that another opens by its
            # versioned name (libnvidia-ptxjitcompiler asks for libnvidia-gpucomp.so.<driver>) finds it.
            for name in dict.fromkeys((soname, Path(path).name)):
                g.binds.append((path, f"{IN_CONTAINER_LIB}/{name}"))
        smi = nvidia_smi()
        if smi:
            g.binds.append((smi, f"{IN_CONTAINER_BIN}/nvidia-smi"))
        g.env["LD_LIBRARY_PATH"] = IN_CONTAINER_LIB
        # Triton links its launcher against libcuda found here (the image's linker cache names none).
        g.env["TRITON_LIBCUDA_PATH"] = IN_CONTAINER_LIB
    else:
        raise ValueError(f"unknown GPU passthrough mode {mode}")
    return g
