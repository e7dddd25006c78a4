"""Per-device verdicts: one experiment measured on several devices of one identity pool, never pooled.

Each device's pairs are analysed on their own (`analyse_device`: the paired statistics of
`operations.stats`); `combine_per_device` is the verdict rule over those records (COMBINE_RULE),
a pure function like the other rules of this package (`analysis.combine` is the same rule over
cases). The fleet measures the devices; this module only reads what they gave.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field, ValidationError

from cko_perf.operations import stats

from ..errors import bad_request
from ..identity import MATTERS, EnvironmentIdentity, _field_values
from ..models import Closed
from .analysis import combine

Verdict = Literal["accepted", "below_minimum", "regressed", "inconclusive"]
POOL_FIELDS = tuple(k for k in MATTERS if k != "tools")


def identity_pool(identity: EnvironmentIdentity) -> dict[str, Any]:
    """The fields that make two devices one pool (model, architecture, driver, image, clocks...)."""
    return {k: _field_values(identity, k) for k in POOL_FIELDS}


class DeviceAnalysis(Closed):
    """One device's analysis of one experiment: every pair of it measured on that device."""

    device: str  # the GPU UUID
    node: str | None = None
    pool: dict[str, Any] = Field(default_factory=dict)
    verdict: Verdict
    effect_pct: float | None = None
    ci_low_pct: float | None = None
    ci_high_pct: float | None = None
    n_pairs: int | None = None
    experiment: dict[str, Any] | None = None  # a {id, sha256} reference, when it is a stored experiment


class CombinedVerdict(Closed):
    verdict: Verdict
    rule: str
    devices: list[DeviceAnalysis]
    agreement: bool
    effect_range_pct: list[float] | None = None
    reasons: list[str] = Field(default_factory=list)


COMBINE_RULE = (
    "per device, never pooled: accepted only if accepted on every device; regressed if regressed on "
    "any; below_minimum if every device is accepted or below_minimum and one is below; else "
    "inconclusive"
)


def analyse_device(
    device: str,
    reference: Sequence[float],
    candidate: Sequence[float],
    *,
    direction: str,
    min_effect_pct: float,
    confidence: float = 0.95,
    seed: int = 0,
    resamples: int = 4000,
    metric: str | None = None,
    node: str | None = None,
    pool: Mapping[str, Any] | None = None,
) -> DeviceAnalysis:
    """The paired comparison (operations.stats.compare) of the pairs measured on one device."""
    try:
        c = stats.compare(
            list(reference),
            list(candidate),
            direction=direction,
            min_effect_pct=min_effect_pct,
            confidence=confidence,
            seed=seed,
            resamples=resamples,
            metric=metric,
        )
    except stats.StatsInputError as exc:
        raise bad_request(f"device {device}: {exc}", field="samples") from None
    return DeviceAnalysis(
        device=device,
        node=node,
        pool=dict(pool or {}),
        verdict=c.verdict,
        effect_pct=c.effect_pct,
        ci_low_pct=c.ci_low_pct,
        ci_high_pct=c.ci_high_pct,
        n_pairs=c.n_pairs,
    )


def combine_per_device(results: Sequence[DeviceAnalysis | Mapping[str, Any]]) -> CombinedVerdict:
    """One verdict over devices of one identity pool, each analysed on its own (see COMBINE_RULE).

    Pure: the records in, the verdict out; a malformed or mixed list is a bad request."""
    devs: list[DeviceAnalysis] = []
    for i, r in enumerate(results):
        try:
            devs.append(r if isinstance(r, DeviceAnalysis) else DeviceAnalysis.model_validate(dict(r)))
        except ValidationError as exc:
            e = exc.errors()[0]
            raise bad_request(
                f"results[{i}].{'.'.join(str(x) for x in e['loc'])}: {e['msg']}", field=f"results[{i}]"
            ) from None
    if not devs:
        raise bad_request("results: no device to combine", field="results")
    seen: set[str] = set()
    for d in devs:
        if d.device in seen:
            raise bad_request(
                f"results: device {d.device} appears twice; one analysis per device", field="results"
            )
        seen.add(d.device)
    pools = [d.pool for d in devs if d.pool]
    if pools and any(p != pools[0] for p in pools[1:]):
        differ = sorted({k for p in pools for k in set(p) | set(pools[0]) if p.get(k) != pools[0].get(k)})
        raise bad_request(
            f"results: devices of different identity pools cannot be combined (differ in "
            f"{', '.join(differ)})",
            field="results",
            code="mixed_identity_pool",
        )
    verdict: Verdict = combine([d.verdict for d in devs])  # type: ignore[assignment]
    effects = [d.effect_pct for d in devs if d.effect_pct is not None]
    reasons = (
        [f"{d.device}: {d.verdict}" for d in devs if d.verdict != "accepted"] if verdict != "accepted" else []
    )
    if len(pools) < len(devs):
        reasons.append("some devices carry no identity pool: their sameness was not checked")
    return CombinedVerdict(
        verdict=verdict,
        rule=COMBINE_RULE,
        devices=devs,
        agreement=len({d.verdict for d in devs}) == 1,
        effect_range_pct=[min(effects), max(effects)] if effects else None,
        reasons=reasons,
    )
