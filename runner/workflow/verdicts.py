"""The typed inputs and outputs of the verdict (`decide.decide`), shared by the records."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from cko_perf.operations.stats import SequentialPlan

from ..models import Closed
from .requests import Gate, LoadCeiling, Objective, StatsPlan

PrimaryVerdict = Literal["accepted", "below_minimum", "regressed", "inconclusive", "void"]


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


class Reason(Closed):
    code: str
    message: str


class SampleLoad(Closed):
    """Foreign load around one timed sample (one subject, case, rep), as the measuring path records it."""

    subject: str
    case: str
    rep: int
    foreign_cpu_cores: float | None = None  # CPU cores used by processes that are not the measurement's
    # The block's wall time (the supervisor's bracket): the CPU figure is read in clock ticks, so it is
    # only worth something pooled over many ticks of wall (decide.pooled_cpu).
    wall_ns: int | None = None
    foreign_gpu_contexts: int | None = None  # other compute contexts on the measured GPU
    sm_mhz: float | None = None
    throttle: list[str] | None = None  # throttle reasons other than our own load; None: not recorded


class WindowLoad(Closed):
    """One invocation's window, from the host sampler's summary (the fallback where samples lack load)."""

    host_cpus: int | None = None
    foreign_cpu_cores_median: float | None = None
    foreign_gpu_contexts: int | None = None
    throttled_share: float | None = None
    clock_note: str | None = None
    sampler_note: str | None = None


class Telemetry(Closed):
    host_cpus: int | None = None  # CPU cores of the measuring host: the scale of the CPU ceiling
    samples: list[SampleLoad] = Field(default_factory=list)
    windows: list[WindowLoad] = Field(default_factory=list)  # one per invocation (look), in order


class DecidePlan(Closed):
    """Everything besides the samples that the verdict depends on, frozen before measuring."""

    stage: Literal["screen", "target", "audit"]
    objective: Objective
    stats: StatsPlan
    seed: int
    sequential: SequentialPlan | None = None
    gates: list[Gate] = Field(default_factory=list)
    ceiling: LoadCeiling
    ceiling_source: Literal["plan", "policy"] = "plan"
    aa_control: bool = False
    identity_mismatch: list[str] = Field(
        default_factory=list
    )  # identity fields that differ from the Target's
    # the newest baseline's A/A resolution per case, in percent (empty: no baseline): a screen
    # cannot call a case below the minimum effect that the baseline could not resolve
    resolution_pct: dict[str, float] = Field(default_factory=dict)


class LoadCheck(Closed):
    kind: str  # cpu | gpu_contexts | throttle
    basis: Literal["per_sample", "pooled", "window", "none"]
    # foreign CPU share (median per sample, time-weighted mean where pooled) / max contexts / throttled share
    level: float | None = None
    ceiling: float | None = None
    imbalance_p: float | None = None  # Wilcoxon signed-rank on per-pair (candidate - reference) load
    imbalance_median: float | None = None
    pairs_tested: int = 0


class Decision(Closed):
    stage_outcome: str
    primary_verdict: PrimaryVerdict
    constraint_verdicts: dict[str, str] = Field(default_factory=dict)
    blocking_constraints: list[str] = Field(default_factory=list)  # the constraints the outcome names
    cases: list[CaseAnalysis] = Field(default_factory=list)
    reasons: list[Reason] = Field(default_factory=list)
    load: list[LoadCheck] = Field(default_factory=list)

    @property
    def codes(self) -> list[str]:
        return [r.code for r in self.reasons]
