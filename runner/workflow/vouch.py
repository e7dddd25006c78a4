"""Do a candidate's output checks vouch for its timed samples? A pure rule over its series.

A check reads the output a block left, after the block's window. Which blocks are checked is drawn
only after each block returned, so a subject cannot know beforehand; it learns it when the fetch for
a check comes, and whatever it does then (compute the right answer into its output, let a lazy
output compute itself) runs after its window: the supervisor sees that work (the worker's CPU in the
fetch against the other subject's, the device busy while it runs) and voids the block. A voided
block is no sample, but its check passed, and the blocks that count are exactly the unchecked ones,
whose outputs nobody read. So the checks vouch only where voids do not follow the draw:

- some checked block was not voided (a check that stands), and
- checked blocks are not voided more often than unchecked ones beyond chance: the draw is independent
  of the subject, so voids that track it (one-sided Fisher exact test below VOUCH_ALPHA) are the
  subject's answer to being checked, not load, which falls on checked and unchecked blocks alike.

Failing either makes the stage `void` (code `accuracy_unconfirmed`), not `failed_accuracy`: foreign
load can void a checked block too, and a void stage may be repeated.
"""

from __future__ import annotations

from cko_perf.operations.protocol import Series
from cko_perf.operations.stats import scipy_stats

VOUCH_ALPHA = 0.01


def unvouched(series: Series) -> str:
    """Why this series' checks do not vouch for its samples, or "" where they do."""
    if len(series.void) != len(series.reps) or not any(series.void):
        return ""
    voided = {rep: bool(v) for rep, v in zip(series.reps, series.void, strict=True)}
    checked = [r for r in dict.fromkeys(series.accuracy.checked_reps) if r in voided]
    hit = sum(voided[r] for r in checked)
    if not checked or hit == 0:
        return ""
    where = f"{series.subject} case {series.case}"
    if hit == len(checked):
        return (
            f"{where}: every one of its {hit} checked block(s) was voided (work after the window, or "
            "load): no check vouches for the blocks that count"
        )
    others = [voided[r] for r in voided if r not in set(checked)]
    table = [[hit, len(checked) - hit], [sum(others), len(others) - sum(others)]]
    p = float(scipy_stats().fisher_exact(table, alternative="greater").pvalue)
    if p < VOUCH_ALPHA:
        return (
            f"{where}: {hit} of {len(checked)} checked blocks voided against {sum(others)} of "
            f"{len(others)} unchecked (one-sided Fisher p = {p:.2g} < {VOUCH_ALPHA:g}): its voids follow "
            "the check draw, so its checks do not vouch for the blocks that count"
        )
    return ""
