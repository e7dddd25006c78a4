"""Ops policy (DESIGN.md): what an operator lets cko touch on this host.

A request outside the policy is refused before anything starts (exit 3). Some mounts are refused
whatever the policy says: the root, the engine's socket, kernel and device filesystems.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml
from pydantic import Field, ValidationError, field_validator

from .errors import CkoError, Exit, bad_request, refused
from .models import Closed

# Never mounted into a container, whatever the policy: they would hand it the host.
FORBIDDEN_EXACT = ("/", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/root", "/home", "/var", "/opt", "/tmp",
                   "/run", "/var/run", "/srv", "/mnt", "/media")
FORBIDDEN_UNDER = ("/proc", "/sys", "/dev", "/boot", "/etc", "/var/lib/docker", "/var/lib/containerd",
                   "/run/docker", "/run/containerd", "/var/run/docker", "/run/user")
MAX_TIMEOUT_S = 24 * 3600.0
_SIZE = re.compile(r"^([0-9]+)([kmg]?)$", re.IGNORECASE)


def parse_size(text: str | int, field: str) -> int:
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text).strip())
    if not m:
        raise bad_request(f"{field}: {text!r} is not a size like 512m or 4g", field=field)
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]
    return int(m.group(1)) * mult


class Policy(Closed):
    allowed_images: list[str] | None = Field(default=None, description="image ids (sha256:...) that may run")
    allowed_gpus: list[str] | None = Field(default=None, description="GPU UUIDs that may be granted")
    mount_roots: list[str] | None = Field(default=None, description="host directories under which mounts may lie")
    max_timeout_s: float = Field(default=6 * 3600.0, gt=0, le=MAX_TIMEOUT_S)
    max_memory: str = "16g"
    max_pids: int = Field(default=4096, ge=16)
    max_cpus: float | None = Field(default=None, gt=0)
    container_user: str | None = Field(default=None, description="uid:gid the container runs as")
    allow_profiler_counters: bool = False
    # Foreign-load ceilings of a verdict (issue 19): a policy can only lower a plan's declared ceiling
    max_foreign_cpu_share: float | None = Field(default=None, gt=0, le=1.0)
    max_foreign_gpu_contexts: int | None = Field(default=None, ge=0)

    @field_validator("container_user")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^[0-9]+(:[0-9]+)?$", v):
            raise ValueError("container_user must be uid or uid:gid (numbers)")
        if v is not None and v.split(":")[0] == "0":
            raise ValueError("container_user may not be root (0)")
        return v

    @property
    def max_memory_bytes(self) -> int:
        return parse_size(self.max_memory, "policy.max_memory")


def load_policy(path: str | Path | None) -> tuple[Policy, str | None]:
    """The policy from --policy / $CKO_POLICY, or the defaults. Returns (policy, its path)."""
    p = path or os.environ.get("CKO_POLICY")
    if not p:
        return Policy(), None
    try:
        data = yaml.safe_load(Path(p).read_text())
    except FileNotFoundError:
        raise bad_request(f"--policy: {p} does not exist", field="policy") from None
    except (OSError, yaml.YAMLError) as exc:
        raise bad_request(f"--policy: {p} is not readable YAML: {str(exc).splitlines()[0]}", field="policy") from None
    try:
        return Policy.model_validate(data or {}), str(p)
    except ValidationError as exc:
        e = exc.errors()[0]
        loc = ".".join(str(x) for x in e["loc"])
        raise bad_request(f"--policy: {loc}: {e['msg']}", field=f"policy.{loc}") from None


def _within(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


def check_mount(policy: Policy, source: str) -> Path:
    """Resolve a mount source (following symlinks, collapsing ..) and refuse dangerous ones."""
    raw = Path(source)
    if not raw.is_absolute():
        raw = Path.cwd() / raw
    if not raw.exists():
        raise bad_request(f"mount source {source} does not exist", field="mount")
    real = raw.resolve()
    if str(real) in FORBIDDEN_EXACT:
        raise refused(f"mount of {real} is never allowed (it would expose the host)", rule="forbidden_mount")
    for f in FORBIDDEN_UNDER:
        if _within(real, Path(f)):
            raise refused(f"mount of {real} (under {f}) is never allowed", rule="forbidden_mount")
    if real.is_socket() or real.is_block_device() or real.is_char_device():
        raise refused(f"mount of {real} is never allowed (socket or device)", rule="forbidden_mount")
    if policy.mount_roots is not None:
        roots = [Path(r).resolve() for r in policy.mount_roots]
        if not any(_within(real, r) for r in roots):
            raise refused(f"mount {source} resolves to {real}, outside the allowed roots "
                          f"{', '.join(str(r) for r in roots)}", rule="mount_roots")
    return real


def check_timeout(policy: Policy, timeout: float, field: str = "timeout") -> float:
    if not (timeout > 0) or timeout != timeout:
        raise bad_request(f"{field}: {timeout} must be a positive number of seconds", field=field)
    if timeout > MAX_TIMEOUT_S:
        raise bad_request(f"{field}: {timeout:g}s is more than the {MAX_TIMEOUT_S:g}s cko allows", field=field)
    if timeout > policy.max_timeout_s:
        raise refused(f"{field}: {timeout:g}s exceeds the policy's max_timeout_s {policy.max_timeout_s:g}",
                      rule="max_timeout_s")
    return timeout


def check_image(policy: Policy, image_id: str) -> None:
    if policy.allowed_images is not None and image_id not in policy.allowed_images:
        raise refused(f"image {image_id} is not in the policy's allowed_images", rule="allowed_images")


def check_gpus(policy: Policy, uuids: list[str]) -> None:
    if policy.allowed_gpus is None:
        return
    for u in uuids:
        if u not in policy.allowed_gpus:
            raise refused(f"GPU {u} is not in the policy's allowed_gpus", rule="allowed_gpus")


def check_limits(policy: Policy, memory_bytes: int, pids: int, cpus: float | None) -> None:
    if memory_bytes > policy.max_memory_bytes:
        raise refused(f"memory limit {memory_bytes} exceeds the policy's max_memory {policy.max_memory}",
                      rule="max_memory")
    if pids > policy.max_pids:
        raise refused(f"pids limit {pids} exceeds the policy's max_pids {policy.max_pids}", rule="max_pids")
    if policy.max_cpus is not None and cpus is not None and cpus > policy.max_cpus:
        raise refused(f"cpus {cpus} exceeds the policy's max_cpus {policy.max_cpus}", rule="max_cpus")


def check_counters(policy: Policy) -> None:
    if not policy.allow_profiler_counters:
        raise refused("profiler counters were requested but the policy does not allow_profiler_counters",
                      rule="allow_profiler_counters")


def container_user(policy: Policy) -> str:
    if policy.container_user:
        return policy.container_user
    if os.geteuid() == 0:
        return "65534:65534"
    return f"{os.geteuid()}:{os.getegid()}"


__all__ = ["CkoError", "Exit", "Policy", "load_policy"]
