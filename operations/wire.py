"""Messages across the measuring boundary, one pydantic model each, as JSON lines on a Unix socket.

Two conversations:
- supervisor <-> worker (inside the stage's containers, a socket in the shared /dev/shm): the
  supervisor commands, a worker answers. The worker is untrusted: every reply is validated and
  bounded, and a worker is known by the uid the kernel reports for its socket (SO_PEERCRED),
  never by what it says.
- supervisor <-> host controller (a socket the controller owns, mounted only into the supervisor's
  container): freeze and thaw a worker's container, read its CPU time from its cgroup.
"""

from __future__ import annotations

import socket
import struct
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

MAX_LINE = 1 << 20


class Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# -- supervisor -> worker ----------------------------------------------------------------------


class Warm(Msg):
    """Untimed runs of one case: imports, JIT and compilation happen here, once per stage."""

    op: Literal["warm"] = "warm"
    case: str
    params: dict[str, object]
    inputs: list[str] = Field(description="one input directory per warm-up run (cpu), or empty (regenerate)")
    seeds: list[int] = Field(description="input seeds per warm-up run (regenerated inputs)")
    runs: int = Field(ge=0, le=100_000, description="back-to-back runs per warm-up block")
    collect: bool = Field(
        default=True, description="collect garbage after it (the last of a warm-up's commands)"
    )


class Run(Msg):
    """One timed block: back-to-back runs of the subject, run i on its own inputs (seeds[i]).

    Inputs of their own per run: a subject that keeps an answer per input (or per buffer) would
    compute only the first of a block's runs on one set, and its block would time one run's work
    spread over all of them. Every run's output is kept until the Fetch or Drop after the block."""

    op: Literal["run"] = "run"
    case: str
    params: dict[str, object]
    rep: int
    seeds: list[int] = Field(min_length=1, max_length=1_000_000, description="one input seed per run")
    inputs: list[str] = Field(
        default_factory=list, description="one input directory per run (cpu), or empty: regenerate from seeds"
    )
    mode: Literal["cold", "hot", "graph"] = "cold"
    # cold: who evicts L2 between the staging and the window. "worker": the worker's clock code
    # does, and the subject, in that process, could make it a no-op. "supervisor": the worker
    # stages, replies, and waits for a Go; the supervisor evicts L2 from its own CUDA context
    # in between, where no subject code runs.
    flush: Literal["worker", "supervisor"] = "worker"

    @model_validator(mode="after")
    def _one_dir_per_run(self) -> Run:
        if self.inputs and len(self.inputs) != len(self.seeds):
            raise ValueError(f"inputs: {len(self.inputs)} directories for {len(self.seeds)} runs")
        return self


class Go(Msg):
    """Time the block the last Run (flush "supervisor") staged and held: its window opens now."""

    op: Literal["go"] = "go"


class Capture(Msg):
    """graph mode: capture the next block's `runs` runs as one CUDA graph, on decoy inputs.

    A command of its own, before the block's Run: the capture is the subject's CPU work (its launch
    cost), untimed, and the block's real inputs (Run.seed, drawn secretly by the supervisor) do
    not exist in the worker yet, so nothing computed here can be the block's answer. The Run then
    writes the real inputs into the captured buffers and times one replay."""

    op: Literal["capture"] = "capture"
    case: str
    params: dict[str, object]
    seed: int = Field(description="the decoy inputs' seed (run i's decoys: seed + i)")
    runs: int = Field(default=1, ge=1, le=1_000_000)


class Fetch(Msg):
    """Write the output of one run of the last block into `out` (for the supervisor's accuracy
    check); which run is drawn by the supervisor after the block returned."""

    op: Literal["fetch"] = "fetch"
    out: str
    run: int = Field(default=0, ge=0)


class Drop(Msg):
    """Release the last run's output and inputs (untimed: their release stays out of the next bracket)."""

    op: Literal["drop"] = "drop"


class Ping(Msg):
    op: Literal["ping"] = "ping"


class Quit(Msg):
    op: Literal["quit"] = "quit"


Command = Annotated[Warm | Capture | Run | Go | Fetch | Drop | Ping | Quit, Field(discriminator="op")]
COMMAND: TypeAdapter[Warm | Capture | Run | Go | Fetch | Drop | Ping | Quit] = TypeAdapter(Command)


# -- worker -> supervisor ----------------------------------------------------------------------


class Hello(Msg):
    op: Literal["hello"] = "hello"
    subject: str
    pid: int
    gpus: list[str] = Field(default_factory=list, description="GPU UUIDs the worker sees")
    load_s: float = 0.0
    error: str | None = None


class Reply(Msg):
    """A worker's answer. Times are the worker's claims; the supervisor bounds them with its clock."""

    op: Literal["reply"] = "reply"
    ok: bool
    error: str | None = Field(default=None, max_length=4000)
    t_ns: int | None = Field(default=None, description="timed window (device events or perf_counter_ns)")
    stage_ns: int | None = Field(default=None, ge=0, description="input staging before the window")
    stream_ns: int | None = None
    busy_ns: int | None = Field(
        default=None, ge=0, description="an untimed command's own time in the worker (Fetch, Drop)"
    )


WorkerMsg = Annotated[Hello | Reply, Field(discriminator="op")]
WORKER_MSG: TypeAdapter[Hello | Reply] = TypeAdapter(WorkerMsg)


# -- supervisor <-> host controller --------------------------------------------------------------


class CtlRequest(Msg):
    op: Literal["roster", "activate", "freeze_all", "usage"]
    worker: str | None = Field(default=None, description="activate: the one worker left running")


class CtlReply(Msg):
    ok: bool
    error: str | None = None
    workers: list[str] = Field(default_factory=list)
    usage_ns: dict[str, int] = Field(
        default_factory=dict, description="CPU time of each worker's whole cgroup"
    )
    frozen: dict[str, bool] = Field(default_factory=dict)
    controller_cpu_ns: int | None = Field(
        default=None,
        description="CPU time of the host process that freezes and accounts the workers: the "
        "stage's own work, not foreign load",
    )
    cgroup: str | None = Field(
        default=None, description="how freezing is done: cgroup-v1 freezer or cgroup-v2"
    )


# -- framing -----------------------------------------------------------------------------------


class LineSocket:
    """JSON lines over a stream socket, each line at most MAX_LINE bytes."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def send(self, msg: BaseModel) -> None:
        self.sock.sendall(msg.model_dump_json().encode() + b"\n")

    def recv_line(self) -> bytes:
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[: i + 1]
                return line
            if len(self.buf) > MAX_LINE:
                raise ConnectionError("message longer than 1 MiB")
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("peer closed the connection")
            self.buf += chunk

    def peer_uid(self) -> int:
        """The uid the kernel records for the other end (not anything it says)."""
        creds = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        return int(uid)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
