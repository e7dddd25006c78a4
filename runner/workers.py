"""A measuring stage's worker containers and the freezer service the supervisor calls (host side).

The invocation's own container runs cko's supervisor (operations.supervisor). Once it has
started, the controller starts one worker container per subject: the same image and hardening,
its own uid and group, only that subject's snapshot and the harness mounted, and the
supervisor's IPC namespace (its /dev/shm, where their socket and the input copies live). The
supervisor asks, over a socket only its container has, to freeze every worker but one and for
their cgroups' CPU time (runner.freezer). The controller answers only for this stage's workers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cko_perf.operations.wire import CtlReply, CtlRequest, LineSocket

from . import outdir, sandbox
from .freezer import Cgroup, FreezerError

WORKER_UID_BASE = 61000
LOG_TAIL = 64 * 1024
START_WAIT_S = 120.0


@dataclass
class WorkerLaunch:
    """One subject's worker: what the controller starts beside the supervisor."""

    subject: str
    uid: int
    command: list[str]
    mounts: list[sandbox.Mount]
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/cko/harness"
    # Files a profiler inside this worker writes under its own /cko/out (a collection run only): the
    # area is as bounded as the supervisor's, and only these names, regular files, come back.
    keep: tuple[str, ...] = ()

    @property
    def gid(self) -> int:
        return self.uid


class FreezerService:
    """Serves CtlRequests from the supervisor on a Unix socket in a directory only it mounts."""

    def __init__(self, directory: Path, owner_uid: int | None) -> None:
        self.directory = directory
        self.path = directory / "ctl.sock"
        self.cgroups: dict[str, Cgroup] = {}
        self.expected: list[str] = []
        self.errors: dict[str, str] = {}
        self.lock = threading.Lock()
        self.ready = threading.Condition(self.lock)
        directory.mkdir(parents=True, exist_ok=True)
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(str(self.path))
        if owner_uid is not None and os.geteuid() == 0:
            os.chown(directory, owner_uid, -1)
            os.chown(self.path, owner_uid, -1)
            os.chmod(directory, 0o700)
            os.chmod(self.path, 0o600)
        else:
            os.chmod(directory, 0o755)
            os.chmod(self.path, 0o666)
        self.srv.listen(2)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True, name="cko-freezer")
        self.thread.start()

    def register(self, subject: str, cgroup: Cgroup | None, error: str | None = None) -> None:
        with self.ready:
            if cgroup is not None:
                self.cgroups[subject] = cgroup
            if error:
                self.errors[subject] = error
            self.ready.notify_all()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                sock, _ = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self._client, args=(LineSocket(sock),), daemon=True).start()

    def _client(self, conn: LineSocket) -> None:
        with contextlib.closing(conn.sock):
            while not self.stopped.is_set():
                try:
                    req = CtlRequest.model_validate_json(conn.recv_line())
                except Exception:
                    return
                conn.send(self.answer(req))

    def answer(self, req: CtlRequest) -> CtlReply:
        with self.ready:
            if req.op == "roster":
                return CtlReply(
                    ok=not self.errors,
                    workers=sorted(self.expected),
                    error="; ".join(f"{k}: {v}" for k, v in self.errors.items()) or None,
                )
            # a worker can say hello before the controller has registered its cgroup: wait for it
            self.ready.wait_for(
                lambda: self.errors or set(self.cgroups) == set(self.expected), timeout=START_WAIT_S
            )
            if self.errors:
                return CtlReply(ok=False, error="; ".join(f"{k}: {v}" for k, v in self.errors.items()))
            if set(self.cgroups) != set(self.expected):
                missing = sorted(set(self.expected) - set(self.cgroups))
                return CtlReply(ok=False, error=f"worker(s) not started: {', '.join(missing)}")
            try:
                if req.op == "activate":
                    if req.worker not in self.cgroups:
                        return CtlReply(ok=False, error=f"no worker {req.worker!r}")
                    for name, cg in self.cgroups.items():  # freeze the others before thawing one
                        if name != req.worker:
                            cg.set_frozen(True)
                    self.cgroups[req.worker].set_frozen(False)
                elif req.op == "freeze_all":
                    for cg in self.cgroups.values():
                        cg.set_frozen(True)
                return CtlReply(
                    ok=True,
                    workers=sorted(self.cgroups),
                    usage_ns={n: cg.usage_ns() for n, cg in self.cgroups.items()},
                    frozen={n: cg.frozen() for n, cg in self.cgroups.items()},
                    controller_cpu_ns=time.process_time_ns(),
                    cgroup=next(iter(self.cgroups.values())).kind if self.cgroups else None,
                )
            except (OSError, FreezerError) as exc:
                return CtlReply(ok=False, error=str(exc))

    def thaw_all(self) -> None:
        with self.lock:
            for cg in self.cgroups.values():
                with contextlib.suppress(OSError, FreezerError):
                    cg.set_frozen(False)

    def close(self) -> None:
        self.stopped.set()
        with contextlib.suppress(OSError):
            self.srv.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.srv.close()
        shutil.rmtree(self.directory, ignore_errors=True)


class StageWorkers:
    """Starts the workers once the supervisor's container runs; removes them (thawed) at the end."""

    def __init__(
        self,
        base: sandbox.ContainerSpec,
        launches: list[WorkerLaunch],
        ctl: FreezerService,
        scratch: Path | None = None,
    ) -> None:
        self.base = base
        self.launches = launches
        self.ctl = ctl
        ctl.expected = [w.subject for w in launches]
        self.containers: dict[str, Any] = {}
        self.logs: dict[str, bytes] = {}
        self.scratch = scratch  # where the output areas of workers that keep files are made
        self.out_dirs: dict[str, Path] = {}

    def _out_mount(self, w: WorkerLaunch) -> list[sandbox.Mount]:
        if not w.keep:
            return []
        if self.scratch is None:
            raise RuntimeError("a worker that keeps files needs the stage's scratch directory")
        out, _bounded = outdir.make(self.scratch / f"w-{w.uid}", f"{w.uid}:{w.gid}", self.base.limits)
        self.out_dirs[w.subject] = out
        return [sandbox.Mount(str(out), "/cko/out", read_only=False)]

    def hand_back(self, into: Path) -> list[str]:
        """Copy each worker's kept files into the invocation's own output area (as bounded as the
        worker's), then release the workers' areas; problems are returned, never raised."""
        problems: list[str] = []
        for w in self.launches:
            src = self.out_dirs.get(w.subject)
            for name in w.keep if src is not None else ():
                assert src is not None
                problems += outdir.copy_regular(src / name, into / name, f"{w.subject}: {name}")
        self.release_outputs()
        return problems

    def release_outputs(self) -> None:
        for src in self.out_dirs.values():
            outdir.release(src.parent)
        self.out_dirs.clear()

    def spec_for(self, w: WorkerLaunch, supervisor_id: str) -> sandbox.ContainerSpec:
        return sandbox.ContainerSpec(
            image_id=self.base.image_id,
            command=w.command,
            mounts=[*w.mounts, *self._out_mount(w)],
            env={**self.base.env, **w.env},
            user=f"{w.uid}:{w.gid}",
            workdir=w.workdir,
            limits=self.base.limits,
            gpu=self.base.gpu,
            labels={**self.base.labels, f"{sandbox.LABEL}.worker": w.subject},
            timeout_s=self.base.timeout_s,
            ipc_mode=f"container:{supervisor_id}",
        )

    def start(self, client: Any, supervisor: Any, on_event: Any) -> None:
        """Every worker at once (a container's create and start is ~0.2 s on a CPU host and more where
        the GPU's hooks run, paid once instead of once per subject); returns when all have started or
        failed, so `stop` never races a container still being made."""
        with ThreadPoolExecutor(
            max_workers=max(1, len(self.launches)), thread_name_prefix="cko-start"
        ) as pool:
            for f in [pool.submit(self._start_one, client, supervisor, w, on_event) for w in self.launches]:
                f.result()

    def _start_one(self, client: Any, supervisor: Any, w: WorkerLaunch, on_event: Any) -> None:
        try:
            c = client.containers.create(**sandbox.container_kwargs(self.spec_for(w, supervisor.id)))
            self.containers[w.subject] = c
            c.start()
            c.reload()
            self.ctl.register(w.subject, Cgroup.of_pid(int(c.attrs["State"]["Pid"])))
            on_event("worker_started", {"subject": w.subject, "container_id": c.id[:12], "uid": w.uid})
        except Exception as exc:  # recorded for the supervisor, which fails the stage with it
            self.ctl.register(w.subject, None, f"{type(exc).__name__}: {exc}"[:500])
            on_event("worker_failed", {"subject": w.subject, "error": str(exc)[:300]})

    def stop(self, client: Any, on_event: Any) -> None:
        self.ctl.thaw_all()  # a frozen task cannot die: thaw before removing
        self.ctl.close()
        for subject, c in self.containers.items():
            with contextlib.suppress(Exception):
                self.logs[subject] = c.logs(stdout=True, stderr=True, tail=200)[-LOG_TAIL:]
            rep = sandbox.remove_container(client, c.id, grace=1, bound=20)
            on_event("worker_removed", {"subject": subject} | rep.as_dict())
