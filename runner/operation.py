"""One in-container operation (`python -I -m operations OP ...`) through the executor seam.

Every operation takes one path: a request model → an Executor (`runner/executor.py`: this host, or
a fleet node) → an Invocation → a result model. A measurement's request is its Target and schedule
(`workflow/measure.py`); an evidence operation's (a profiler report's parse, compiler output, an
execution map) is `OperationRequest`. `run_operation` stages its inputs, lowers it to the Plan every
executor runs (`OperationRequest.plan`) and reads the invocation back as an `OperationResult`.

Inputs are private copies in the store's scratch, mounted read-only at /cko/in/<name>: on a fleet
they are shipped to the node like a measurement's harness. The operation writes
/cko/out/result.json, which comes back with the invocation's outputs wherever it ran.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from . import hostpath
from .errors import CkoError, failed
from .executor import LOCAL, Executor
from .invocation import OOM_REASON, Outcome, Plan
from .models import Closed, ObjectRef
from .policy import load_policy
from .records import TerminalState
from .sandbox import Mount
from .store import Store, new_id

INPUT_ROOT = "/cko/in"
OPERATION = ["/opt/cko/bin/python", "-I", "-m", "operations"]


class OperationRequest(Closed):
    """One in-container operation as asked: what runs, on which files, within which limits."""

    op: str = Field(pattern=r"^[a-z][a-z0-9-]*$")  # a module of operations/ops (hyphens for _)
    args: list[str] = Field(default_factory=list)  # its arguments; inputs are named at /cko/in/<name>
    inputs: dict[str, Path] = Field(default_factory=dict)  # host files, copied and mounted read-only
    image: str = "cpu"
    gpus: list[str] = Field(default_factory=list)  # UUIDs or indexes; on a fleet, a count
    timeout_s: float = Field(default=600.0, gt=0)
    label: str = ""
    counters: bool = False
    memory: str | None = None  # None: the policy's default
    parent: dict[str, Any] | None = None  # the record it serves (a collection, for a parse)
    policy_path: str | None = None

    @field_validator("inputs")
    @classmethod
    def _plain_names(cls, v: dict[str, Path]) -> dict[str, Path]:
        # A name is one path component under /cko/in: no way out of it, nothing hidden.
        bad = [n for n in v if not n or "/" in n or n.startswith(".")]
        if bad:
            raise ValueError(f"bad input name {bad[0]!r}")
        return v

    def plan(self, mounts: list[Mount]) -> Plan:
        """The Plan an executor runs: the operation's command with the staged inputs mounted."""
        image = self.image
        if image == "cpu":  # a GPU host built without the cpu image parses in the cuda image instead
            image = os.environ.get("CKO_PARSE_IMAGE", "cpu")
        return Plan(
            op=self.op,
            command=[*OPERATION, self.op, *self.args, "--out", "/cko/out"],
            image=image,
            gpus=list(self.gpus),
            mounts=mounts,
            timeout_s=self.timeout_s,
            label=self.label or self.op,
            counters=self.counters,
            memory=self.memory,
            parent=self.parent,
            policy_path=self.policy_path,
        )


class OperationResult(Closed):
    """What the operation's invocation left: its terminal state and the document it wrote."""

    invocation_id: str
    op: str
    state: TerminalState
    exit_code: int  # the container's exit code; -1 when it never reached one
    doc: dict[str, Any] | None = None  # /cko/out/result.json, when it is a JSON object
    outputs: list[ObjectRef] = Field(default_factory=list)
    reason: str | None = None
    stderr_tail: str = ""
    where: dict[str, Any] | None = None  # the fleet node that ran it (Outcome.where); None: this host


def run_operation(
    store: Store,
    req: OperationRequest,
    executor: Executor = LOCAL,
    progress: Callable[[str], None] | None = None,
) -> OperationResult:
    """Run `req` to a terminal state on `executor` and read its result back (refusals are raised)."""
    # cko's own staging, in the store's scratch: the only kind of path a container mounts.
    staging = store.scratch(new_id("stg"))
    staging.mkdir(parents=True, mode=0o700)
    try:
        mounts = stage_inputs(req, staging)
        outcome = executor(store, req.plan(mounts), progress=progress, keep_outputs=True)
        try:
            return read_result(req, outcome)
        finally:
            outcome.close()
    finally:
        hostpath.remove_tree(staging)


def stage_inputs(req: OperationRequest, staging: Path) -> list[Mount]:
    """A private copy of each input, read by descriptor (resolved once, no link followed, within
    the policy's mount_roots, a regular file): the container sees exactly the bytes cko read, even
    if the source changes meanwhile."""
    policy, _ = load_policy(req.policy_path)
    mounts = []
    for name, src in req.inputs.items():
        dst = staging / name
        dst.write_bytes(hostpath.read_file(src, name, policy))
        dst.chmod(0o644)
        mounts.append(Mount(str(dst), f"{INPUT_ROOT}/{name}", read_only=True))
    staging.chmod(0o755)  # readable by the container's non-root user once complete
    return mounts


def read_result(req: OperationRequest, outcome: Outcome) -> OperationResult:
    """The invocation as an OperationResult; a parse stopped at its memory limit is an error."""
    doc = outcome.read_json("result.json")
    res = outcome.result
    if not isinstance(doc, dict) and res.reason == OOM_REASON:
        raise _out_of_memory(req, outcome.id)
    return OperationResult(
        invocation_id=outcome.id,
        op=req.op,
        state=res.state,
        exit_code=res.container_exit_code if res.container_exit_code is not None else -1,
        doc=doc if isinstance(doc, dict) else None,
        outputs=list(res.outputs),
        reason=res.reason,
        stderr_tail=res.stderr_tail,
        where=outcome.where,
    )


def _out_of_memory(req: OperationRequest, inv_id: str) -> CkoError:
    # Parsing holds the report in memory (a torch trace whole, plus its kept events), so a report
    # large enough meets the limit: every caller says so, naming the option.
    return failed(
        f"{req.op}: the parse was stopped at its memory limit of {req.memory or 'the policy default'} "
        f"(invocation {inv_id}); a larger --memory, within the policy's max_memory, lets it finish",
        code="out_of_memory",
        field="memory",
    )
