"""Requests agents and CI send (closed objects; paths relative to the request file)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator, model_validator

from cko_perf.operations.protocol import AccuracyRule, Case, Metric

from ..models import Closed


class DriverCommand(Closed):
    command: list[str] = Field(min_length=1, description="run inside the container, cwd = the harness")
    env: dict[str, str] = Field(default_factory=dict)
    kind: Literal["helper", "harness_trusted"] = Field(
        default="helper",
        description="helper: the driver calls operations.driver.main, and every subject runs in "
        "its own worker (the trust boundary). harness_trusted: a hand-written cko/driver-v1 driver that loads the "
        "subjects itself; every record says the candidate shared the harness's process",
    )


class Constraint(Closed):
    metric: Metric
    max_regression_pct: float = Field(ge=0, le=100)


class Objective(Closed):
    primary: Metric
    min_effect_pct: float = Field(gt=0, le=1000, description="smallest gain worth claiming, in percent")
    constraints: list[Constraint] = Field(default_factory=list)


ClaimLayer = Literal["kernel", "workload", "service"]
# What a claim rests on, narrowest first: a micro-benchmark of one operation, the user's test
# workload, the end-to-end metric of a running service. Evidence supports its layer and narrower.
CLAIM_ORDER: dict[str, int] = {"kernel": 0, "workload": 1, "service": 2}


class LoadCeiling(Closed):
    """Foreign load a verdict tolerates (DESIGN.md, Measurement and statistics; README "Foreign load").

    Paired, interleaved ABBA blocks put load that is common to both arms into both arms, so a shared
    host widens the interval instead of biasing it. A verdict is void only when the load is
    unbalanced between the arms, or so high that the subject is starved of the machine.
    """

    max_foreign_cpu_share: float = Field(
        default=0.9,
        gt=0,
        le=1.0,
        description=(
            "void when other processes used more than this share of the host's CPU cores (median over "
            "samples, or over the window where per-sample load is not recorded)"
        ),
    )
    max_foreign_gpu_contexts: int = Field(
        default=0,
        ge=0,
        description=("void when more than this many other compute contexts ran on the measured GPU"),
    )
    max_throttled_share: float = Field(
        default=0.1,
        ge=0,
        le=1.0,
        description=("void when more than this share of samples ran under hardware/thermal/power throttling"),
    )
    imbalance_alpha: float = Field(
        default=0.01,
        gt=0,
        lt=0.5,
        description=(
            "two-sided Wilcoxon signed-rank test of per-pair load differences (candidate - reference): "
            "void below this p-value"
        ),
    )
    imbalance_min_cores: float = Field(
        default=0.1,
        ge=0,
        description=("...and only when the median per-pair difference is at least this many CPU cores"),
    )


class Timing(Closed):
    """How each sample's block is timed (operations/timing.py), frozen with the Target.

    cold: one run per block, the GPU's L2 flushed before it, events around it: each sample pays the
    window's fixed cost (on the H200 ~100-150 us: the whole-device synchronise and the event round
    trip), which is noise for a ms-scale subject and compresses the gain of a us-scale one.
    hot: `runs_per_block` back-to-back runs between two events, per-run time = block / runs: the
    fixed cost is spread over a block of at least `min_block_ms` (tests/gpu/README.md, fidelity).
    graph (device cuda): the hot block's runs captured once per block as a CUDA graph, on decoy
    inputs and outside the window, and the window times one replay on the block's inputs: the CPU's
    launch cost, which an events clock reads as GPU time below ~20 us, drops out; a subject that
    cannot be captured (a host sync, a CPU op) fails its stage with the reason."""

    mode: Literal["cold", "hot", "graph"] = "cold"
    runs_per_block: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="hot: runs per block; unset: readiness sizes it from the smoke to min_block_ms",
    )
    min_block_ms: float = Field(default=1.0, gt=0, le=10_000)

    @model_validator(mode="after")
    def _cold_is_one_run(self) -> Timing:
        if self.mode == "cold" and self.runs_per_block not in (None, 1):
            raise ValueError("timing.runs_per_block: cold mode times one run per block")
        return self


def runs_for(timing: Timing, per_run_ms: float | None, max_runs: int = 1_000_000) -> int:
    """The hot block's runs: enough for min_block_ms at the smoke's fastest per-run time, at most
    `max_runs` (each run holds inputs and an output of its own until the block is released)."""
    if timing.mode == "cold":
        return 1
    if timing.runs_per_block is not None:
        return timing.runs_per_block
    if not per_run_ms or per_run_ms <= 0:
        return 1
    return max(1, min(max_runs, 1_000_000, math.ceil(timing.min_block_ms / per_run_ms)))


# What one block's runs may hold at once (inputs and outputs, a set per run): a quarter of the
# container's memory on the CPU; on a GPU a bound well inside any current card's memory (an H100's
# 80 GB holds the subject's own working memory besides), so sizing never makes a block that cannot run.
BLOCK_BYTES_GPU = 8 << 30


def max_runs(run_bytes: int, device: str, memory_bytes: int) -> int:
    """The most runs a block may have when one run's inputs and output take `run_bytes`."""
    budget = BLOCK_BYTES_GPU if device == "cuda" else memory_bytes // 4
    return max(1, budget // max(1, run_bytes))


class StatsPlan(Closed):
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    screen_pairs: int = Field(default=8, ge=3, le=1000)
    target_pairs: int = Field(default=30, ge=5, le=10000)
    min_pairs: int = Field(default=10, ge=3)
    max_pairs: int = Field(default=200, ge=5, le=10000)
    baseline_samples: int = Field(default=10, ge=2, le=10000)
    aa_pairs: int = Field(default=12, ge=3, le=10000)
    warmup: int = Field(default=3, ge=0, le=1000)
    acquisition: Literal["workers", "isolated", "same_process"] = Field(
        default="workers", description="kept for old requests: every value means one worker per subject"
    )
    bootstrap_resamples: int = Field(default=4000, ge=200, le=100000)
    exclude_ramping: bool = Field(
        default=True,
        description="pre-declared: drop pairs whose timed block started "
        "below 90% of the series' settled SM clock; counted and reported",
    )
    load: LoadCeiling = LoadCeiling()
    timing: Timing = Timing()

    @model_validator(mode="after")
    def _order(self) -> StatsPlan:
        if self.min_pairs > self.max_pairs:
            raise ValueError("min_pairs must not exceed max_pairs")
        return self


class GpuRequirement(Closed):
    required: bool = False
    count: int = Field(default=0, ge=0, le=64)
    mode: Literal["nvidia", "cdi", "devices"] | None = None


class ReadinessRequest(Closed):
    """`cko readiness`: freeze a Target after a two-sample smoke."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    mode: Literal["optimization", "diagnostic"] = "optimization"
    claim_layer: ClaimLayer = Field(
        default="kernel",
        description=(
            "what the workload is: kernel (a micro-benchmark of one operation), workload (the user's test "
            "workload) or service (end-to-end metric of a running service); no claim is wider than this"
        ),
    )
    workload: str = Field(default=".", description="the original's directory (relative to this file)")
    entry: str = Field(default="kernel.py", description="the subject file the driver loads")
    allowed_paths: list[str] = Field(default_factory=list, description="files a variant may change")
    exclude: list[str] = Field(default_factory=list, description="paths left out of the snapshot")
    driver: DriverCommand | None = None
    image: str = Field(default="cpu", pattern=r"^[a-z0-9][a-z0-9_.-]{0,62}$")
    device: Literal["cpu", "cuda"] = "cpu"
    gpu: GpuRequirement = GpuRequirement()
    cases: list[Case] = Field(default_factory=list)
    objective: Objective | None = None
    accuracy: AccuracyRule | None = None
    plan: StatsPlan = StatsPlan()
    timeout_s: float = Field(default=900.0, gt=0, le=86400)
    process_timeout_s: float = Field(default=300.0, gt=0, le=86400)
    memory: str = "8g"
    reports: list[str] = Field(default_factory=list, description="diagnostic mode: existing reports to bind")
    collections: list[str] = Field(
        default_factory=list,
        description="diagnostic mode: `cko profile ... --collect` invocations whose kept reports to bind",
    )

    @field_validator("memory")
    @classmethod
    def _memory(cls, v: str) -> str:
        # "0", "-1" or "0b" must never reach a container as "no limit": refused here, exit 2 naming memory.
        from ..errors import CkoError
        from ..policy import parse_size

        try:
            parse_size(v, "memory")
        except CkoError as err:
            raise ValueError(err.message) from None
        return v

    @model_validator(mode="after")
    def _mode(self) -> ReadinessRequest:
        if self.mode == "optimization":
            missing = [n for n in ("driver", "objective", "accuracy") if getattr(self, n) is None]
            if missing:
                raise ValueError(f"an optimization target needs {', '.join(missing)}")
            if not self.cases:
                raise ValueError("an optimization target needs at least one case")
            if not self.allowed_paths:
                raise ValueError("an optimization target needs allowed_paths (what a variant may change)")
            ids = [c.id for c in self.cases]
            if len(set(ids)) != len(ids):
                raise ValueError("case ids must be unique")
        elif not self.reports and not self.collections:
            raise ValueError("a diagnostic target binds existing reports: give reports or collections")
        if self.gpu.required and self.device != "cuda":
            raise ValueError("gpu.required needs device cuda")
        if self.device == "cuda" and not self.gpu.required:
            raise ValueError("device cuda needs gpu.required true")
        if self.plan.timing.mode == "graph" and self.device != "cuda":
            raise ValueError("plan.timing.mode graph needs device cuda (a CUDA graph of the subject's runs)")
        if (
            self.plan.timing.mode == "graph"
            and self.driver is not None
            and self.driver.kind == "harness_trusted"
        ):
            raise ValueError("plan.timing.mode graph needs the worker boundary, not a harness_trusted driver")
        return self


class BaselineRequest(Closed):
    target: str | None = None
    samples_per_case: int | None = Field(default=None, ge=2, le=10000)
    aa_pairs: int | None = Field(default=None, ge=3, le=10000)
    seed: int = Field(default=0, ge=0)


class VariantRequest(Closed):
    target: str | None = None
    parent: Literal["original", "champion"] = "original"
    path: str = Field(description="directory whose files replace the parent's (relative to this file)")
    claim: str = Field(min_length=1, max_length=300)


class Gate(Closed):
    """An extra accuracy gate, tighter than the Target's rule."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,40}$")
    rel_l2: float = Field(gt=0)
    max_abs: float | None = Field(default=None, gt=0)


class CheapestFalsifier(Closed):
    """The cheapest check that could have shown the hypothesis wrong, tried before this stage: what it
    was and the record holding its result, or why there was none."""

    tried: str | None = Field(default=None, max_length=500, description="what was tried")
    result: str | None = Field(
        default=None,
        description="the id of the record holding its result (an "
        "experiment, evidence, variant or invocation id in this store)",
    )
    why_none: str | None = Field(default=None, max_length=500, description="why no cheaper check exists")

    @model_validator(mode="after")
    def _one(self) -> CheapestFalsifier:
        if self.why_none is None and not (self.tried and self.result):
            raise ValueError("give tried and result (the record of what was tried), or why_none")
        if self.why_none is not None and (self.tried or self.result):
            raise ValueError("give tried and result, or why_none, not both")
        return self


class EstimatedCost(Closed):
    p50_s: float = Field(gt=0, description="median expected wall time of the stage, seconds")
    p90_s: float = Field(gt=0, description="90th percentile expected wall time, seconds")
    gpus: int = Field(default=0, ge=0, le=64)

    @model_validator(mode="after")
    def _order(self) -> EstimatedCost:
        if self.p90_s < self.p50_s:
            raise ValueError("p90_s must be at least p50_s")
        return self


class ExperimentRequest(Closed):
    target: str | None = None
    variant: str | None = None
    reference: Literal["original", "champion"] = "original"
    stage: Literal["screen", "target", "audit"]
    pairs: int | None = Field(default=None, ge=3, le=10000)
    seed: int = Field(default=0, ge=0)
    acquisition: Literal["workers", "isolated", "same_process"] | None = Field(
        default=None, description="kept for old requests: every value means one worker per subject"
    )
    claims: list[str] = Field(default_factory=list, description="pre-declared claims, recorded verbatim")
    gates: list[Gate] = Field(default_factory=list)
    sequential: bool = Field(default=False, description="target stage: stop early at pre-planned looks")
    claim_layer: ClaimLayer | None = Field(
        default=None,
        description="the claim this stage may support: the Target's layer (default) or a narrower one",
    )
    # Why the stage is run, recorded verbatim (README, "Why an experiment ran")
    hypothesis: str | None = Field(
        default=None, max_length=2000, description="what the change should do and why"
    )
    mechanism_key: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9_.:/-]{0,99}$",
        description=(
            "a stable key for the mechanism (e.g. memory.coalescing, sass:ldg128) linking history and SASS signatures"
        ),
    )
    cheapest_falsifier: CheapestFalsifier | None = None
    estimated_cost: EstimatedCost | None = Field(
        default=None, description="printed before the stage runs and compared with the actual cost after"
    )
