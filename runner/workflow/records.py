"""Derived records: Target, Baseline, Variant, Experiment, Selection, the champion pointer."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from cko_perf.operations.protocol import AccuracyRule, Case

from ..identity import EnvironmentIdentity
from ..models import Closed, ObjectRef, Ref
from .requests import ClaimLayer, DriverCommand, GpuRequirement, Objective, StatsPlan
from .verdicts import CaseAnalysis, DecidePlan, LoadCheck, Reason, Telemetry, WindowLoad


class Snapshot(Closed):
    """A directory's files by content: the manifest object and its digest."""

    sha256: str
    manifest: ObjectRef
    files: int
    bytes: int


class RanOn(Closed):
    """Where one measurement invocation ran: this host, or a node of a fleet (docs/fleet.md)."""

    invocation: Ref
    backend: Literal["local", "fleet"]
    host_id: str | None = None  # identity.host.host_id of the machine that ran it
    fleet: str | None = None  # the cluster address the controller used
    node_id: str | None = None  # the Ray node
    hostname: str | None = None
    devices: list[str] = Field(default_factory=list)  # the GPU UUIDs it was given


class Target(Closed):
    kind: Literal["cko/target-v1"] = "cko/target-v1"
    id: str
    name: str
    mode: Literal["optimization", "diagnostic"]
    claim_layer: ClaimLayer = "kernel"
    created_at: str
    original: Snapshot | None = None
    entry: str = "kernel.py"
    allowed_paths: list[str] = Field(default_factory=list)
    driver: DriverCommand | None = None
    image: str
    device: str
    gpu: GpuRequirement
    cases: list[Case] = Field(default_factory=list)
    objective: Objective | None = None
    accuracy: AccuracyRule | None = None
    plan: StatsPlan
    timeout_s: float
    process_timeout_s: float
    memory: str
    identity: EnvironmentIdentity | None = None
    smoke: Ref | None = None
    ran_on: RanOn | None = None  # where the smoke ran
    reports: list[ObjectRef] = Field(default_factory=list)
    request: ObjectRef


class CaseBaseline(Closed):
    case: str
    samples: list[float]
    unit: str
    median: float
    aa: dict[str, Any]  # the A/A comparison (stats result)
    resolution_pct: float


class Baseline(Closed):
    kind: Literal["cko/baseline-v1"] = "cko/baseline-v1"
    id: str
    target: Ref
    created_at: str
    invocation: Ref
    seed: int
    samples_per_case: int
    aa_pairs: int
    cases: list[CaseBaseline]
    resolution_pct: float
    min_effect_pct: float
    min_effect_resolvable: bool
    note: str
    identity_mismatch: list[dict[str, Any]] = Field(default_factory=list)
    telemetry: dict[str, Any] | None = None
    ran_on: RanOn | None = None
    load: WindowLoad | None = None
    measured_under_load: bool = False  # the resolution includes other work's noise: `warnings` says which
    warnings: list[Reason] = Field(default_factory=list)


class Variant(Closed):
    kind: Literal["cko/variant-v1"] = "cko/variant-v1"
    id: str
    target: Ref
    created_at: str
    parent: Literal["original", "champion"]
    parent_snapshot: str
    parent_selection: Ref | None = None
    snapshot: Snapshot
    changed: list[str]
    claim: str
    identical_to_parent: bool


class Experiment(Closed):
    kind: Literal["cko/experiment-v1"] = "cko/experiment-v1"
    id: str
    target: Ref
    variant: Ref | None = None
    stage: Literal["screen", "target", "audit"]
    created_at: str
    reference: dict[str, Any]  # {"kind": original|champion, "snapshot": sha, "champion_digest": ...}
    candidate_snapshot: str
    aa_control: bool
    claims: list[str] = Field(default_factory=list)
    gates: list[dict[str, Any]] = Field(default_factory=list)
    plan: dict[str, Any]
    invocation: Ref | None = None
    accuracy: dict[str, Any]
    integrity: list[str] = Field(default_factory=list)
    telemetry: dict[str, Any] | None = None
    identity_mismatch: list[dict[str, Any]] = Field(default_factory=list)
    cases: list[CaseAnalysis] = Field(default_factory=list)
    primary_verdict: Literal["accepted", "below_minimum", "regressed", "inconclusive", "void"]
    constraint_verdicts: dict[str, str] = Field(default_factory=dict)
    # The stage outcome (decide.py): screen promising|rejected|open; target/audit accepted|regressed|
    # below_minimum|inconclusive|constraint_violated|constraint_inconclusive; any stage failed_run|
    # failed_accuracy|integrity_violation|void. Per-case verdicts live in cases[].primary.verdict.
    outcome: str
    blocking_constraints: list[str] = Field(default_factory=list)  # named by a constraint_* outcome
    reasons: list[Reason] = Field(default_factory=list)
    samples: ObjectRef | None = None
    ran_on: list[RanOn] = Field(default_factory=list)  # one per invocation (look), in order
    claim_layer: ClaimLayer = "kernel"
    # What `decide` was given besides the samples: select and verify recompute the verdict from these
    decision_plan: DecidePlan | None = None
    load_input: Telemetry | None = None
    failure: Reason | None = None
    load: list[LoadCheck] = Field(default_factory=list)
    # Why it ran (the request's fields, verbatim) and what it cost against the estimate
    hypothesis: str | None = None
    mechanism_key: str | None = None
    cheapest_falsifier: dict[str, Any] | None = None  # the request's, with the result record's reference
    cost: dict[str, Any] | None = (
        None  # {"estimated": {...} | None, "actual": {seconds, gpus}, "vs_estimate"}
    )

    @field_validator("reasons", mode="before")
    @classmethod
    def _old_reasons(cls, v: Any) -> Any:
        # records written before reasons had codes: keep the sentence under a neutral code
        return (
            [{"code": "note", "message": r} if isinstance(r, str) else r for r in v]
            if isinstance(v, list)
            else v
        )


class StageEntry(Closed):
    """One stage a candidate went through against one reference (every attempt, void ones included)."""

    experiment: Ref
    stage: str
    outcome: str
    created_at: str


class Selection(Closed):
    kind: Literal["cko/selection-v1"] = "cko/selection-v1"
    id: str
    target: Ref
    action: Literal["select", "restore"]
    experiment: Ref | None = None
    variant: Ref | None = None
    snapshot: str
    previous_pointer_sha256: str | None
    created_at: str
    reason: str
    # select: every stage of this candidate against this reference; restore: what justified it
    stages: list[StageEntry] = Field(default_factory=list)
    claim_layer: ClaimLayer | None = None
    evidence: Literal["target_stage", "rejecting_audit", "operator_reason"] | None = None
    audit: Ref | None = None


class ChampionPointer(Closed):
    kind: Literal["cko/champion-v1"] = "cko/champion-v1"
    target: Ref
    selection: Ref
    variant: Ref | None = None
    snapshot: str
