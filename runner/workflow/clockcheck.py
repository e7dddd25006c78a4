"""Does the supervisor's own clock confirm the saving that the worker's windows claim? Pure rules over
a case's two series.

A block's window is timed inside the worker, which has imported the subject: its figure is the
subject's to steer (patch the timer, claim the time as input staging, do the work while staging).
The supervisor brackets the whole command with its own monotonic clock, and `check_bracket`
(operations/integrity.py) voids a block whose bracket the claim cannot explain; but a block's slack
is round trips plus a few hundred microseconds, and a subject whose whole block is shorter than that
can shave any share of it unseen. One block cannot tell; the pairs together can.

1. `unconfirmed`: an accepted case must show its saving on the supervisor's clock. Per kept pair,
   the bracket saving (reference's bracket - candidate's) must exceed the share of the reference's
   window that the minimum effect stands for, less HIDDEN_FLOOR_NS (and at least nothing: a saving
   there must be), one-sided Wilcoxon at the plan's confidence. Whatever
   a subject claims, the bracket is the supervisor's: a candidate no faster than the reference
   cannot pass it. An honest saving too small for the bracket to resolve (a few-us kernel timed
   cold, one run a block) is not confirmed either: the stage is void and says so; hot or graph
   timing puts a whole block of runs between the clocks.
2. `hidden`: time the candidate keeps outside its windows. Per pair, the candidate's bracket minus
   its window, less the reference's, is time its windows do not show; where it exceeds a quarter of
   the claimed saving plus HIDDEN_FLOOR_NS (one-sided Wilcoxon at the plan's confidence), the
   saving was moved, not made. This bounds a forged magnitude that rule 1 lets through (a real gain
   above the minimum, claimed many times larger) to the floor and a quarter of the claim per block.

Both need the window (`Series.window_ns`); records made before it was kept decide as they did.
"""

from __future__ import annotations

import numpy as np

from cko_perf.operations.protocol import Series
from cko_perf.operations.stats import scipy_stats

from .analysis import kept_pairs

HIDDEN_SHARE = 0.25  # of the claimed saving, moved outside the windows, that voids the stage
# ...above this much per block. Two honest subjects' blocks differ outside their windows for reasons
# of their own process: staging the same inputs into a process whose allocator the subject shaped
# took 15-30 us more or less per block in the candidate's worker than in the reference's, and once a
# median 45 us more, on the numpy example's 64x512 case (a 2-core host, blocks of ~630 us). Rule 1
# is untouched by it: whatever the floor, a candidate no faster than the reference is not confirmed.
HIDDEN_FLOOR_NS = 100_000
MIN_PAIRS = 6  # below this a one-sided signed-rank test cannot reach 0.05 (2^-6 = 0.016)


def clock_arrays(ref: Series, cand: Series, exclude_ramping: bool) -> dict[str, np.ndarray] | None:
    """Bracket and window, both subjects, at the pairs the verdict keeps (ns); None without them."""
    full = [s for s in (ref, cand) if len(s.window_ns) == len(s.reps) == len(s.bracket_ns) and s.reps]
    if len(full) < 2:
        return None
    kept, _ = kept_pairs(ref, cand, exclude_ramping)
    if len(kept) < MIN_PAIRS:
        return None
    out = {}
    for tag, s in (("ref", ref), ("cand", cand)):
        at = {r: i for i, r in enumerate(s.reps)}
        out[f"{tag}_bracket"] = np.array([s.bracket_ns[at[r]] for r in kept], dtype=float)
        out[f"{tag}_window"] = np.array([s.window_ns[at[r]] for r in kept], dtype=float)
    return out


def _greater_p(x: np.ndarray) -> float:
    """One-sided Wilcoxon signed-rank p of x centred above 0 (zero differences split between the signs)."""
    if not np.any(x != 0):
        return 1.0
    return float(scipy_stats().wilcoxon(x, zero_method="zsplit", alternative="greater").pvalue)


def unconfirmed(arr: dict[str, np.ndarray], min_effect_pct: float, confidence: float) -> str:
    """Why the supervisor's clock does not confirm the minimum saving, or ""."""
    share = 1.0 - 1.0 / (1.0 + min_effect_pct / 100.0)  # a time ratio of 1 + e saves this share
    # less the floor a block may honestly differ by outside its window (see HIDDEN_FLOOR_NS), and
    # never less than a saving: on a loaded host an honest candidate's staging alone took 170 us more
    # per block than the reference's, a min-effect saving in full would void it there
    need = np.maximum(share * arr["ref_window"] - HIDDEN_FLOOR_NS, 0.0)
    got = arr["ref_bracket"] - arr["cand_bracket"]
    p = _greater_p(got - need)
    if p < 1.0 - confidence:
        return ""
    why = (
        f"the supervisor's clock does not confirm the saving: the median bracket saving per block is "
        f"{np.median(got) / 1e3:.4g} us against {np.median(need) / 1e3:.4g} us that the minimum effect "
        f"({min_effect_pct:g}%, less {HIDDEN_FLOOR_NS / 1e3:g} us) needs (one-sided Wilcoxon p = {p:.2g}, {len(got)} pairs)"
    )
    if np.median(got) <= 0:
        return why + ": around the whole command the candidate is no faster than the reference"
    return why + (
        "; a saving this small per block is not resolved by a clock outside the subject: time more "
        "runs per block (hot or graph timing, a longer min_block_ms)"
    )


def hidden(arr: dict[str, np.ndarray], confidence: float) -> str:
    """Why the candidate's claimed saving reappears outside its windows, or ""."""
    claimed = arr["ref_window"] - arr["cand_window"]
    outside = (arr["cand_bracket"] - arr["cand_window"]) - (arr["ref_bracket"] - arr["ref_window"])
    if np.median(claimed) <= 0:
        return ""
    p = _greater_p(outside - HIDDEN_SHARE * claimed - HIDDEN_FLOOR_NS)
    if p >= 1.0 - confidence:
        return ""
    return (
        f"the candidate's blocks spend a median {np.median(outside) / 1e3:.4g} us more outside their "
        f"windows than the reference's, against a claimed saving of {np.median(claimed) / 1e3:.4g} us "
        f"per block (more than {HIDDEN_SHARE:.0%} of it and {HIDDEN_FLOOR_NS / 1e3:g} us, one-sided Wilcoxon "
        f"p = {p:.2g}): the saving "
        "was moved out of the window, not made"
    )
