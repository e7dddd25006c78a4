"""The supervisor: the trusted side of a measurement, in its own container, never importing subject code.

It owns the harness's inputs, reference and accuracy check, and the schedule. Each subject runs in a
worker (operations.worker) in another container under another uid. For every timed block it:
  1. freezes every worker but the one to be timed (the host controller's cgroup freezer: the
     whole process tree of a worker's container, detached children included) and writes that
     worker's own copy of the inputs while it is frozen, so nothing of it sees them early;
  2. thaws it and times the command with its own monotonic clock (the bracket);
  3. reads the CPU time of every other worker's cgroup before and after (they were frozen: any
     change voids the sample) and, on a GPU, checks the device was idle before the window;
  4. accepts the worker's claimed time only when its own clock confirms it (`check_bracket`);
  5. fetches the output of checked runs into shared memory and compares it, itself, with the
     reference computed from inputs no subject touched.
Only the supervisor writes the result.
"""

from __future__ import annotations

import os
import secrets
import select
import shutil
import socket
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import codec
from .checktally import CheckTally
from .compare import compare, poison
from .gpuwatch import Clocks, GpuProbe, GpuWatch
from .integrity import (
    CALIBRATION_TRIES,
    IDLE_PROBE_CEILING_NS,
    LEFT_RUNNING_PERSIST_S,
    busy_at_start_code,
    check_bracket,
    check_post_cpu,
    check_staging,
    left_running,
    systematic_disagreement,
)
from .protocol import (
    UNIT_SCALE_TO_NS,
    DriverRequest,
    DriverResult,
    ScheduleItem,
    Series,
    WorkerSlot,
)
from .wire import (
    WORKER_MSG,
    Capture,
    CtlReply,
    CtlRequest,
    Drop,
    Fetch,
    Go,
    Hello,
    LineSocket,
    Ping,
    Quit,
    Reply,
    Run,
    Warm,
)

HELLO_TIMEOUT_S = 300.0
PING_ROUNDS = 30


class SupervisorError(RuntimeError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Ctl:
    """The host controller's freezer service, reached through the socket mounted at ctl_socket."""

    def __init__(self, path: str) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        self.conn = LineSocket(s)

    def call(self, op: str, worker: str | None = None) -> CtlReply:
        self.conn.send(CtlRequest(op=op, worker=worker))  # type: ignore[arg-type]
        reply = CtlReply.model_validate_json(self.conn.recv_line())
        if not reply.ok:
            raise SupervisorError("freezer_failed", f"host freezer: {op} {worker or ''}: {reply.error}")
        return reply


@dataclass
class WorkerConn:
    slot: WorkerSlot
    conn: LineSocket
    hello: Hello
    rtt_ns: int = 0
    in_dir: Path = Path()
    out_dir: Path = Path()
    serial: int = 0

    def call(self, cmd: Any, timeout: float, while_waiting: Callable[[], None] | None = None) -> Reply:
        """Send a command and wait for its reply; `while_waiting` runs repeatedly until the reply is there
        (the GPU idle probe during untimed commands)."""
        self.conn.sock.settimeout(timeout)
        self.conn.send(cmd)
        if while_waiting is not None:
            deadline = time.monotonic() + timeout
            while not self.conn.buf and not select.select([self.conn.sock], [], [], 0)[0]:
                if time.monotonic() > deadline:
                    break
                while_waiting()
        try:
            msg = WORKER_MSG.validate_json(self.conn.recv_line())
        except TimeoutError:
            raise SupervisorError(
                "worker_timed_out", f"worker {self.slot.subject}: no answer within {timeout:g}s"
            ) from None
        except ConnectionError as exc:
            raise SupervisorError("worker_died", f"worker {self.slot.subject}: {exc}") from None
        if not isinstance(msg, Reply):
            raise SupervisorError(
                "worker_protocol", f"worker {self.slot.subject} sent {msg.op} instead of a reply"
            )
        return msg


def _prepare_ipc(req: DriverRequest) -> tuple[Path, socket.socket]:
    """The shared-memory directory: traversable but not listable, one input and one output directory
    per worker readable only by that worker's group (the supervisor belongs to each)."""
    root = Path(req.ipc_dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(mode=0o711)
    os.chmod(root, 0o711)
    for w in req.workers:
        for kind, mode in (("in", 0o750), ("out", 0o770)):
            d = root / f"{kind}-{w.subject}"
            d.mkdir()
            os.chown(d, -1, w.gid)
            os.chmod(d, mode)
    path = root / "sup.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    os.chmod(path, 0o777)  # anyone may connect; who is who comes from SO_PEERCRED
    srv.listen(16)
    return root, srv


def _accept_workers(req: DriverRequest, srv: socket.socket, root: Path) -> dict[str, WorkerConn]:
    by_uid = {w.uid: w for w in req.workers}
    conns: dict[str, WorkerConn] = {}
    deadline = time.monotonic() + HELLO_TIMEOUT_S
    granted = sorted(u for u in os.environ.get("CKO_GRANTED_GPUS", "").split(",") if u)
    while len(conns) < len(req.workers):
        srv.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            sock, _ = srv.accept()
        except TimeoutError:
            missing = sorted(set(by_uid[u].subject for u in by_uid) - set(conns))
            raise SupervisorError(
                "worker_missing", f"no hello from worker(s) {', '.join(missing)} within {HELLO_TIMEOUT_S:g}s"
            ) from None
        ls = LineSocket(sock)
        slot = by_uid.get(ls.peer_uid())
        if slot is None or slot.subject in conns:
            ls.close()  # not a worker of this stage, or a second connection of one: ignored
            continue
        sock.settimeout(max(1.0, deadline - time.monotonic()))
        msg = WORKER_MSG.validate_json(ls.recv_line())
        if not isinstance(msg, Hello) or msg.subject != slot.subject:
            raise SupervisorError(
                "worker_protocol", f"uid {slot.uid} did not introduce itself as {slot.subject}"
            )
        if msg.error:
            raise SupervisorError(
                "subject_load_failed", f"subject {slot.subject} failed to load: {msg.error}"
            )
        if req.device == "cuda" and granted and sorted(msg.gpus) != granted:
            raise SupervisorError(
                "gpu_grant", f"worker {slot.subject} sees GPUs {msg.gpus}, granted {granted}"
            )
        conns[slot.subject] = WorkerConn(
            slot=slot,
            conn=ls,
            hello=msg,
            in_dir=root / f"in-{slot.subject}",
            out_dir=root / f"out-{slot.subject}",
        )
    return conns


def process_age_s() -> float | None:
    """Seconds since this process started (/proc/self/stat's start time against the boot clock)."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return round(max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK")), 3)


def host_cpu_ns() -> int:
    """Busy CPU time of the whole host (/proc/stat is not namespaced: a container reads the host's)."""
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return (sum(parts[:8]) - idle) * (1_000_000_000 // os.sysconf("SC_CLK_TCK"))


def foreign_cores(host_busy_ns: int, own_ns: int, wall_ns: int) -> float:
    """Cores other processes kept busy during a block: the host's busy time less this stage's own.

    /proc/stat counts in clock ticks (10 ms), so a single short block reads coarse, and may read
    below zero: the figure is left signed, since clamping each block would bias short blocks upwards.
    The balance test between the arms (runner/workflow/decide.py) pools blocks, weighted by wall."""
    if wall_ns <= 0:
        return 0.0
    return (host_busy_ns - own_ns) / wall_ns


class Laps:
    """Where the loop's wall goes, per part of a block, summed over the blocks (calibration
    `block_parts_s`): the window is a small share of it, and which other part dominates differs
    between a CPU host and a GPU (benchmarks/verdict_wall.py, boundary_cost.py print it)."""

    def __init__(self) -> None:
        self.total_ns: dict[str, int] = {}
        self.t = time.perf_counter_ns()

    def start(self) -> None:
        self.t = time.perf_counter_ns()

    def lap(self, part: str) -> None:
        now = time.perf_counter_ns()
        self.total_ns[part] = self.total_ns.get(part, 0) + now - self.t
        self.t = now

    def seconds(self) -> dict[str, float]:
        return {k: round(v / 1e9, 4) for k, v in self.total_ns.items()}


class Untimed:
    """Inside the untimed commands after a window (Fetch, Drop), summed over the blocks (calibration
    `untimed_parts_s`): the worker's own time, the supervisor's idle probes meanwhile and their count;
    the command's wall less the worker's is what the boundary adds (thaw, socket, probing)."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = {}

    def add(self, command: str, wall_ns: int, reply: Reply, watch: GpuWatch) -> None:
        for part, v in (
            ("wall_s", wall_ns / 1e9),
            ("worker_s", (reply.busy_ns or 0) / 1e9),
            ("probes_s", watch.probe_ns / 1e9),
            ("probes", float(watch.probes)),
            ("commands", 1.0),
        ):
            key = f"{command}: {part}"
            self.parts[key] = self.parts.get(key, 0.0) + v

    def seconds(self) -> dict[str, float]:
        return {k: round(v, 4) for k, v in self.parts.items()}


@dataclass
class SeriesState:
    reps: list[int] = field(default_factory=list)
    per_run_ns: list[int] = field(default_factory=list)
    window: list[int] = field(default_factory=list)  # the claimed block window, all runs
    bracket: list[int] = field(default_factory=list)
    stage: list[int] = field(default_factory=list)
    stream: list[int] = field(default_factory=list)
    idle: list[int] = field(default_factory=list)
    void: list[str] = field(default_factory=list)
    sm: list[list[int | None]] = field(default_factory=list)
    post: list[int] = field(default_factory=list)  # CPU ns of the fetch or drop after each block
    post_kind: list[str] = field(default_factory=list)
    capture: list[int] = field(default_factory=list)
    unexplained: list[bool] = field(default_factory=list)
    descheduled: int = 0
    foreign_cpu: list[float] = field(default_factory=list)
    foreign_ctx: list[int | None] = field(default_factory=list)
    throttle: list[list[str] | None] = field(default_factory=list)
    left_running: int = 0  # commands after which the device stayed busy with this subject frozen
    check: CheckTally = field(default_factory=CheckTally)


class Supervisor:
    def __init__(
        self,
        req: DriverRequest,
        make_inputs: Callable[..., Any],
        reference: Callable[[Any, Any], Any],
        extra: dict[str, tuple[str, Callable[[dict[str, Any], int], float]]],
        input_seed: Callable[..., int],
    ):
        self.req = req
        self.make_inputs = make_inputs
        self.reference = reference
        self.extra = extra
        self.input_seed = input_seed
        # Mixed into every input seed: a subject that knows the request's seed (its author wrote it)
        # still cannot know the inputs before its block, so nothing it computes ahead can be the
        # answer. The seeds used are recorded per series (Accuracy.input_seeds) for a replay.
        self.salt = secrets.randbits(62)
        self.cases = {c.id: c for c in req.cases}
        self.case_index = {c.id: i for i, c in enumerate(req.cases)}
        self.integrity: list[str] = []
        self.per: dict[tuple[str, str], SeriesState] = {}
        self.warmed: set[tuple[str, str]] = set()
        # keyed (case, rep, run): a block's runs each have inputs of their own (wire.Run)
        self.pristine: dict[tuple[str, int, int], Any] = {}
        self.expected: dict[tuple[str, int, int], Any] = {}
        self.run_bytes: dict[str, int] = {}
        self.active: str | None = None
        self.controller_cpu_ns: int | None = None  # the host freezer process's CPU, as of its last reply
        self.clocks = Clocks(req.device)
        self.probe: GpuProbe | None = None
        self.ctl: Ctl | None = None
        self.workers: dict[str, WorkerConn] = {}
        self.laps = Laps()
        self.untimed = Untimed()

    # -- set-up --------------------------------------------------------------------------------

    def start(self) -> dict[str, Any]:
        # The probe's CUDA context is made while the workers load, not after them (the fixed start).
        opening = ThreadPoolExecutor(1) if self.req.device == "cuda" else None
        probe = opening.submit(GpuProbe) if opening is not None else None
        try:
            return self._start(probe)
        finally:
            if opening is not None:
                opening.shutdown(wait=True)

    def _start(self, probe: Future[GpuProbe] | None) -> dict[str, Any]:
        root, srv = _prepare_ipc(self.req)
        self.ctl = Ctl(self.req.ctl_socket)
        roster = self.ctl.call("roster")
        want = {w.subject for w in self.req.workers}
        if set(roster.workers) != want:
            raise SupervisorError(
                "freezer_roster", f"host runs workers {roster.workers}, request names {sorted(want)}"
            )
        self.workers = _accept_workers(self.req, srv, root)
        srv.close()
        frozen = self.ctl.call("freeze_all")
        calibration: dict[str, Any] = {"cgroup": frozen.cgroup, "rtt_ns": {}}
        for sid, w in self.workers.items():
            self.activate(sid)
            rtts = []
            for _ in range(PING_ROUNDS):
                t0 = time.perf_counter_ns()
                w.call(Ping(), self.req.command_timeout_s)
                rtts.append(time.perf_counter_ns() - t0)
            rtts.sort()
            w.rtt_ns = rtts[int(0.9 * (len(rtts) - 1))]
            calibration["rtt_ns"][sid] = {"p50": rtts[len(rtts) // 2], "p90": w.rtt_ns}
        self.freeze_all()
        if probe is not None:
            try:
                made = probe.result()
                idle = made.calibrate()
            except Exception as exc:  # no torch in the image: the probe is absent and says so
                calibration["gpu_idle_probe"] = {"unavailable": f"{type(exc).__name__}: {exc}"[:200]}
            else:
                self.probe = made
                calibration["gpu_idle_probe"] = made.calibration | {"limit_ns": made.limit_ns}
                if not idle:
                    self.busy_at_start()
        return calibration

    def busy_at_start(self) -> None:
        """Every worker frozen, no block run yet, and the device still busy: a limit calibrated now
        would hide the very thing the probe looks for, so nothing is measured."""
        assert self.probe is not None
        foreign = self.foreign_contexts()
        raise SupervisorError(
            busy_at_start_code(foreign),
            f"the device stayed busy with every worker frozen before the first block (idle probe median "
            f"{self.probe.calibration['p50_ns']} ns over {CALIBRATION_TRIES} tries, an idle device's is "
            f"under {IDLE_PROBE_CEILING_NS} ns; other processes' contexts: {foreign}): "
            + (
                "work a subject started when it was loaded outlives it"
                if foreign == 0
                else "another process is using the device"
            ),
        )

    def foreign_contexts(self) -> int | None:
        """Compute contexts on the device other than this stage's own (the supervisor's, one per worker)."""
        ctx = self.clocks.contexts()
        return None if ctx is None else max(0, ctx - 1 - len(self.workers))

    def activate(self, subject: str) -> dict[str, int]:
        assert self.ctl is not None
        reply = self.ctl.call("activate", subject)
        self.active = subject
        self.controller_cpu_ns = reply.controller_cpu_ns
        return reply.usage_ns

    def freeze_all(self) -> dict[str, int]:
        assert self.ctl is not None
        reply = self.ctl.call("freeze_all")
        self.active = None
        self.controller_cpu_ns = reply.controller_cpu_ns
        return reply.usage_ns

    def usage(self) -> dict[str, int]:
        assert self.ctl is not None
        return self.ctl.call("usage").usage_ns

    # -- inputs --------------------------------------------------------------------------------

    def seed_for(self, case: str, rep: int, warm: bool = False, run: int = 0) -> int:
        """The input seed of one run of a rep (or warm-up block), with the stage's secret mixed in.
        Run 0's is the rep's seed, as a one-run block has always had; later runs' are drawn from it."""
        seed = self.input_seed(self.req.seed ^ self.salt, self.case_index[case], rep, warm)
        return seed if run == 0 else int(np.random.SeedSequence([seed, run]).generate_state(1)[0])

    def inputs_for(self, case: str, rep: int, warm: bool = False, run: int = 0) -> tuple[Any, int]:
        seed = self.seed_for(case, rep, warm, run)
        key = (case, -1 - rep if warm else rep, run)
        if key not in self.pristine:
            value = self.make_inputs(self.cases[case].params, np.random.default_rng(seed), self.req.device)
            poison(value)  # an `out` buffer starts as NaN: an output the subject never wrote cannot pass
            self.pristine[key] = value
        return self.pristine[key], seed

    def stage_copy(self, w: WorkerConn, value: Any) -> str:
        """The worker's own copy of the inputs, in its group-readable directory (it is frozen now)."""
        w.serial += 1
        d = w.in_dir / f"v{w.serial:06d}"
        d.mkdir(mode=0o750)
        os.chown(d, -1, w.slot.gid)
        codec.encode(value, d)
        for p in d.iterdir():
            os.chown(p, -1, w.slot.gid)
            os.chmod(p, 0o640)
        return str(d)

    def drop_old_copies(self, w: WorkerConn, keep: str | None) -> None:
        for d in w.in_dir.iterdir():
            if str(d) != keep:
                shutil.rmtree(d, ignore_errors=True)

    # -- the schedule --------------------------------------------------------------------------

    def warm(self, w: WorkerConn, case: str) -> None:
        """Untimed runs of this subject on this case, before its first timed block: one command per
        warm-up input, each ending in a synchronise, the worker frozen and the device probed after
        each. Work the subject leaves queued is then found after one synchronise's wait, not after
        every input's (a flood started in the warm-up cost 115 s of five waits on the H100)."""
        st = self.per.setdefault((w.slot.subject, case), SeriesState())
        for i in range(self.req.warmup):
            if self.req.device == "cuda":  # the worker makes its own from the seed: none here
                seed, dirs = self.seed_for(case, i, warm=True), []
            else:
                value, seed = self.inputs_for(case, i, warm=True)
                dirs = [self.stage_copy(w, value)]
            self.activate(w.slot.subject)
            reply = w.call(
                Warm(
                    case=case,
                    params=self.cases[case].params,
                    inputs=dirs,
                    seeds=[seed],
                    runs=self.req.runs_per_sample,
                    collect=i == self.req.warmup - 1,
                ),
                self.req.command_timeout_s,
            )
            if not reply.ok:
                raise SupervisorError(
                    "subject_failed", f"subject {w.slot.subject} failed warming up {case}: {reply.error}"
                )
            self.freeze_all()
            self.drop_old_copies(w, None)
            # each command ended in a synchronise: a busy device now is work that outlives it
            if self.probe is not None and self.probe.busy():
                self.note_left_running(st, f"{w.slot.subject}/{case}")

    def timed(self, item: ScheduleItem) -> None:
        """One timed block, then the output check or release, each while only this worker runs."""
        w = self.workers[item.subject]
        key = (item.subject, item.case)
        laps = self.laps
        laps.start()
        if key not in self.warmed:
            self.warm(w, item.case)
            self.warmed.add(key)
            laps.lap("warm-up")
        runs = range(self.req.runs_per_sample)
        seeds = [self.seed_for(item.case, item.rep, run=j) for j in runs]
        # cpu: a copy of each run's inputs; cuda: the worker makes them from the seeds (none made here)
        values = (
            [self.inputs_for(item.case, item.rep, run=j)[0] for j in runs]
            if self.req.device != "cuda"
            else []
        )
        laps.lap("inputs")
        if self.req.timing_mode == "graph":
            self.capture(w, item)
            laps.lap("capture")
        if self.active is not None:
            self.freeze_all()  # the worker about to be timed is frozen while its inputs are written
        inputs_dirs = [self.stage_copy(w, v) for v in values]
        laps.lap("stage copy")
        u0 = self.activate(item.subject)
        c0 = self.controller_cpu_ns
        busy = self.probe.busy() if self.probe is not None else ""
        sm0 = self.clocks.sm()
        h0, p0 = host_cpu_ns(), time.process_time_ns()
        cmd = Run(
            case=item.case,
            params=self.cases[item.case].params,
            rep=item.rep,
            seeds=seeds,
            inputs=inputs_dirs,
            mode=self.req.timing_mode,
            flush="supervisor" if self.flushes_l2() else "worker",
        )
        laps.lap("thaw and reads")
        t0 = time.perf_counter_ns()
        reply, flush_ns = self.window_call(w, cmd)
        bracket = time.perf_counter_ns() - t0
        laps.lap("bracket")
        u1 = self.freeze_all()  # at once: work the subject left running stops here
        h1, p1 = host_cpu_ns(), time.process_time_ns()
        sm1 = self.clocks.sm()
        # the stage's own CPU: the workers' cgroups, this process and the host's freezer process
        c1 = self.controller_cpu_ns
        ctl = c1 - c0 if c0 is not None and c1 is not None else 0
        own = sum(u1.get(s, 0) - u0.get(s, 0) for s in self.workers) + (p1 - p0) + ctl
        st_load = (foreign_cores(h1 - h0, own, bracket), self.clocks.contexts(), self.clocks.throttle())
        if not reply.ok or reply.t_ns is None:
            raise SupervisorError(
                "subject_failed",
                f"subject {item.subject} failed on {item.case} rep {item.rep}: {reply.error}",
            )
        after = self.probe.busy() if self.probe is not None else ""
        st = self.per.setdefault(key, SeriesState())
        void = busy or (after and f"after the window: {after}")
        self.record(st, item, w, reply, (bracket, flush_ns), u0, u1, void, [sm0, sm1])
        cpu, ctx, thr = st_load
        st.foreign_cpu.append(round(cpu, 3))
        # the stage's own contexts: the supervisor's and one per worker
        st.foreign_ctx.append(None if ctx is None else max(0, ctx - 1 - len(self.workers)))
        st.throttle.append(thr)
        if after:
            self.note_left_running(st, f"{item.subject}/{item.case}")
        laps.lap("freeze and record")
        self.release(w, st, item, u1)
        if inputs_dirs:
            self.drop_old_copies(w, None)
        laps.lap("freeze and clean")

    def flushes_l2(self) -> bool:
        """Whether the supervisor evicts L2 before each window: cold blocks on a GPU it can reach."""
        return self.req.timing_mode == "cold" and self.probe is not None

    def window_call(self, w: WorkerConn, cmd: Run) -> tuple[Reply, int]:
        """(the block's reply, the supervisor's own time inside the bracket): a Run, and where the
        supervisor evicts L2, its flush once the worker has staged and the Go that opens the window.
        The worker stays thawed meanwhile (a freeze and thaw would idle the device before the window);
        GPU work it adds slows the flush, which stays in the bracket the clock rules read."""
        reply = w.call(cmd, self.req.command_timeout_s)
        if cmd.flush != "supervisor" or not reply.ok:
            return reply, 0
        assert self.probe is not None
        flush_ns = self.probe.flush_l2()
        return w.call(Go(), self.req.command_timeout_s), flush_ns

    def release(self, w: WorkerConn, st: SeriesState, item: ScheduleItem, u1: dict[str, int]) -> None:
        """After a window: the output fetched for a check or dropped, in an untimed command of its own.

        The worker is thawed for that command only: the reference is made before it and the output is
        read and compared after the worker is frozen again, so no work of the subject's runs beside the
        supervisor's, and the file it reads cannot change while it is read. The worker's CPU time
        in the command is measured (work a subject deferred past its window would have to run here,
        see pair_checks), and the device is probed while it runs and once it is frozen."""
        check = self.reference_if_due(st, item)
        out_dir = self.fresh_out_dir(w) if check is not None else None
        self.activate(item.subject)
        self.laps.lap("thaw after the window")
        watch = GpuWatch(self.probe)
        if out_dir is not None:
            assert check is not None
            reply = self.untimed_call(w, Fetch(out=str(out_dir), run=check[0]), watch)
            self.laps.lap("check: fetch")
        else:
            reply = self.untimed_call(w, Drop(), watch)
            self.laps.lap("drop")
        u3 = self.freeze_all()
        # Once more now that it is frozen: a Drop answers in ~0.2 ms, so a thread of the subject's that
        # launched work just after the reply (and before the freeze) could otherwise go unseen.
        watch.once()
        if watch.busy and not st.void[-1]:
            st.void[-1] = f"during the fetch or release after the window: {watch.busy}"
        if watch.busy:
            self.note_left_running(st, f"{item.subject}/{item.case}")
        st.post.append(max(0, u3.get(item.subject, 0) - u1.get(item.subject, 0)))
        st.post_kind.append("fetch" if check is not None else "drop")
        self.laps.lap("freeze after the release")
        if out_dir is not None and check is not None:
            if not reply.ok:
                raise SupervisorError(
                    "subject_failed",
                    f"subject {item.subject}: output could not be passed back: {reply.error}",
                )
            self.check_output(st, item, check[1], out_dir, check[2])

    def note_left_running(self, st: SeriesState, where: str) -> None:
        """The device was found busy with this subject just frozen: confirm, count, and end the stage
        once `left_running` holds (an integrity violation: the subject's work outlives its commands)."""
        assert self.probe is not None
        why = self.probe.still_busy()
        if not why:
            return
        st.left_running += 1
        foreign = self.foreign_contexts()
        # how long it lasts is asked only where it could decide (no other tenant to explain it)
        busy_s = self.probe.busy_for(LEFT_RUNNING_PERSIST_S) if foreign == 0 else 0.0
        if left_running(st.left_running, foreign, busy_s):
            raise SupervisorError(
                "integrity_violation",
                f"{where}: the device stayed busy with the subject frozen after {st.left_running} of its "
                f"commands ({why}; then {busy_s:.1f} s without a break), and no other process held a "
                "context: its work outlives them",
            )

    def untimed_call(self, w: WorkerConn, cmd: Fetch | Drop, watch: GpuWatch) -> Reply:
        """A Fetch or Drop, the device probed while the worker answers; its parts go to `untimed`."""
        t0 = time.perf_counter_ns()
        reply = w.call(cmd, self.req.command_timeout_s, watch.poll)
        self.untimed.add(cmd.op, time.perf_counter_ns() - t0, reply, watch)
        return reply

    def capture(self, w: WorkerConn, item: ScheduleItem) -> None:
        """graph mode: the block's CUDA graph, captured on decoy inputs (wire.Capture) while only this
        worker runs, before the block's real inputs exist in it. Its time is the subject's launch
        cost: recorded apart (Series.capture_ns), never a sample."""
        self.activate(item.subject)
        cmd = Capture(
            case=item.case,
            params=self.cases[item.case].params,
            seed=secrets.randbits(62),
            runs=self.req.runs_per_sample,
        )
        reply = w.call(cmd, self.req.command_timeout_s)
        self.freeze_all()
        if not reply.ok:
            raise SupervisorError(
                "subject_failed",
                f"subject {item.subject} failed on {item.case} rep {item.rep}: {reply.error}",
            )
        self.per.setdefault((item.subject, item.case), SeriesState()).capture.append(reply.stage_ns or 0)

    def record(
        self,
        st: SeriesState,
        item: ScheduleItem,
        w: WorkerConn,
        reply: Reply,
        clock: tuple[int, int],
        u0: dict[str, int],
        u1: dict[str, int],
        void: str,
        sm: list[int | None],
    ) -> None:
        assert reply.t_ns is not None
        # the bracket, and the supervisor's own flush inside it: the worker answers for the rest (two
        # commands' round trips where the supervisor flushed)
        bracket, flush_ns = clock
        rtt = w.rtt_ns * (2 if flush_ns else 1)
        where = f"{item.subject}/{item.case}/rep {item.rep}"
        idle = sum(max(0, u1.get(s, 0) - u0.get(s, 0)) for s in self.workers if s != item.subject)
        worker_cpu = u1.get(item.subject, 0) - u0.get(item.subject, 0)
        kind, why = check_bracket(reply.t_ns, reply.stage_ns or 0, bracket - flush_ns, rtt, worker_cpu)
        if kind == "impossible":
            self.integrity.append(f"{where}: {why}")
        st.unexplained.append(kind == "unexplained")
        st.descheduled += kind == "descheduled"
        if kind == "unexplained":
            void = void or why
        if idle > 0:
            self.integrity.append(f"{where}: frozen worker(s) used {idle} ns of CPU during this block")
        st.reps.append(item.rep)
        st.per_run_ns.append(max(1, reply.t_ns // self.req.runs_per_sample))
        st.window.append(reply.t_ns)
        st.bracket.append(bracket)
        st.stage.append(reply.stage_ns or 0)
        st.stream.append(reply.stream_ns // self.req.runs_per_sample if reply.stream_ns is not None else 0)
        st.idle.append(idle)
        st.void.append(void)
        st.sm.append(sm)

    def reference_if_due(self, st: SeriesState, item: ScheduleItem) -> tuple[int, int, Any] | None:
        """(the run to check, its input seed, its reference), or None: no check of this block.

        Decided only now, after the block returned, so neither whether nor which run can be
        predicted; the reference is made here, from that run's pristine inputs, while every worker
        is frozen."""
        if not st.check.due(self.req.accuracy, self.req.mode == "smoke"):
            return None
        run = secrets.randbelow(self.req.runs_per_sample)
        key = (item.case, item.rep, run)
        value, seed = self.inputs_for(item.case, item.rep, run=run)
        if key not in self.expected:
            self.expected[key] = self.reference(self.cases[item.case].params, value)
        # one run's inputs and output: readiness caps a block's runs by it (each run has its own)
        self.run_bytes[item.case] = codec.nbytes(value) + codec.nbytes(self.expected[key])
        self.laps.lap("check: reference")
        return run, seed, self.expected[key]

    def fresh_out_dir(self, w: WorkerConn) -> Path:
        """An empty directory the worker's group may write its output into."""
        out_dir = w.out_dir / f"o{w.serial:06d}"
        shutil.rmtree(out_dir, ignore_errors=True)
        out_dir.mkdir(mode=0o770)
        os.chown(out_dir, -1, w.slot.gid)
        os.chmod(out_dir, 0o770)
        return out_dir

    def check_output(
        self, st: SeriesState, item: ScheduleItem, seed: int, out_dir: Path, expected: Any
    ) -> None:
        """The fetched output against the reference, read with the worker frozen (it cannot rewrite
        the file while it is read), bounded by what the reference's size allows."""
        try:
            output = codec.decode(
                out_dir, max_bytes=4 * max(codec.nbytes(expected), 1 << 20) + (64 << 20), device_ok=False
            )
            self.laps.lap("check: decode")
            rel, mx, detail = compare(output, expected)
        except codec.CodecError as exc:
            rel, mx, detail = float("inf"), float("inf"), f"output refused: {exc}"
        shutil.rmtree(out_dir, ignore_errors=True)
        self.laps.lap("check: compare")
        st.check.add(self.req.accuracy, item.rep, seed, rel, mx, detail)

    def forget(self, item: ScheduleItem) -> None:
        """Drop a rep's inputs and references once every subject has run it."""
        done = all(item.rep in self.per.get((s, item.case), SeriesState()).reps for s in self.workers)
        if done:
            for store in (self.pristine, self.expected):
                for key in [k for k in store if k[:2] == (item.case, item.rep)]:
                    del store[key]

    def systematic_checks(self) -> None:
        for (subject, case), st in self.per.items():
            if systematic_disagreement(st.unexplained):
                self.integrity.append(
                    f"{subject}/{case}: {sum(st.unexplained)} of {len(st.unexplained)} blocks took "
                    f"longer on the supervisor's clock than the worker's claims explain"
                )

    def pair_checks(self) -> None:
        """Rules that hold one subject's untimed work next to the other's for the same inputs:
        staging before the window, and the CPU of the fetch or release after it."""
        subjects = list(self.workers)
        if len(subjects) != 2:
            return
        for case in self.cases:
            a, b = self.per.get((subjects[0], case)), self.per.get((subjects[1], case))
            if a is None or b is None:
                continue
            for mine, other, name in ((a, b, subjects[0]), (b, a, subjects[1])):
                other_stage = dict(zip(other.reps, other.stage, strict=True))
                typical = {
                    k: sorted(p for p, kk in zip(other.post, other.post_kind, strict=True) if kk == k)
                    for k in ("fetch", "drop")
                }
                for i, rep in enumerate(mine.reps):
                    why = check_staging(mine.stage[i], other_stage[rep]) if rep in other_stage else ""
                    same = typical[mine.post_kind[i]]
                    why = why or check_post_cpu(mine.post[i], same[len(same) // 2] if same else 0)
                    if why and not mine.void[i]:
                        mine.void[i] = f"{name}: {why}"

    def quit(self) -> None:
        for w in self.workers.values():
            try:
                if self.ctl is not None:
                    self.activate(w.slot.subject)
                w.conn.send(Quit())
            except Exception:
                pass
            w.conn.close()

    # -- the result ----------------------------------------------------------------------------

    def series(self) -> list[Series]:
        out = []
        for (subject, case_id), st in self.per.items():
            params = self.cases[case_id].params
            samples: dict[str, list[float]] = {}
            for m in self.req.metrics:
                if m.name in self.extra:
                    samples[m.name] = [float(self.extra[m.name][1](params, t)) for t in st.per_run_ns]
                else:
                    samples[m.name] = [t / UNIT_SCALE_TO_NS[m.unit] for t in st.per_run_ns]
            acc = st.check.record(self.req.accuracy)
            out.append(
                Series(
                    subject=subject,
                    case=case_id,
                    reps=st.reps,
                    samples=samples,
                    wall_ns=st.bracket,
                    stream_ns=st.stream if self.req.device == "cuda" else [],
                    sm_mhz=st.sm,
                    accuracy=acc,
                    bracket_ns=st.bracket,
                    stage_ns=st.stage,
                    window_ns=st.window,
                    idle_cpu_ns=st.idle,
                    void=st.void,
                    post_cpu_ns=st.post,
                    foreign_cpu_cores=st.foreign_cpu,
                    foreign_gpu_contexts=st.foreign_ctx if self.req.device == "cuda" else [],
                    throttle=st.throttle if self.req.device == "cuda" else [],
                    runs=self.req.runs_per_sample,
                    timing_mode=self.req.timing_mode,
                    capture_ns=st.capture,
                    l2_flush=("supervisor" if self.flushes_l2() else "worker")
                    if self.req.timing_mode == "cold" and self.req.device == "cuda"
                    else "none",
                )
            )
        return out


def supervise(
    req: DriverRequest,
    make_inputs: Callable[..., Any],
    reference: Callable[[Any, Any], Any],
    extra: dict[str, tuple[str, Callable[[dict[str, Any], int], float]]],
    input_seed: Callable[..., int],
    units: dict[str, str],
    environment: Callable[[], dict[str, str]],
    timing: str,
) -> DriverResult:
    t0 = time.monotonic()
    before = process_age_s()  # the interpreter's start and the driver's imports, before this clock
    sup = Supervisor(req, make_inputs, reference, extra, input_seed)
    try:
        calibration = sup.start()
        t1 = time.monotonic()
        for item in req.schedule:
            sup.timed(item)
            sup.forget(item)
        # what the boundary costs: the fixed start (workers' hello, calibration) and the loop's wall
        # beside the time inside the workers' windows (benchmarks/boundary_cost.py)
        calibration["setup_s"] = round(t1 - t0, 4)
        calibration["loop_s"] = round(time.monotonic() - t1, 4)
        calibration["blocks"] = len(req.schedule)
        calibration["run_bytes"] = sup.run_bytes
        calibration["block_parts_s"] = sup.laps.seconds()
        calibration["untimed_parts_s"] = sup.untimed.seconds()
        t2 = time.monotonic()
        sup.pair_checks()
        sup.systematic_checks()
        calibration["before_s"] = before
        calibration["checks_s"] = round(time.monotonic() - t2, 4)
    finally:
        sup.quit()
    workers = [
        {
            "subject": s,
            "pid": w.hello.pid,
            "load_s": w.hello.load_s,
            "gpus": w.hello.gpus,
            "uid": w.slot.uid,
            "rtt_p90_ns": w.rtt_ns,
        }
        for s, w in sup.workers.items()
    ]
    return DriverResult(
        protocol=req.protocol,
        mode=req.mode,
        series=sup.series(),
        # read at the end: it initialises CUDA in this process (torch.cuda), which before the clock
        # would lengthen the stage's fixed start; by now the idle probe has done so anyway
        environment=environment(),
        units=units,
        integrity=sup.integrity,
        timing=timing,
        boundary="workers",
        workers=workers,
        calibration=calibration,
    )
