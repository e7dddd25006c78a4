"""Ops policy (DESIGN.md): what an operator lets cko touch on this host.

Two layers. The system policy (root-owned `/etc/cko/policy.yaml`) always applies; a caller's
`--policy`/`$CKO_POLICY` can only narrow it (`narrow`: intersections and minima). Every limit has a
default and a maximum: a missing limit is the default, a zero or negative one is a bad request,
never "unlimited". `admit(plan)` is the one check: it validates, applies the policy, resolves and
copies every host path the plan names (runner/hostpath.py), and returns a frozen `Admitted` plan;
nothing after it re-reads the request or the policy. Some mounts are refused whatever the policy
says: the root, the engine's socket, kernel and device filesystems.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import Field, ValidationError, field_validator

from .errors import CkoError, Exit, bad_request, refused, unavailable
from .models import Closed
from .records import Limits

if TYPE_CHECKING:
    from .invocation import Plan

# Never mounted into a container, whatever the policy: they would hand it the host.
FORBIDDEN_EXACT = (
    "/",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/root",
    "/home",
    "/var",
    "/opt",
    "/tmp",
    "/run",
    "/var/run",
    "/srv",
    "/mnt",
    "/media",
)
FORBIDDEN_UNDER = (
    "/proc",
    "/sys",
    "/dev",
    "/boot",
    "/etc",
    "/var/lib/docker",
    "/var/lib/containerd",
    "/run/docker",
    "/run/containerd",
    "/var/run/docker",
    "/run/user",
    "/run/cko",
)
RESERVED_TARGETS = ("/", "/tmp", "/opt/cko", "/proc", "/dev", "/sys", "/etc", "/cko/out")
MAX_TIMEOUT_S = 24 * 3600.0
SYSTEM_POLICY = "/etc/cko/policy.yaml"
_SIZE = re.compile(r"^(-?[0-9]+)([kmg]?)b?$", re.IGNORECASE)


def parse_size(text: str | int, field: str) -> int:
    """Bytes from `512m`, `4g`, `4096`, `1kb`; a size of zero or less is refused (never 'unlimited')."""
    if isinstance(text, bool):
        raise bad_request(f"{field}: {text!r} is not a size like 512m or 4g", field=field)
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE.match(str(text).strip())
        if not m:
            raise bad_request(f"{field}: {text!r} is not a size like 512m or 4g", field=field)
        value = int(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]
    if value <= 0:
        raise bad_request(
            f"{field}: {text!r} must be more than zero (a limit is never switched off)", field=field
        )
    return value


def host_cpus() -> float:
    return float(os.cpu_count() or 1)


class Policy(Closed):
    allowed_images: list[str] | None = Field(default=None, description="image ids (sha256:...) that may run")
    allowed_gpus: list[str] | None = Field(default=None, description="GPU UUIDs that may be granted")
    mount_roots: list[str] | None = Field(
        default=None,
        description="host directories under which every host path "
        "a request names (mounts, workloads, reports) lies",
    )
    max_timeout_s: float = Field(default=6 * 3600.0, gt=0, le=MAX_TIMEOUT_S)
    max_memory: str = "16g"
    default_memory: str = "4g"
    max_pids: int = Field(default=4096, ge=16)
    default_pids: int = Field(default=1024, ge=16)
    max_cpus: float | None = Field(default=None, gt=0, description="default: the host's cores")
    default_cpus: float | None = Field(
        default=None, gt=0, description="default: the host's cores less one (min 1)"
    )
    max_tmpfs: str = "8g"
    default_tmpfs: str = "1g"
    max_output: str = "8g"
    default_output: str = "1g"
    max_output_files: int = Field(default=100_000, ge=1)
    default_output_files: int = Field(default=10_000, ge=1)
    max_output_depth: int = Field(default=64, ge=1, le=256)
    max_log: str = "64m"
    default_log: str = "256k"
    container_user: str | None = Field(default=None, description="uid:gid the container runs as")
    # Foreign-load ceilings of a verdict (issue 19): a policy can only lower a plan's declared ceiling
    max_foreign_cpu_share: float | None = Field(default=None, gt=0, le=1.0)
    max_foreign_gpu_contexts: int | None = Field(default=None, ge=0)
    ledger_key_file: str | None = Field(
        default=None, description="system policy only: HMAC key for the ledger"
    )
    ledger_head_dir: str | None = Field(default=None, description="system policy only: keyed ledger heads")

    @field_validator("container_user")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^[0-9]+(:[0-9]+)?$", v):
            raise ValueError("container_user must be uid or uid:gid (numbers)")
        if v is not None and v.split(":")[0] == "0":
            raise ValueError("container_user may not be root (0)")
        return v

    @field_validator(
        "max_memory",
        "default_memory",
        "max_tmpfs",
        "default_tmpfs",
        "max_output",
        "default_output",
        "max_log",
        "default_log",
    )
    @classmethod
    def _size(cls, v: str) -> str:
        if not _SIZE.match(str(v).strip()) or str(v).strip().startswith(("-", "0")):
            raise ValueError(f"{v!r} is not a positive size like 512m or 4g")
        return v

    @property
    def max_memory_bytes(self) -> int:
        return parse_size(self.max_memory, "policy.max_memory")


@dataclass(frozen=True)
class LoadedPolicy:
    """The effective policy and where its layers came from (recorded in every request.json)."""

    policy: Policy
    system_path: str | None
    system_sha256: str | None
    caller_path: str | None
    caller_sha256: str | None


def _read_policy(path: str, what: str) -> tuple[Policy, str]:
    try:
        raw = Path(path).read_bytes()
        data = yaml.safe_load(raw)
    except FileNotFoundError:
        raise bad_request(f"{what}: {path} does not exist", field="policy") from None
    except (OSError, yaml.YAMLError) as exc:
        raise bad_request(
            f"{what}: {path} is not readable YAML: {str(exc).splitlines()[0]}", field="policy"
        ) from None
    if isinstance(data, dict) and "allow_profiler_counters" in data:
        raise bad_request(
            f"{what}: allow_profiler_counters was removed: no operation adds a capability; counters "
            "are read where the host lets non-admin users read them (cko doctor says)",
            field="policy.allow_profiler_counters",
        )
    try:
        return Policy.model_validate(data or {}), hashlib.sha256(raw).hexdigest()
    except ValidationError as exc:
        e = exc.errors()[0]
        loc = ".".join(str(x) for x in e["loc"])
        raise bad_request(f"{what}: {loc}: {e['msg']}", field=f"policy.{loc}") from None


def _root_owned(path: Path) -> str | None:
    """Why `path` cannot be trusted as the system policy (None: it can): root's, not writable by others."""
    for p in (path, path.parent):
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            return f"{p} is a symbolic link"
        if st.st_uid != 0:
            return f"{p} is not owned by root"
        if st.st_mode & 0o022:
            return f"{p} is writable by group or others"
    return None


def system_policy_path() -> str | None:
    """/etc/cko/policy.yaml, or $CKO_SYSTEM_POLICY when that file is root-owned and not group/world-writable."""
    env = os.environ.get("CKO_SYSTEM_POLICY")
    if env:
        p = Path(env).absolute()
        if not p.exists():
            raise unavailable(
                f"CKO_SYSTEM_POLICY: {p} does not exist",
                code="system_policy_untrusted",
                field="system_policy",
            )
        why = _root_owned(p)
        if why:
            raise unavailable(
                f"CKO_SYSTEM_POLICY: {why}: a system policy must be root-owned",
                code="system_policy_untrusted",
                field="system_policy",
            )
        return str(p)
    p = Path(SYSTEM_POLICY)
    if not p.exists():
        return None
    why = _root_owned(p)
    if why:
        raise unavailable(
            f"{SYSTEM_POLICY}: {why}; fix its ownership and mode (root:root 0644)",
            code="system_policy_untrusted",
            field="system_policy",
        )
    return str(p)


def load_system() -> tuple[Policy, str | None, str | None]:
    path = system_policy_path()
    if path is None:
        return Policy(), None, None
    pol, sha = _read_policy(path, "system policy")
    return pol, path, sha


def load(path: str | Path | None) -> LoadedPolicy:
    """The effective policy: the system policy narrowed by --policy / $CKO_POLICY."""
    system, spath, ssha = load_system()
    p = str(path) if path else os.environ.get("CKO_POLICY")
    if not p:
        return LoadedPolicy(system, spath, ssha, None, None)
    caller, csha = _read_policy(p, "--policy")
    if caller.ledger_key_file or caller.ledger_head_dir:
        raise bad_request(
            "--policy: ledger_key_file and ledger_head_dir belong in the system policy only",
            field="policy.ledger_key_file",
        )
    return LoadedPolicy(narrow(system, caller), spath, ssha, p, csha)


def load_policy(path: str | Path | None) -> tuple[Policy, str | None]:
    """The effective policy and the caller's policy path (the older two-value form)."""
    lp = load(path)
    return lp.policy, lp.caller_path


def _within(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


def _meet(a: list[str] | None, b: list[str] | None) -> list[str] | None:
    if a is None:
        return b
    if b is None:
        return a
    return [x for x in b if x in a]


def _min_size(a: str, b: str) -> str:
    return a if parse_size(a, "policy") <= parse_size(b, "policy") else b


def narrow(system: Policy, caller: Policy) -> Policy:
    """What both allow: a caller's policy never widens the system's."""
    roots = caller.mount_roots
    if system.mount_roots is not None:
        sys_roots = [Path(r).resolve() for r in system.mount_roots]
        roots = [
            r
            for r in (caller.mount_roots if caller.mount_roots is not None else system.mount_roots)
            if any(_within(Path(r).resolve(), s) for s in sys_roots)
        ]
    upd: dict[str, Any] = {
        "allowed_images": _meet(system.allowed_images, caller.allowed_images),
        "allowed_gpus": _meet(system.allowed_gpus, caller.allowed_gpus),
        "mount_roots": roots,
        "max_timeout_s": min(system.max_timeout_s, caller.max_timeout_s),
        "max_pids": min(system.max_pids, caller.max_pids),
        "default_pids": min(system.default_pids, caller.default_pids),
        "max_output_files": min(system.max_output_files, caller.max_output_files),
        "default_output_files": min(system.default_output_files, caller.default_output_files),
        "max_output_depth": min(system.max_output_depth, caller.max_output_depth),
        "container_user": system.container_user or caller.container_user,
    }
    for name in ("memory", "tmpfs", "output", "log"):
        for kind in ("max", "default"):
            key = f"{kind}_{name}"
            upd[key] = _min_size(getattr(system, key), getattr(caller, key))
    for key in ("max_cpus", "default_cpus"):
        vals = [v for v in (getattr(system, key), getattr(caller, key)) if v is not None]
        upd[key] = min(vals) if vals else None
    return system.model_copy(update=upd)


def check_timeout(policy: Policy, timeout: float, field: str = "timeout") -> float:
    if not (timeout > 0) or timeout != timeout:
        raise bad_request(f"{field}: {timeout} must be a positive number of seconds", field=field)
    if timeout > MAX_TIMEOUT_S:
        raise bad_request(
            f"{field}: {timeout:g}s is more than the {MAX_TIMEOUT_S:g}s cko allows", field=field
        )
    if timeout > policy.max_timeout_s:
        raise refused(
            f"{field}: {timeout:g}s exceeds the policy's max_timeout_s {policy.max_timeout_s:g}",
            rule="max_timeout_s",
        )
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


def _size_limit(policy: Policy, requested: str | int | None, name: str, field: str) -> int:
    maximum = parse_size(getattr(policy, f"max_{name}"), f"policy.max_{name}")
    if requested is None:
        return min(parse_size(getattr(policy, f"default_{name}"), f"policy.default_{name}"), maximum)
    value = parse_size(requested, field)
    if value > maximum:
        raise refused(
            f"{field}: {requested} exceeds the policy's max_{name} {getattr(policy, f'max_{name}')}",
            rule=f"max_{name}",
        )
    return value


def _count_limit(
    policy: Policy, requested: float | None, name: str, field: str, default: float, maximum: float
) -> float:
    if requested is None:
        return min(default, maximum)
    if isinstance(requested, bool) or not requested > 0 or requested != requested:
        raise bad_request(
            f"{field}: {requested} must be more than zero (a limit is never switched off)", field=field
        )
    if requested > maximum:
        raise refused(
            f"{field}: {requested:g} exceeds the policy's max_{name} {maximum:g}", rule=f"max_{name}"
        )
    return requested


def admit_limits(
    policy: Policy,
    memory: str | int | None,
    pids: int | None,
    cpus: float | None,
    tmpfs: str | int | None,
    output: str | int | None = None,
    output_files: int | None = None,
    log: str | int | None = None,
) -> Limits:
    """Every limit set, none above the policy's maximum."""
    max_cpus = policy.max_cpus or host_cpus()
    default_cpus = policy.default_cpus or max(1.0, host_cpus() - 1)
    if pids is not None and 0 < pids < 16:
        raise bad_request("pids: at least 16", field="pids")
    return Limits(
        memory_bytes=_size_limit(policy, memory, "memory", "memory"),
        pids=int(_count_limit(policy, pids, "pids", "pids", policy.default_pids, policy.max_pids)),
        cpus=float(_count_limit(policy, cpus, "cpus", "cpus", default_cpus, max_cpus)),
        tmpfs_bytes=_size_limit(policy, tmpfs, "tmpfs", "tmpfs"),
        output_bytes=_size_limit(policy, output, "output", "output"),
        output_files=int(
            _count_limit(
                policy,
                output_files,
                "output_files",
                "output_files",
                policy.default_output_files,
                policy.max_output_files,
            )
        ),
        output_depth=policy.max_output_depth,
        log_bytes=_size_limit(policy, log, "log", "log"),
    )


COUNTERS_REMEDY = (
    "on the host, as root: echo 'options nvidia NVreg_RestrictProfilingToAdminUsers=0' > "
    "/etc/modprobe.d/cko-profiling.conf, then reload the nvidia module (or reboot)"
)


def counters_refusal(reason: str) -> CkoError:
    return CkoError(
        f"profiler counters are restricted to admin users on this host ({reason}); cko never adds a "
        f"capability to read them. Host-side fix: {COUNTERS_REMEDY}",
        exit_code=Exit.UNAVAILABLE,
        code="profiler_counters_restricted",
        field="counters",
    )


def check_counters() -> None:
    """Refuse before anything starts where the driver says only admins read counters."""
    from .doctor import profiler_permission

    perm = profiler_permission()
    if perm.get("readable") is False:
        raise counters_refusal(str(perm.get("reason")))


def container_user(policy: Policy) -> str:
    if policy.container_user:
        return policy.container_user
    if os.geteuid() == 0:
        return "65534:65534"
    return f"{os.geteuid()}:{os.getegid()}"


# -- admission ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdmittedMount:
    source: str  # a path cko owns (the store's scratch, or a cko staging copy)
    target: str
    read_only: bool
    origin: str  # what the request named


@dataclass(frozen=True)
class Admitted:
    """A plan the policy admitted: frozen; launch and record read only this."""

    plan: Plan  # the request as given (for the record); never re-checked
    mounts: tuple[AdmittedMount, ...]
    limits: Limits
    timeout_s: float
    user: str
    policy: LoadedPolicy
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)


def _check_targets(plan: Plan) -> None:
    targets: set[str] = set()
    for m in plan.mounts:
        if not m.target.startswith("/") or ".." in Path(m.target).parts:
            raise CkoError(
                f"mount target {m.target} must be an absolute path without ..",
                code="bad_request",
                field="mount",
            )
        if m.target in targets or m.target in RESERVED_TARGETS or m.target.startswith("/cko/out/"):
            raise CkoError(
                f"mount target {m.target} is reserved or given twice", code="bad_request", field="mount"
            )
        targets.add(m.target)


def admit(
    plan: Plan, loaded: LoadedPolicy | None = None, staging: Path | None = None, owned: tuple[Path, ...] = ()
) -> Admitted:
    """The one policy check. Raises (exit 2 bad request, exit 3 refused) before anything starts.

    Host paths are resolved once, by file descriptor, checked and copied under `staging` (a
    directory cko owns); mounts under `owned` (cko's own scratch) are mounted as they are."""
    from . import hostpath

    loaded = loaded or load(plan.policy_path)
    policy = loaded.policy
    timeout = check_timeout(policy, plan.timeout_s)
    limits = admit_limits(
        policy, plan.memory, plan.pids, plan.cpus, plan.tmpfs, plan.output, plan.output_files, plan.log
    )
    _check_targets(plan)
    if plan.counters:
        check_counters()
    mounts = []
    for i, m in enumerate(plan.mounts):
        src = hostpath.admit_mount(policy, m.source, m.read_only, owned=owned, staging=staging, index=i)
        mounts.append(AdmittedMount(source=str(src), target=m.target, read_only=m.read_only, origin=m.source))
    for wi, w in enumerate(plan.workers):  # a stage's workers: cko's own scratch, checked the same way
        for j, m in enumerate(w.mounts):
            src = hostpath.admit_mount(
                policy, m.source, m.read_only, owned=owned, staging=staging, index=1000 + 100 * wi + j
            )
            # cko's own scratch is mounted as it is; anything else is the checked copy (a check that
            # stages into a temporary directory, as the fleet controller's does, leaves the plan alone)
            if owned or staging is None:
                m.source = str(src)
    return Admitted(
        plan=plan,
        mounts=tuple(mounts),
        limits=limits,
        timeout_s=timeout,
        user=container_user(policy),
        policy=loaded,
        env=dict(plan.env),
    )


__all__ = ["Admitted", "CkoError", "Exit", "Policy", "admit", "load", "load_policy"]
