"""`cko stats compare`: the paired statistics on two JSON arrays of samples (DESIGN.md, CLI)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from cko_perf.operations import stats as st

from ..cliutil import Outcome, common, handled, load_json_file
from ..errors import bad_request

# Names of the statistics' arguments as the command line spells them.
_FIELD = {"min_effect_pct": "min_effect"}


def _samples(path: Path, what: str) -> list[float]:
    doc = load_json_file(path, what)
    if not isinstance(doc, list):
        raise bad_request(
            f"{what}: {path} must hold a JSON array of numbers, got {type(doc).__name__}", field=what
        )
    for i, v in enumerate(doc):
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise bad_request(f"{what}: {path}: element {i} ({v!r}) is not a number", field=what)
    return [float(v) for v in doc]


def _number(text: str, what: str, kind: type = float) -> Any:
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise bad_request(
            f"{what}: {text!r} is not {'an integer' if kind is int else 'a number'}", field=what
        ) from None
    if kind is float and not math.isfinite(value):
        raise bad_request(f"{what}: must be finite, got {text!r}", field=what)
    return value


def _fmt_pct(x: float) -> str:
    return f"{x:+.3f}%"


def _human(c: st.Comparison, reference: Path, candidate: Path) -> Table:
    better = "lower is better" if c.direction == "lower" else "higher is better"
    t = Table(title=f"paired comparison ({better}): {candidate} vs {reference}", show_header=False)
    t.add_column("field", style="bold")
    t.add_column("value")
    t.add_row("pairs", str(c.n_pairs))
    t.add_row("median effect", _fmt_pct(c.effect_pct) + "  (+ = candidate better)")
    t.add_row(f"{c.confidence:.4g} interval", f"[{_fmt_pct(c.ci_low_pct)}, {_fmt_pct(c.ci_high_pct)}]")
    t.add_row("minimum effect", f"{c.min_effect_pct:g}%")
    t.add_row("Wilcoxon p", f"{c.wilcoxon_p:.3g}  (second opinion, not used for the verdict)")
    t.add_row("verdict", Text(c.verdict, style="bold"))
    t.add_row("seed", str(c.seed))
    t.add_row("resamples", str(c.resamples))
    if not c.calibrated:
        t.add_row(
            "note",
            f"{c.n_pairs} pairs cannot give a {c.confidence:g} interval "
            f"(need {st.min_pairs_for(c.confidence)}); verdict forced to inconclusive",
        )
    return t


@click.group(name="stats")
def stats() -> None:
    """Paired statistics: median log ratio, bootstrap interval, verdict (writes nothing)."""


@stats.command(name="compare")
@click.option(
    "--reference", required=True, type=click.Path(path_type=Path), help="JSON array of reference samples."
)
@click.option(
    "--candidate",
    required=True,
    type=click.Path(path_type=Path),
    help="JSON array of candidate samples; pairs with --reference by position.",
)
@click.option(
    "--direction",
    required=True,
    metavar="lower|higher",
    help="lower (time) or higher (throughput) is better.",
)
@click.option(
    "--min-effect", "min_effect", required=True, metavar="PCT", help="Minimum effect in percent (>= 0)."
)
@click.option(
    "--confidence", default=str(st.DEFAULT_CONFIDENCE), show_default=True, metavar="C", help="In (0.5, 1)."
)
@click.option("--seed", default="0", show_default=True, metavar="N", help="Bootstrap seed (recorded).")
@click.option(
    "--resamples",
    default=str(st.DEFAULT_RESAMPLES),
    show_default=True,
    metavar="N",
    help="Bootstrap resamples.",
)
@click.option("--pairs", "keep_pairs", is_flag=True, help="Include the per-pair log ratios in the output.")
@common
@handled
def compare(
    reference: Path,
    candidate: Path,
    direction: str,
    min_effect: str,
    confidence: str,
    seed: str,
    resamples: str,
    keep_pairs: bool,
    store: Path,
    as_json: bool,
) -> Outcome:
    """Compare candidate with reference, pair by pair; prints the verdict and the seed used.

    Exit 0 whatever the verdict; 2 on bad input (the error names the field).
    """
    ref = _samples(reference, "reference")
    cand = _samples(candidate, "candidate")
    try:
        result = st.compare(
            ref,
            cand,
            direction=direction,
            min_effect_pct=_number(min_effect, "min_effect"),
            confidence=_number(confidence, "confidence"),
            seed=_number(seed, "seed", int),
            resamples=_number(resamples, "resamples", int),
            keep_pairs=keep_pairs,
        )
    except st.StatsInputError as err:
        field = _FIELD.get(err.field, err.field)
        raise bad_request(f"{field}: {err.message}", field=field) from None
    return Outcome(doc=result.model_dump(mode="json"), human=_human(result, reference, candidate))


commands = [stats]
