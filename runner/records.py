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


class Limits(Closed):
    """The one shape of a container's limits: admitted by the policy, recorded, enforced.

    Every field is always set and positive once admitted (runner/policy.py admit): zero, negative or
    absent is never "unlimited". The defaults on the output/log fields only let request.json files
    written before they existed still load."""

    memory_bytes: int = Field(gt=0)
    pids: int = Field(gt=0)
    cpus: float | None = Field(default=None, gt=0)  # None only in records older than the default CPU limit
    tmpfs_bytes: int = Field(gt=0)
    output_bytes: int = Field(default=0, ge=0)  # /cko/out: a size-limited tmpfs of this many bytes
    output_files: int = Field(default=0, ge=0)  # ... and this many inodes (files and directories)
    output_depth: int = Field(default=0, ge=0)  # collection descends no deeper
    log_bytes: int = Field(default=0, ge=0)  # stdout and stderr kept by cko, each; the engine keeps none


LimitsSpec = Limits  # the name older code and records use


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
    system_policy_path: str | None = None  # the root-owned policy that always applies
    system_policy_sha256: str | None = None
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
