"""One run of one operation as an Invocation (DESIGN.md, Flow of one operation).

prepare (a Plan) → `policy.admit(plan)` (one check: limits, paths resolved and copied, a frozen
Admitted plan) → locks → request.json/events.jsonl → container → collect → result.json.
Containers never write the store: they write a size-limited output area that the controller
hashes into objects/ after the container is gone (runner/outdir.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import gpu as gpumod
from . import images as img
from . import outdir, sandbox
from . import policy as pol
from .canonical import canonical_bytes, sha256_file
from .errors import CkoError, Exit, unavailable
from .hostpath import remove_tree
from .identity import EngineIdentity, EnvironmentIdentity, ImageIdentity, host_identity
from .locks import FileLock, gpu_lock
from .models import ObjectRef
from .records import InvocationRequest, InvocationResult, MountSpec, TerminalState
from .store import Store, new_id, write_new
from .workers import FreezerService, StageWorkers, WorkerLaunch

META_DIR = outdir.META_DIR  # inside the output dir: the probe and checks, not user outputs
TAIL_CHARS = 4000


# The reason an invocation records when the kernel's OOM killer stopped its container.
OOM_REASON = "container hit its memory limit (OOM killed)"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass
class Plan:
    """Everything an invocation needs, validated before anything is written."""

    op: str
    command: list[str]
    image: str = "cpu"
    gpus: list[str] = field(default_factory=list)  # UUIDs, or ["all"]
    gpu_mode: str | None = None  # None: pick the best usable
    mounts: list[sandbox.Mount] = field(default_factory=list)
    timeout_s: float = 600.0
    # Requested limits; None: the policy's default. policy.admit turns them into one Limits.
    memory: str | None = None
    pids: int | None = None
    cpus: float | None = None
    tmpfs: str | None = None
    output: str | None = None
    output_files: int | None = None
    log: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    label: str = ""
    workdir: str = "/tmp"
    wrap: bool = True  # run through `operations run` (probe + GPU check)
    counters: bool = (
        False  # profiler counters wanted: refused where the host keeps them to admins (no capability)
    )
    lock_timeout_s: float = 300.0
    stop_grace_s: float = 5.0
    cleanup_timeout_s: float = 30.0
    parent: dict[str, Any] | None = None
    telemetry: bool = False
    policy_path: str | None = None
    # A measuring stage: one worker container per subject beside this (the supervisor's) container.
    workers: list[WorkerLaunch] = field(default_factory=list)


@dataclass
class Outcome:
    id: str
    result: InvocationResult
    out_dir: Path | None  # scratch copy of the outputs, removed by `close`
    meta: dict[str, Any]
    # Set by the fleet backend: the cluster address and the node that ran it (node_id, hostname).
    # None: this host ran it (its identity.host says which).
    where: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int:
        return self.result.exit_code

    def output_path(self, name: str) -> Path | None:
        if self.out_dir is None:
            return None
        p = self.out_dir / name
        return p if p.is_file() and not p.is_symlink() else None

    def read_json(self, name: str) -> Any:
        p = self.output_path(name)
        if p is None:
            return None
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        if self.out_dir is not None:
            outdir.release(self.out_dir.parent)
            self.out_dir = None


class Events:
    """events.jsonl: append-only while the invocation runs; hashed into result.json at the end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()  # the stage's workers start on threads of their own

    def __call__(self, name: str, data: dict[str, Any] | None = None) -> None:
        line = json.dumps({"t": now_iso(), "event": name, **(data or {})}, sort_keys=True, default=str)
        with self.lock, open(self.path, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())


def inv_dir(store: Store, inv_id: str) -> Path:
    return store.invocation_dir(inv_id)


def active_lock(store: Store, inv_id: str) -> FileLock:
    return FileLock(inv_dir(store, inv_id) / ".active")


def claim(store: Store, inv_id: str, timeout: float = 1.0) -> contextlib.AbstractContextManager[None]:
    """Create a new invocation's directory and hold its active lock before anything is written in it.

    reap_orphans takes an invocation whose request.json exists and whose lock is free for one whose
    controller died; writing the request first would open a window where a starting run looks dead."""
    inv_dir(store, inv_id).mkdir(parents=True)
    return active_lock(store, inv_id).hold(timeout=timeout, what="invocation", label=inv_id)


def engine_identity(client: Any) -> EngineIdentity:
    info = client.info()
    ver = client.version()
    return EngineIdentity(
        version=str(ver.get("Version")),
        runtime=str(info.get("DefaultRuntime", "runc")),
        api_version=str(ver.get("ApiVersion")),
        cgroup_version=str(info.get("CgroupVersion", "")),
    )


def _write_result(store: Store, inv_id: str, result: InvocationResult) -> None:
    store.commit_file(inv_dir(store, inv_id) / "result.json", canonical_bytes(result))


def _events_sha(store: Store, inv_id: str) -> str | None:
    p = inv_dir(store, inv_id) / "events.jsonl"
    return sha256_file(p) if p.exists() else None


def _resolve_gpus(plan: Plan, hg: gpumod.HostGpus) -> list[str]:
    if not plan.gpus:
        return []
    if not hg.available:
        raise unavailable(
            f"GPU requested but none is usable on this host: {hg.reason}", code="no_gpu", field="gpus"
        )
    known = {d.uuid: d for d in hg.devices}
    if plan.gpus == ["all"]:
        return list(known)
    out = []
    for g in plan.gpus:
        if g.isdigit() and int(g) < len(hg.devices):
            g = hg.devices[int(g)].uuid
        if g not in known:
            raise CkoError(
                f"--gpus: {g} is not a GPU on this host (known: {', '.join(known) or 'none'})",
                exit_code=Exit.BAD_REQUEST,
                code="unknown_gpu",
                field="gpus",
            )
        out.append(g)
    return out


@contextlib.contextmanager
def _gpu_locks(uuids: list[str], timeout: float, label: str) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for u in sorted(uuids):  # fixed order: no deadlock between two multi-GPU invocations
            stack.enter_context(gpu_lock(u).hold(timeout=timeout, what=f"GPU {u}", label=label))
        yield


def refuse(store: Store, plan: Plan, err: CkoError, image_id: str | None = None) -> InvocationResult:
    """Record a refused invocation (nothing ran) and return its result."""
    inv_id = new_id("inv")
    d = inv_dir(store, inv_id)
    with claim(store, inv_id):
        req = _refused_request(plan, inv_id, image_id)
        write_new(d / "request.json", canonical_bytes(req))
        Events(d / "events.jsonl")("refused", {"rule": err.field, "reason": err.message})
        res = InvocationResult(
            id=inv_id,
            op=plan.op,
            state="refused",
            exit_code=int(Exit.REFUSED),
            reason=err.message,
            rule=err.field,
            ended_at=now_iso(),
            request_sha256=sha256_file(d / "request.json"),
            events_sha256=_events_sha(store, inv_id),
        )
        _write_result(store, inv_id, res)
    return res


def _refused_request(plan: Plan, inv_id: str, image_id: str | None) -> InvocationRequest:
    """What was asked, as asked (nothing was admitted, nothing ran)."""
    return InvocationRequest(
        id=inv_id,
        op=plan.op,
        label=plan.label,
        command=plan.command,
        image=plan.image,
        image_id=image_id,
        gpus=[],
        mounts=[MountSpec(source=m.source, target=m.target, read_only=m.read_only) for m in plan.mounts],
        timeout_s=plan.timeout_s if plan.timeout_s > 0 else 0.0,
        limits=sandbox.default_limits(),
        user="-",
        policy_path=plan.policy_path,
        created_at=now_iso(),
        controller_pid=os.getpid(),
        host_id=host_identity().host_id,
        parent=plan.parent,
    )


def _request(
    adm: pol.Admitted, inv_id: str, image_id: str | None, uuids: list[str], mode: str
) -> InvocationRequest:
    plan, lp = adm.plan, adm.policy
    return InvocationRequest(
        id=inv_id,
        op=plan.op,
        label=plan.label,
        command=plan.command,
        image=plan.image,
        image_id=image_id,
        gpu_mode=mode,
        gpus=uuids,
        mounts=[MountSpec(source=m.source, target=m.target, read_only=m.read_only) for m in adm.mounts],
        timeout_s=adm.timeout_s,
        limits=adm.limits,
        user=adm.user,
        policy_path=lp.caller_path,
        policy_sha256=lp.caller_sha256,
        system_policy_path=lp.system_path,
        system_policy_sha256=lp.system_sha256,
        created_at=now_iso(),
        controller_pid=os.getpid(),
        host_id=host_identity().host_id,
        parent=plan.parent,
    )


def check_plan(plan: Plan, policy: pol.Policy) -> None:
    """Validate and apply the policy without running (the fleet controller's check)."""
    staging = None
    try:
        lp = pol.LoadedPolicy(policy, None, None, plan.policy_path, None)
        staging = Path(os.environ.get("TMPDIR", "/tmp")) / f"cko-check-{os.getpid()}-{time.monotonic_ns()}"
        pol.admit(plan, lp, staging=staging)
    finally:
        if staging is not None:
            remove_tree(staging)


def execute(
    store: Store, plan: Plan, progress: Callable[[str], None] | None = None, keep_outputs: bool = False
) -> Outcome:
    """Run one invocation to a terminal state and record it. Refusals are recorded and raised."""
    image_id: str | None = None
    staging = store.scratch(new_id("stg"))

    @contextlib.contextmanager
    def recording_refusals() -> Iterator[None]:
        """A policy refusal is recorded as a `refused` invocation before it is raised."""
        try:
            yield
        except CkoError as err:
            if err.exit_code == Exit.REFUSED:
                err.detail = {"invocation": refuse(store, plan, err, image_id).id}
            raise

    with recording_refusals():
        adm = pol.admit(plan, staging=staging, owned=(store.scratch(),))
    try:
        return _execute_admitted(store, adm, staging, progress, keep_outputs, recording_refusals)
    finally:
        remove_tree(staging)


@dataclass
class _Target:
    """What an admitted plan resolved to before anything is written: the image and the GPUs it gets."""

    entry: img.ImageEntry
    hg: gpumod.HostGpus
    uuids: list[str]
    mode: str


@dataclass
class _Claimed:
    """One claimed invocation: what its steps share, and what a failure to start must release."""

    store: Store
    adm: pol.Admitted
    req: InvocationRequest
    ev: Events
    request_sha: str
    out_dir: Path | None = None
    companions: StageWorkers | None = None
    started_at: str | None = None

    @property
    def id(self) -> str:
        return self.req.id

    @property
    def plan(self) -> Plan:
        return self.adm.plan


@dataclass
class _Ran:
    """A container that ran to its end, and what was gathered around it."""

    run: sandbox.ContainerRun
    series: dict[str, Any] | None  # the GPU telemetry, when asked for
    identity: EnvironmentIdentity
    out_dir: Path


def _execute_admitted(
    store: Store,
    adm: pol.Admitted,
    staging: Path,
    progress: Callable[[str], None] | None,
    keep_outputs: bool,
    recording_refusals: Callable[[], Any],
) -> Outcome:
    """The invocation's life in the order a crash must be recoverable: claim, request, locks and
    container, collect, result."""
    plan = adm.plan
    client = img.docker_client()
    target = _resolve_target(store, adm, client, recording_refusals)
    inv_id = new_id("inv")
    d = inv_dir(store, inv_id)
    with claim(store, inv_id):
        req = _request(adm, inv_id, target.entry.image_id, target.uuids, target.mode)
        write_new(d / "request.json", canonical_bytes(req))
        inv = _Claimed(store, adm, req, Events(d / "events.jsonl"), sha256_file(d / "request.json"))
        inv.ev("created", {"op": plan.op, "label": plan.label})
        try:
            ran = _launch(inv, client, target, progress or (lambda _m: None))
        except CkoError as err:
            _record_failed_start(inv, err)
            raise
        _hand_back_worker_outputs(inv, ran.out_dir)
        refs, meta, problems = outdir.collect(store, ran.out_dir, adm.limits)
        inv.ev("collected", {"outputs": len(refs), "problems": problems})
        res = _record_terminal(inv, ran, refs, meta, problems)
    outcome = Outcome(id=inv_id, result=res, out_dir=ran.out_dir, meta=meta)
    if not keep_outputs:
        outcome.close()
    return outcome


def _resolve_target(
    store: Store, adm: pol.Admitted, client: Any, recording_refusals: Callable[[], Any]
) -> _Target:
    """The image and GPUs the plan names, each checked against the policy (a refusal is recorded)."""
    plan, policy = adm.plan, adm.policy.policy
    entry = img.resolve(plan.image, client)
    with recording_refusals():
        pol.check_image(policy, entry.image_id)
    reap_orphans(store, client)
    hg = gpumod.host_gpus() if plan.gpus else gpumod.HostGpus(False, "no GPU requested")
    uuids = _resolve_gpus(plan, hg)
    with recording_refusals():
        pol.check_gpus(policy, uuids)
    mode = _passthrough_mode(plan, client, hg) if uuids else "none"
    return _Target(entry, hg, uuids, mode)


def _passthrough_mode(plan: Plan, client: Any, hg: gpumod.HostGpus) -> str:
    """The GPU passthrough mode asked for, or the best usable one; unavailable when it is not usable."""
    checks = gpumod.check_modes(client.info(), hg)
    mode = plan.gpu_mode or gpumod.pick_mode(checks)
    usable = {c.mode: c for c in checks}
    if mode not in usable or not usable[mode].usable:
        raise unavailable(
            f"GPU passthrough mode {mode} is not usable: {usable.get(mode) and usable[mode].reason}",
            code="passthrough_unavailable",
            field="gpu_mode",
        )
    return mode


def _launch(inv: _Claimed, client: Any, target: _Target, say: Callable[[str], None]) -> _Ran:
    """Under the GPU locks: the output area, the container (and its stage's workers), run to its end."""
    plan = inv.plan
    with _gpu_locks(target.uuids, plan.lock_timeout_s, inv.id):
        inv.ev("locks_acquired", {"gpus": target.uuids})
        identity = _environment_identity(plan, client, target)
        out_dir, bounded = outdir.make(inv.store.scratch(inv.id), inv.req.user, inv.adm.limits)
        inv.out_dir = out_dir  # from here a failure to start releases it
        if not bounded:
            inv.ev(
                "output_unbounded",
                {
                    "reason": "the controller is not root: /cko/out is a plain directory, "
                    "bounded only when collected"
                },
            )
        spec = _container_spec(inv, target, out_dir, identity.host.host_id)
        if plan.workers:
            inv.companions = _stage_workers(inv.store, inv.id, plan, spec, inv.req.user)
        run, series = _run_sampled(inv, client, spec, target.uuids, say)
    return _Ran(run, series, identity, out_dir)


def _environment_identity(plan: Plan, client: Any, target: _Target) -> EnvironmentIdentity:
    hg, uuids = target.hg, target.uuids
    return EnvironmentIdentity(
        image=ImageIdentity(
            name=plan.image,
            ref=target.entry.tag,
            id=target.entry.image_id,
            repo_digests=list(client.images.get(target.entry.image_id).attrs.get("RepoDigests") or []),
        ),
        engine=engine_identity(client),
        passthrough=target.mode,
        driver_version=hg.driver_version if uuids else None,
        cuda_driver_version=hg.cuda_driver_version if uuids else None,
        devices=[dv for dv in hg.devices if dv.uuid in uuids],
        host=host_identity(),
    )


def _container_command(plan: Plan) -> list[str]:
    """The command as the container runs it: wrapped, `operations run` probes and checks the GPUs first."""
    if not plan.wrap:
        return plan.command
    return [
        "/opt/cko/bin/python",
        "-I",
        "-m",
        "operations",
        "run",
        "--meta",
        f"/cko/out/{META_DIR}",
        "--",
        *plan.command,
    ]


def _container_spec(inv: _Claimed, target: _Target, out_dir: Path, host_id: str) -> sandbox.ContainerSpec:
    plan, adm = inv.plan, inv.adm
    return sandbox.ContainerSpec(
        image_id=target.entry.image_id,
        command=_container_command(plan),
        mounts=[
            *(sandbox.Mount(m.source, m.target, m.read_only) for m in adm.mounts),
            sandbox.Mount(str(out_dir), "/cko/out", read_only=False),
        ],
        env={"CKO_INVOCATION": inv.id, **adm.env},
        user=inv.req.user,
        workdir=plan.workdir,
        limits=adm.limits,
        gpu=gpumod.grant(target.mode, target.uuids, target.hg),
        labels={
            f"{sandbox.LABEL}.store": str(inv.store.root),
            f"{sandbox.LABEL}.invocation": inv.id,
            f"{sandbox.LABEL}.controller-pid": str(os.getpid()),
            f"{sandbox.LABEL}.host": host_id,
        },
        timeout_s=adm.timeout_s,
        stop_grace_s=plan.stop_grace_s,
        cleanup_timeout_s=plan.cleanup_timeout_s,
    )


def _run_sampled(
    inv: _Claimed, client: Any, spec: sandbox.ContainerSpec, uuids: list[str], say: Callable[[str], None]
) -> tuple[sandbox.ContainerRun, dict[str, Any] | None]:
    """Run the container, with the GPU telemetry sampler (when asked for) following it."""
    plan = inv.plan
    sampler = None
    if plan.telemetry:
        from .telemetry import Sampler

        sampler = Sampler(uuids)
        sampler.start()
    inv.started_at = now_iso()
    say(f"running {plan.label or plan.op} in {plan.image} ({spec.image_id[7:19]})")
    cancel_marker = inv_dir(inv.store, inv.id) / "cancel"

    def on_event(name: str, data: dict[str, Any]) -> None:
        inv.ev(name, data)
        if sampler is not None and name == "container_started":
            sampler.container_ids.append(data["container_id"])

    try:
        run = sandbox.run(client, spec, on_event, cancelled=cancel_marker.exists, companions=inv.companions)
    finally:
        series = sampler.stop() if sampler else None
    return run, series


def _record_failed_start(inv: _Claimed, err: CkoError) -> None:
    """Record the result of an invocation whose container never ran to its end, release what it held,
    and name the invocation in the error about to be raised."""
    inv.ev("failed_to_start", {"error": err.code, "reason": err.message})
    res = InvocationResult(
        id=inv.id,
        op=inv.plan.op,
        state="failed" if err.exit_code != Exit.TIMED_OUT else "timed_out",
        exit_code=int(err.exit_code),
        reason=err.message,
        ended_at=now_iso(),
        request_sha256=inv.request_sha,
        events_sha256=_events_sha(inv.store, inv.id),
    )
    with inv.store.writer():
        _write_result(inv.store, inv.id, res)
    if inv.companions is not None:
        inv.companions.release_outputs()
    if inv.out_dir is not None:
        outdir.release(inv.out_dir.parent)
    err.detail = {"invocation": inv.id}


def _hand_back_worker_outputs(inv: _Claimed, out_dir: Path) -> None:
    """The stage's workers' log tails go to the events, their outputs into the supervisor's."""
    if inv.companions is None:
        return
    logs = inv.companions.logs
    inv.ev("worker_logs", {k: v[-2000:].decode("utf-8", "replace") for k, v in logs.items()})
    kept = inv.companions.hand_back(out_dir)
    if kept:
        inv.ev("worker_outputs", {"problems": kept})


def _record_terminal(
    inv: _Claimed, ran: _Ran, refs: list[ObjectRef], meta: dict[str, Any], problems: list[str]
) -> InvocationResult:
    """Store the streams and telemetry, write the terminal result (its events hashed last)."""
    store, run, identity = inv.store, ran.run, ran.identity
    state, code, reason = _terminal(run, meta, inv_dir(store, inv.id) / "cancel")
    with store.writer():
        so = store.put_bytes(run.stdout)
        se = store.put_bytes(run.stderr)
        tel_ref, tel_summary = _stored_telemetry(store, ran.series)
        probe = meta.get("probe.json")
        if isinstance(probe, dict):
            identity = _with_probe(identity, probe)
        res = InvocationResult(
            id=inv.id,
            op=inv.plan.op,
            state=state,
            exit_code=code,
            container_exit_code=run.exit_code,
            reason=reason
            if not problems
            else (reason or "") + ("; " if reason else "") + "; ".join(problems),
            started_at=inv.started_at,
            ended_at=now_iso(),
            duration_s=round(run.ended_at - run.started_at, 3),
            identity=identity,
            cleanup=run.cleanup.as_dict(),
            stdout_tail=run.stdout[-TAIL_CHARS:].decode("utf-8", "replace"),
            stderr_tail=run.stderr[-TAIL_CHARS:].decode("utf-8", "replace"),
            stdout=ObjectRef(sha256=so["sha256"], size=so["size"], name="stdout"),
            stderr=ObjectRef(sha256=se["sha256"], size=se["size"], name="stderr"),
            stdout_bytes=run.stdout_bytes,
            stderr_bytes=run.stderr_bytes,
            outputs=refs,
            probe=probe if isinstance(probe, dict) else None,
            telemetry=tel_ref,
            telemetry_summary=tel_summary,
            request_sha256=inv.request_sha,
            events_sha256=None,
        )
        inv.ev("terminal", {"state": state, "exit_code": code})
        res = res.model_copy(update={"events_sha256": _events_sha(store, inv.id)})
        _write_result(store, inv.id, res)
    return res


def _stored_telemetry(store: Store, series: dict[str, Any] | None) -> tuple[ObjectRef | None, Any]:
    """The sampled series as a stored object, and its summary for the result."""
    if series is None:
        return None, None
    t = store.put_json(series)
    return ObjectRef(sha256=t["sha256"], size=t["size"], name="telemetry.json"), series.get("summary")


def _with_probe(identity: EnvironmentIdentity, probe: dict[str, Any]) -> EnvironmentIdentity:
    """The identity with the tools the in-container probe found (and what it probed)."""
    seen = probe.get("probed")
    return identity.model_copy(
        update={
            "tools": probe.get("tools", {}),
            "probed": [str(x) for x in seen] if isinstance(seen, list) else None,
        }
    )


def ctl_directory(inv_id: str) -> Path:
    """A short, private directory for the freezer socket: a Unix socket's path must stay under 108
    bytes, which a store's scratch path (a pytest tmp dir, a fleet node's scratch) can pass."""
    import tempfile

    root = Path("/run/cko/ctl") if os.geteuid() == 0 else Path(tempfile.gettempdir())
    if os.geteuid() == 0:
        root.mkdir(mode=0o755, parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{inv_id[-8:]}-", dir=root))


def _stage_workers(
    store: Store, inv_id: str, plan: Plan, spec: sandbox.ContainerSpec, user: str
) -> StageWorkers:
    """The supervisor's container becomes the stage's meeting place; the controller's freezer
    service gets a socket that only the supervisor's container mounts."""
    sup_uid = int(user.partition(":")[0])
    ctl = FreezerService(ctl_directory(inv_id), owner_uid=sup_uid)
    spec.mounts.append(sandbox.Mount(str(ctl.directory), "/cko/ctl", read_only=True))
    spec.ipc_mode = "shareable"
    spec.shm_bytes = spec.limits.tmpfs_bytes
    spec.group_add = [w.gid for w in plan.workers]
    return StageWorkers(spec, plan.workers, ctl, scratch=store.scratch(inv_id))


def _terminal(
    run: sandbox.ContainerRun, meta: dict[str, Any], cancel_marker: Path
) -> tuple[TerminalState, int, str | None]:
    if run.cancelled or cancel_marker.exists():
        return "cancelled", int(Exit.FAILED), "cancelled by request"
    if run.timed_out:
        return "timed_out", int(Exit.TIMED_OUT), "command timed out"
    if run.engine_error:
        return "failed", int(Exit.UNAVAILABLE), f"engine error: {run.engine_error}"
    gpu_check = meta.get("gpu-check.json")
    if isinstance(gpu_check, dict) and not gpu_check.get("ok", True):
        return "failed", int(Exit.FAILED), str(gpu_check.get("reason"))
    if run.oom_killed:
        return "failed", int(Exit.FAILED), OOM_REASON
    if run.exit_code == 0:
        return "succeeded", int(Exit.DONE), None
    return "failed", int(Exit.FAILED), f"command exited with {run.exit_code}"


def reap_orphans(store: Store, client: Any | None = None) -> list[str]:
    """Find invocations whose controller died: remove their containers, record `abandoned`."""
    reaped: list[str] = []
    inv_root = store.invocations_dir
    if client is None:
        try:
            client = img.docker_client()
        except CkoError:
            client = None
    if client is not None:
        sandbox.reap_expired(client)
    by_inv: dict[str, list[Any]] = {}
    if client is not None:
        for c in sandbox.find_containers(client, str(store.root)):
            by_inv.setdefault(c.labels.get(f"{sandbox.LABEL}.invocation", ""), []).append(c)
    for d in sorted(inv_root.iterdir()) if inv_root.is_dir() else []:
        if (d / "result.json").exists() or not (d / "request.json").exists():
            continue
        if active_lock(store, d.name).is_held():
            continue
        cleanup: dict[str, Any] = {"container_removed": True, "found_containers": 0}
        for c in by_inv.pop(d.name, []):
            rep = sandbox.remove_container(client, c.id, grace=1, bound=20)
            cleanup = rep.as_dict() | {"found_containers": cleanup["found_containers"] + 1}
        ev = Events(d / "events.jsonl")
        ev("abandoned", {"reason": "controller gone", "cleanup": cleanup})
        try:
            req = json.loads((d / "request.json").read_text())
        except (OSError, ValueError):
            req = {}
        res = InvocationResult(
            id=d.name,
            op=str(req.get("op", "unknown")),
            state="abandoned",
            exit_code=int(Exit.FAILED),
            reason="the controller stopped before a terminal state",
            ended_at=now_iso(),
            cleanup=cleanup,
            request_sha256=sha256_file(d / "request.json"),
            events_sha256=_events_sha(store, d.name),
        )
        with contextlib.suppress(CkoError):
            with store.writer():
                _write_result(store, d.name, res)
            reaped.append(d.name)
        outdir.release(store.scratch(d.name))
    # Containers of invocations that already ended (or are unknown): remove.
    for inv, containers in by_inv.items():
        if inv and not (inv_root / inv / "result.json").exists() and active_lock(store, inv).is_held():
            continue
        for c in containers:
            sandbox.remove_container(client, c.id, grace=1, bound=20)
    return reaped


def load_result(store: Store, inv_id: str) -> InvocationResult | None:
    p = inv_dir(store, inv_id) / "result.json"
    if not p.exists():
        return None
    return InvocationResult.model_validate_json(p.read_bytes())


def wait_for_result(store: Store, inv_id: str, timeout: float) -> InvocationResult | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = load_result(store, inv_id)
        if r is not None:
            return r
        time.sleep(0.2)
    return load_result(store, inv_id)
