"""Derived records: Target, Baseline, Variant, Experiment, Selection, the champion pointer."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from operations.protocol import AccuracyRule, Case

from ..identity import EnvironmentIdentity
from ..models import Closed, ObjectRef, Ref
from .requests import DriverCommand, GpuRequirement, Objective, StatsPlan


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


class CaseAnalysis(Closed):
    case: str
    pairs: int
    excluded_pairs: int
    exclusion_rule: str
    primary: dict[str, Any]  # stats result for the primary metric
    constraints: list[dict[str, Any]] = Field(default_factory=list)
    # medians of the primary metric over the kept pairs, in its unit: what each subject achieved
    reference_median: float | None = None
    candidate_median: float | None = None
    # GPU clocks: the same medians of the launching stream's own time in ns, without the window's
    # whole-device synchronise (operations.protocol.Series.stream_ns); None where not recorded
    reference_stream_median_ns: float | None = None
    candidate_stream_median_ns: float | None = None


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
    outcome: str  # screen: promising|rejected|open ; target/audit: accepted|...|failed_accuracy
    reasons: list[str] = Field(default_factory=list)
    samples: ObjectRef | None = None
    ran_on: list[RanOn] = Field(default_factory=list)  # one per invocation (look), in order


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


class ChampionPointer(Closed):
    kind: Literal["cko/champion-v1"] = "cko/champion-v1"
    target: Ref
    selection: Ref
    variant: Ref | None = None
    snapshot: str
