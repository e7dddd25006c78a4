"""Do a candidate's output checks vouch for its timed samples? A pure rule over its series and the
reference's on the same case.

A check reads the output a block left, after the block's window. Which blocks are checked is drawn
only after each block returned, so a subject cannot know beforehand; it learns it when the fetch for
a check comes, and whatever it does then (compute the right answer into its output, let a lazy
output compute itself) runs after its window: the supervisor sees that work (the worker's CPU in the
fetch against the other subject's, the device busy while it runs) and voids the block. A voided
block is no sample, but its check passed, and the blocks that count are exactly the unchecked ones,
whose outputs nobody read.

An honest fetch can be voided too, and more often than a release: it copies the whole output while
the device is probed (on the H100, 7 of 8 of an honest Triton candidate's checked blocks of a 256 MiB
output were voided on a loaded host). The reference's fetches copy the same output under the same
probes and load. So the candidate's checks vouch unless its checked blocks are voided more often than
the reference's checked blocks, beyond chance (one-sided Fisher exact test, p < VOUCH_ALPHA): a
subject that works when it is checked is voided there and the reference is not.

Whatever the reference's, a candidate none of whose checked blocks counted has no check vouching for
its samples: that too is `accuracy_unconfirmed`.

Failing it makes the stage `void` (code `accuracy_unconfirmed`), not `failed_accuracy`: a void stage
may be repeated, and an honest one is not failed on a test's false positive.
"""

from __future__ import annotations

from cko_perf.operations.protocol import Series
from cko_perf.operations.stats import scipy_stats

from .analysis import void_reps

VOUCH_ALPHA = 0.01


def checked_voids(series: Series) -> tuple[int, int]:
    """(checked blocks voided, checked blocks) of one series; (0, 0) where it records no per-block
    voids (the harness-trusted path)."""
    if len(series.void) != len(series.reps):
        return 0, 0
    voided = void_reps(series)
    checked = set(series.accuracy.checked_reps) & set(series.reps)
    return len(checked & voided), len(checked)


def unvouched(candidate: Series, reference: Series | None) -> str:
    """Why the candidate's checks do not vouch for its counted blocks, or "" where they do."""
    hit, n = checked_voids(candidate)
    if n and hit == n:
        # no check of a block that counts: whatever the reference's checks, nothing vouches for the
        # candidate's samples (on a loaded host the Fisher test below can miss 3 of 3 against 1 of 7)
        return (
            f"{candidate.subject} case {candidate.case}: all {n} of its checked blocks were voided: no "
            "check of a block that counts vouches for the blocks that do"
        )
    if reference is None or hit == 0:
        return ""
    ref_hit, ref_n = checked_voids(reference)
    table = [[hit, n - hit], [ref_hit, ref_n - ref_hit]]
    p = float(scipy_stats().fisher_exact(table, alternative="greater").pvalue)
    if p >= VOUCH_ALPHA:
        return ""
    return (
        f"{candidate.subject} case {candidate.case}: {hit} of its {n} checked blocks voided against "
        f"{ref_hit} of the reference's {ref_n} (one-sided Fisher p = {p:.2g} < {VOUCH_ALPHA:g}): it was "
        "voided where it was checked (work after its window), so its checks do not vouch for the "
        "blocks that count"
    )
