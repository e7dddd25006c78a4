"""`cko doctor`: what works, what blocks, and the cheapest next step for each blocker."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from . import gpu as gpumod
from . import images as img
from . import ledger, sandbox
from . import policy as pol
from .errors import CkoError


def profiler_permission() -> dict[str, Any]:
    """Can a non-admin read GPU performance counters? (NVreg_RestrictProfilingToAdminUsers)."""
    params = Path("/proc/driver/nvidia/params")
    if not params.exists():
        return {"readable": None, "reason": "no NVIDIA driver parameters on this host"}
    for line in params.read_text().splitlines():
        if line.startswith("RmProfilingAdminOnly"):
            admin_only = line.split(":", 1)[1].strip() == "1"
            if admin_only:
                return {
                    "readable": False,
                    "admin_only": True,
                    "reason": "counters restricted to admin users (RmProfilingAdminOnly: 1)",
                    "next_step": "load nvidia with NVreg_RestrictProfilingToAdminUsers=0 (cko never adds a "
                    "capability: `profile ncu --collect` is refused until then)",
                }
            return {"readable": True, "admin_only": False}
    return {"readable": None, "reason": "RmProfilingAdminOnly not reported by the driver"}


def policy_report() -> dict[str, Any]:
    """The policy that always applies here (system, narrowed by $CKO_POLICY), its sources, its limits."""
    try:
        lp = pol.load(None)
    except CkoError as err:
        return {"error": err.message, "code": err.code}
    p = lp.policy
    limits = pol.admit_limits(p, None, None, None, None)
    key_file, head_dir = ledger.key_source()
    return {
        "system_policy": lp.system_path or f"none ({pol.SYSTEM_POLICY} absent: built-in defaults)",
        "system_policy_sha256": lp.system_sha256,
        "caller_policy": lp.caller_path,
        "mount_roots": p.mount_roots,
        "allowed_images": p.allowed_images,
        "allowed_gpus": p.allowed_gpus,
        "max_timeout_s": p.max_timeout_s,
        "default_limits": limits.model_dump(),
        "max_limits": {
            "memory": p.max_memory,
            "pids": p.max_pids,
            "cpus": p.max_cpus or pol.host_cpus(),
            "tmpfs": p.max_tmpfs,
            "output": p.max_output,
            "output_files": p.max_output_files,
            "log": p.max_log,
        },
        "ledger_key": key_file or "none (ledger detects damage, not forgery)",
        "ledger_head_dir": head_dir,
        "output_area": "size-limited tmpfs" if os.geteuid() == 0 else "plain directory (not root)",
    }


def diagnose() -> dict[str, Any]:
    report: dict[str, Any] = {"blockers": [], "ok": []}
    blockers: list[dict[str, str]] = report["blockers"]
    try:
        client = img.docker_client()
        info = client.info()
        ver = client.version()
        report["engine"] = {
            "reachable": True,
            "version": ver.get("Version"),
            "api_version": ver.get("ApiVersion"),
            "runtimes": sorted((info.get("Runtimes") or {}).keys()),
            "default_runtime": info.get("DefaultRuntime"),
            "cgroup_version": info.get("CgroupVersion"),
            "storage_driver": info.get("Driver"),
        }
        report["ok"].append("engine")
    except CkoError as err:
        client, info = None, None
        report["engine"] = {"reachable": False, "reason": err.message}
        blockers.append(
            {
                "what": "engine",
                "reason": err.message,
                "next_step": "apt-get install docker.io; setsid dockerd --bridge=none --iptables=false "
                "--ip6tables=false &  (or `make engine`)",
            }
        )
    try:
        rows = img.image_status(client)
    except CkoError as err:
        rows = []
        blockers.append({"what": "images.lock", "reason": err.message, "next_step": "cko images build cpu"})
    report["images"] = rows
    for r in rows:
        if r["name"] == "cpu" and not (r.get("present") and not r.get("stale")):
            why = "not built" if not r.get("locked") else ("stale" if r.get("stale") else "not in the engine")
            blockers.append({"what": "image cpu", "reason": why, "next_step": "cko images build cpu"})
    hg = gpumod.host_gpus()
    report["gpu"] = {
        "available": hg.available,
        "reason": hg.reason,
        "driver_version": hg.driver_version,
        "cuda_driver_version": hg.cuda_driver_version,
        "devices": [d.model_dump(mode="json") for d in hg.devices],
    }
    if not hg.available:
        report["gpu"]["note"] = (
            "no GPU on this host: CPU operations (parsing, statistics, CPU workloads) still work"
        )
    checks = gpumod.check_modes(info, hg)
    report["passthrough"] = [
        {"mode": c.mode, "usable": c.usable, "reason": c.reason, "next_step": c.next_step} for c in checks
    ]
    report["passthrough_default"] = gpumod.pick_mode(checks)
    if hg.available:
        cuda = next((r for r in rows if r["name"] == "cuda"), None)
        if not (cuda and cuda.get("present")):
            blockers.append(
                {
                    "what": "image cuda",
                    "reason": "not built",
                    "next_step": "cko images build cuda --base-image ID (tests/gpu/prepare.sh and build_cuda_base.sh on a GPU host)",
                }
            )
        report["profiler"] = profiler_permission()
    else:
        report["profiler"] = {"readable": None, "reason": "no GPU"}
    report["policy"] = policy_report()
    if report["policy"].get("error"):
        blockers.append(
            {
                "what": "system policy",
                "reason": report["policy"]["error"],
                "next_step": "chown root:root and chmod 644 the system policy (and its directory 755)",
            }
        )
    if client is not None:
        report["expired_containers_removed"] = sandbox.reap_expired(client)
    report["tools"] = {
        t: bool(shutil.which(t)) for t in ("debootstrap", "docker", "nvidia-smi", "ncu", "nvcc")
    }
    report["euid"] = os.geteuid()
    report["ready"] = not blockers
    return report
