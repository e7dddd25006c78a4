"""The stack-upgrade audit's record (`cko audit --stack`): immutable, in the ledger, hash-linked to both
Targets, every invocation it ran and the baselines whose A/A resolution it quotes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from cko_perf.operations.twosample import TwoSampleComparison

from ..models import Closed, ObjectRef, Ref
from .records import RanOn
from .stackdiff import StackDiff
from .verdicts import Reason, WindowLoad

Side = Literal["from", "to"]
CaseVerdict = Literal["faster", "slower", "no_difference", "inconclusive", "failed_accuracy"]


class StackInvocation(Closed):
    """One short measurement of every case of one side's original, in that side's own image."""

    round: int
    side: Side
    invocation: Ref
    image_id: str | None
    ran_on: RanOn | None = None
    identity_mismatch: list[dict[str, Any]] = Field(default_factory=list)  # against its Target's frozen one
    load: WindowLoad
    accuracy_failed: list[str] = Field(default_factory=list)  # cases
    integrity: list[str] = Field(default_factory=list)
    samples: dict[str, list[float]]  # case -> the primary metric's kept samples
    medians: dict[str, float]  # case -> their median: the unit the comparison counts


class StackCase(Closed):
    case: str
    unit: str
    from_medians: list[float]  # one per "from" invocation, in order
    to_medians: list[float]
    comparison: TwoSampleComparison | None = None
    verdict: CaseVerdict
    # The A/A resolution of each side's newest baseline (paired, at the Target's target_pairs): the
    # noise floor of this environment, quoted as context; None where no baseline exists.
    aa_resolution_pct: dict[str, float | None]
    note: str | None = None


class StackAudit(Closed):
    kind: Literal["cko/stack-audit-v1"] = "cko/stack-audit-v1"
    id: str
    created_at: str
    from_target: Ref
    to_target: Ref
    component: str
    diff: StackDiff  # every component, what differs and what could not be checked
    unchecked: list[str] = Field(default_factory=list)  # components that could not be checked
    images: dict[str, dict[str, str | None]]  # side -> {"name", "id"}
    rounds: int
    samples_per_case: int
    warmup: int
    seed: int
    order: list[Side]  # the invocations' order: seeded ABBA/BAAB blocks over pairs of rounds
    metric: str
    direction: Literal["lower", "higher"]
    min_effect_pct: float
    confidence: float
    resamples: int
    baselines: dict[str, Ref | None]
    invocations: list[StackInvocation]
    cases: list[StackCase]
    answer: Literal["measured", "could_not_check"]
    reasons: list[Reason] = Field(default_factory=list)
    measured_under_load: bool = False
    results: ObjectRef  # every invocation's driver result, as measured
