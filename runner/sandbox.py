"""The sandbox: one container per invocation, through the Docker SDK.

Every container gets: the image by id, `--network none`, a read-only root, a tmpfs /tmp,
cap-drop ALL (and never a capability added), no-new-privileges, a non-root user, memory, CPU and
pids limits always set, no engine-kept log (cko's own bounded capture instead), cko's init as PID 1
(operations/init.py: it reaps, ends TERM-ignoring processes, and ends everything at the deadline
even when the controller is gone; non-dumpable, so the workload cannot ptrace it), and only the
mounts the operation needs. Containers carry labels naming the store, the invocation, the
controller and the deadline, so an orphan is found and removed without the store (`reap_expired`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .errors import CkoError, Exit, unavailable
from .gpu import GpuGrant
from .records import Limits

LABEL = "org.cko"
OUTPUT_KEEP = 256 * 1024  # bytes of stdout/stderr kept from the head and from the tail (when no limit says)
INIT = ["/opt/cko/bin/python", "-I", "-S", "/opt/cko/src/operations/init.py"]
# The in-container deadline lies past the controller's own (timeout + stop grace): the controller
# ends and records a live run first; the init is the backstop for a controller that is gone.
DEADLINE_MARGIN_S = 10.0


@dataclass
class Mount:
    source: str
    target: str
    read_only: bool = True


def default_limits() -> Limits:
    """Limits for code that builds a spec directly (tests); invocations take theirs from policy.admit."""
    return Limits(
        memory_bytes=4 << 30,
        pids=1024,
        cpus=1.0,
        tmpfs_bytes=1 << 30,
        output_bytes=1 << 30,
        output_files=10_000,
        output_depth=64,
        log_bytes=2 * OUTPUT_KEEP,
    )


@dataclass
class ContainerSpec:
    image_id: str
    command: list[str]
    mounts: list[Mount] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    user: str = "65534:65534"
    workdir: str = "/tmp"
    limits: Limits = field(default_factory=default_limits)
    gpu: GpuGrant | None = None
    labels: dict[str, str] = field(default_factory=dict)
    # A measuring stage: the supervisor's container is "shareable" (its /dev/shm is the stage's
    # meeting place), each worker joins it with "container:<id>"; everything else stays private.
    ipc_mode: str = "private"
    shm_bytes: int | None = None
    group_add: list[int] = field(default_factory=list)  # the supervisor reads each worker's group
    timeout_s: float = 600.0
    stop_grace_s: float = 5.0
    cleanup_timeout_s: float = 20.0


@dataclass
class CleanupReport:
    container_removed: bool = False
    stop_sent: bool = False
    killed: bool = False
    seconds: float = 0.0
    leftover: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "container_removed": self.container_removed,
            "stop_sent": self.stop_sent,
            "killed": self.killed,
            "seconds": round(self.seconds, 3),
            "leftover": self.leftover,
            "processes_left": 0 if self.container_removed else None,
        }


@dataclass
class ContainerRun:
    container_id: str
    exit_code: int | None
    timed_out: bool
    cancelled: bool
    oom_killed: bool
    stdout: bytes
    stderr: bytes
    stdout_bytes: int
    stderr_bytes: int
    started_at: float
    ended_at: float
    cleanup: CleanupReport
    engine_error: str | None = None


class _Tail:
    """Keep the head and the tail of a stream, count everything (megabytes of output stay bounded)."""

    def __init__(self, keep: int = OUTPUT_KEEP) -> None:
        self.keep = keep
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.keep - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.keep:
                del self.tail[: len(self.tail) - self.keep]

    def value(self) -> bytes:
        if self.total <= 2 * self.keep:
            return bytes(self.head + self.tail)
        skipped = self.total - len(self.head) - len(self.tail)
        return bytes(self.head) + f"\n[... {skipped} bytes cut by cko ...]\n".encode() + bytes(self.tail)


def deadline_s(spec: ContainerSpec) -> float:
    return spec.timeout_s + spec.stop_grace_s + DEADLINE_MARGIN_S


THREAD_POOL_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def container_kwargs(spec: ContainerSpec) -> dict[str, Any]:
    """The hardening every container gets; the one place it is decided."""
    from docker.types import Mount as DMount

    mounts = [
        DMount(target=m.target, source=m.source, type="bind", read_only=m.read_only) for m in spec.mounts
    ]
    env = dict(spec.env)
    devices: list[str] = []
    device_requests: list[Any] = []
    if spec.gpu is not None:
        env.update(spec.gpu.env)
        devices = list(spec.gpu.devices)
        device_requests = list(spec.gpu.device_requests)
        mounts += [DMount(target=c, source=h, type="bind", read_only=True) for h, c in spec.gpu.binds]
    else:
        env.setdefault("NVIDIA_VISIBLE_DEVICES", "void")
    lim = spec.limits
    if not (lim.memory_bytes > 0 and lim.pids > 0 and lim.cpus and lim.cpus > 0 and lim.tmpfs_bytes > 0):
        raise CkoError(
            f"internal: a container without every limit set ({lim})", exit_code=Exit.FAILED, code="internal"
        )
    # Thread pools (OpenMP, MKL, OpenBLAS: torch and numpy) size themselves by the host's cores, not
    # the container's CPU quota; more busy threads than the quota and the kernel throttles the whole
    # container for the rest of its period, mid-window or between window and reply. The request's
    # own setting wins.
    for var in THREAD_POOL_VARS:
        env.setdefault(var, str(max(1, int(lim.cpus))))
    deadline = deadline_s(spec)
    labels = {**spec.labels, f"{LABEL}.deadline": f"{time.time() + deadline:.0f}"}
    kwargs: dict[str, Any] = dict(
        image=spec.image_id,
        # cko's init (PID 1) holds the deadline; Docker's tini is not used (see operations/init.py).
        entrypoint=[*INIT, "--deadline-s", f"{deadline:g}", "--grace-s", f"{spec.stop_grace_s:g}", "--"],
        command=spec.command,
        user=spec.user,
        working_dir=spec.workdir,
        environment=env,
        labels=labels,
        network_mode="none",
        read_only=True,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        # The engine keeps no log: a flood of stdout never reaches the host's disk. cko attaches before
        # start and keeps a bounded head and tail itself (_Tail, limits.log_bytes).
        log_config={"type": "none", "config": {}},
        # mode=1777 explicitly: a tmpfs takes the mode of the directory under it. `exec`: Docker's
        # default noexec stops JIT-built code (Triton kernels, nvcc-built .so) from loading; the
        # root stays read-only, so /tmp is the only place anything can be written or run from.
        tmpfs={"/tmp": f"rw,exec,nosuid,nodev,mode=1777,size={lim.tmpfs_bytes}"},
        mem_limit=lim.memory_bytes,
        memswap_limit=lim.memory_bytes,
        pids_limit=lim.pids,
        nano_cpus=int(lim.cpus * 1e9),
        mounts=mounts,
        devices=devices or None,
        device_requests=device_requests or None,
        init=False,
        ipc_mode=spec.ipc_mode,
        detach=True,
        stdin_open=False,
        tty=False,
    )
    if spec.shm_bytes:
        kwargs["shm_size"] = spec.shm_bytes
    if spec.group_add:
        kwargs["group_add"] = [str(g) for g in spec.group_add]
    return kwargs


def _pump(stream: Any, out: _Tail, err: _Tail) -> None:
    with contextlib.suppress(Exception):
        for stdout, stderr in stream:
            if stdout:
                out.add(stdout)
            if stderr:
                err.add(stderr)


def remove_container(client: Any, container_id: str, grace: float, bound: float) -> CleanupReport:
    """Stop (TERM, then KILL after `grace`), remove, and check it is gone, all within `bound`."""
    from docker.errors import APIError, NotFound

    rep = CleanupReport()
    t0 = time.monotonic()
    try:
        c = client.containers.get(container_id)
        c.reload()
        if c.status in ("running", "restarting", "paused"):
            rep.stop_sent = True
            try:
                c.stop(timeout=max(0, int(grace)))
            except APIError:
                pass
            c.reload()
            if c.status == "running":
                rep.killed = True
                with contextlib.suppress(APIError):
                    c.kill()
        deadline = t0 + bound
        while True:
            try:
                c.remove(force=True)
            except NotFound:
                break
            except APIError as exc:
                if time.monotonic() > deadline:
                    rep.leftover = f"remove failed: {exc}"
                    break
                time.sleep(0.2)
                continue
            break
    except NotFound:
        pass
    try:
        client.containers.get(container_id)
        rep.leftover = rep.leftover or "container still exists after removal"
    except NotFound:
        rep.container_removed = True
    rep.seconds = time.monotonic() - t0
    return rep


class Companions(Protocol):
    """Containers started beside the main one once it runs, and removed before it (a stage's workers)."""

    def start(self, client: Any, container: Any, on_event: Callable[[str, dict[str, Any]], None]) -> None: ...

    def stop(self, client: Any, on_event: Callable[[str, dict[str, Any]], None]) -> None: ...


def run(
    client: Any,
    spec: ContainerSpec,
    on_event: Callable[[str, dict[str, Any]], None],
    cancelled: Callable[[], bool] = lambda: False,
    companions: Companions | None = None,
) -> ContainerRun:
    """Create, start, wait with a timeout, stop/kill, collect output, remove. Never leaves it behind."""
    from docker.errors import APIError, ImageNotFound

    try:
        container = client.containers.create(**container_kwargs(spec))
    except ImageNotFound:
        raise unavailable(f"image {spec.image_id} not found in the engine", code="image_missing") from None
    except APIError as exc:
        raise CkoError(
            f"engine refused the container: {exc.explanation or exc}",
            exit_code=Exit.UNAVAILABLE,
            code="container_create_failed",
        ) from None
    keep = max(1, spec.limits.log_bytes // 2) if spec.limits.log_bytes else OUTPUT_KEEP
    out, err = _Tail(keep), _Tail(keep)
    pump: threading.Thread | None = None
    timed_out = was_cancelled = False
    exit_code: int | None = None
    engine_error = None
    started = time.time()
    try:
        stream = client.api.attach(
            container.id, stdout=True, stderr=True, stream=True, logs=False, demux=True
        )
        pump = threading.Thread(target=_pump, args=(stream, out, err), daemon=True)
        pump.start()
        container.start()
        started = time.time()
        on_event("container_started", {"container_id": container.id[:12]})
        if companions is not None:
            companions.start(client, container, on_event)
        exit_code, timed_out, was_cancelled, engine_error = _wait(
            container, spec.timeout_s, cancelled, on_event
        )
    finally:
        ended = time.time()
        oom = False
        with contextlib.suppress(Exception):
            container.reload()
            oom = bool(container.attrs.get("State", {}).get("OOMKilled"))
        if timed_out or was_cancelled or engine_error:
            on_event("stop", {"grace_s": spec.stop_grace_s})
        if companions is not None:
            companions.stop(client, on_event)
        cleanup = remove_container(client, container.id, spec.stop_grace_s, spec.cleanup_timeout_s)
        if cleanup.killed:
            on_event("kill", {})
        on_event("removed", cleanup.as_dict())
        if pump is not None:
            pump.join(timeout=2.0)
    return ContainerRun(
        container_id=container.id,
        exit_code=exit_code,
        timed_out=timed_out,
        cancelled=was_cancelled,
        oom_killed=oom,
        stdout=out.value(),
        stderr=err.value(),
        stdout_bytes=out.total,
        stderr_bytes=err.total,
        started_at=started,
        ended_at=ended,
        cleanup=cleanup,
        engine_error=engine_error,
    )


def _wait(
    container: Any,
    timeout_s: float,
    cancelled: Callable[[], bool],
    on_event: Callable[[str, dict[str, Any]], None],
) -> tuple[int | None, bool, bool, str | None]:
    """Wait for the container's command, in 1 s slices so a cancel is seen: (exit code, timed out,
    cancelled, the engine's error), one event for whichever ended the wait."""
    from docker.errors import DockerException

    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            on_event("timeout", {"after_s": timeout_s})
            return None, True, False, None
        if cancelled():
            on_event("cancel_seen", {})
            return None, False, True, None
        try:
            status = container.wait(timeout=min(1.0, remaining))
        except DockerException as exc:
            error = str(exc)
            slice_ended = "timed out" in error.lower() or "read timeout" in error.lower()
        except Exception as exc:  # requests' ReadTimeout / ConnectionError come through here
            error = f"{type(exc).__name__}: {exc}"
            slice_ended = "Timeout" in type(exc).__name__ or "timed out" in str(exc).lower()
        else:
            exit_code = int(status.get("StatusCode", -1))
            on_event("exited", {"exit_code": exit_code})
            return exit_code, False, False, None
        if slice_ended:
            continue  # this slice of the wait ended, the command did not
        on_event("engine_error", {"error": error[:300]})
        return None, False, False, error


def find_containers(client: Any, store_root: str) -> list[Any]:
    return list(client.containers.list(all=True, filters={"label": f"{LABEL}.store={store_root}"}))


def reap_expired(client: Any, now: float | None = None, margin_s: float = 5.0) -> list[str]:
    """Remove every cko container past its deadline label, whatever store it belongs to.

    Needs no store and no controller: the label is the contract. A live controller removes its
    container before the deadline (the label carries timeout + grace + margin), so anything past
    it is an orphan (the init has ended its processes already; this frees the engine's record)."""
    now = time.time() if now is None else now
    gone = []
    with contextlib.suppress(Exception):
        for c in client.containers.list(all=True, filters={"label": f"{LABEL}.deadline"}):
            try:
                deadline = float(c.labels.get(f"{LABEL}.deadline", "inf"))
            except ValueError:
                continue
            if deadline + margin_s < now:
                remove_container(client, c.id, grace=1, bound=20)
                gone.append(c.id[:12])
    return gone
