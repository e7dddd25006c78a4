"""Invocation records (request.json, result.json) — the per-run evidence every operation leaves."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .identity import EnvironmentIdentity
from .models import Closed, ObjectRef

TerminalState = Literal["succeeded", "failed", "timed_out", "cancelled", "refused", "abandoned"]


class MountSpec(Closed):
    source: str
    target: str
    read_only: bool = True


class LimitsSpec(Closed):
    memory_bytes: int
    pids: int
    cpus: float | None = None
    tmpfs_bytes: int


class InvocationRequest(Closed):
    """What was asked: written before anything starts (request.json)."""

    kind: Literal["cko/invocation-request-v1"] = "cko/invocation-request-v1"
    id: str
    op: str
    label: str = ""
    command: list[str]
    image: str
    image_id: str | None = None
    gpu_mode: str = "none"
    gpus: list[str] = Field(default_factory=list)
    mounts: list[MountSpec] = Field(default_factory=list)
    timeout_s: float
    limits: LimitsSpec
    user: str
    policy_path: str | None = None
    policy_sha256: str | None = None
    created_at: str
    controller_pid: int
    host_id: str
    parent: dict[str, Any] | None = None  # e.g. {"target": {...ref}} for derived operations


class InvocationResult(Closed):
    """The terminal state (result.json); written once."""

    kind: Literal["cko/invocation-result-v1"] = "cko/invocation-result-v1"
    id: str
    op: str
    state: TerminalState
    exit_code: int  # cko's exit code for this invocation
    container_exit_code: int | None = None
    reason: str | None = None
    rule: str | None = None  # the policy rule, when refused
    started_at: str | None = None
    ended_at: str
    duration_s: float | None = None
    identity: EnvironmentIdentity | None = None
    cleanup: dict[str, Any] = Field(default_factory=dict)
    stdout_tail: str = ""
    stderr_tail: str = ""
    stdout: ObjectRef | None = None
    stderr: ObjectRef | None = None
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    outputs: list[ObjectRef] = Field(default_factory=list)
    probe: dict[str, Any] | None = None
    telemetry: ObjectRef | None = None
    telemetry_summary: dict[str, Any] | None = None
    request_sha256: str
    events_sha256: str | None = None
