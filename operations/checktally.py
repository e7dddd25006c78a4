"""One subject's output checks on one case: when a check is due, what it found, its Accuracy record.

Shared by the supervisor (outputs fetched from a worker) and the harness-trusted path (outputs in
the same process), so the gate that decides `failed_accuracy` is one rule in one place.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import numpy as np

from .protocol import Accuracy, AccuracyRule


@dataclass
class CheckTally:
    checks: int = 0
    checked: list[int] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    worst_rel: float = 0.0
    worst_abs: float = 0.0
    passed: bool = True
    detail: str = ""

    def due(self, rule: AccuracyRule, smoke: bool) -> bool:
        """Check this block's output? Asked only after the block returned, so a subject cannot know
        beforehand: the first block of each series, every block of a smoke run, else at random."""
        return self.checks == 0 or smoke or secrets.randbelow(1_000_000) < rule.check_fraction * 1_000_000

    def add(self, rule: AccuracyRule, rep: int, seed: int, rel: float, mx: float, detail: str) -> None:
        """One check's errors against the reference; the first failure's detail is kept."""
        self.checks += 1
        self.checked.append(rep)
        self.seeds.append(seed)
        self.worst_rel = max(self.worst_rel, rel)
        self.worst_abs = max(self.worst_abs, mx)
        ok = rel <= rule.rel_l2 and (rule.max_abs is None or mx <= rule.max_abs)
        if not ok and self.passed:
            self.passed = False
            self.detail = detail or (
                f"rep {rep}: rel_l2 {rel:.3g} (tol {rule.rel_l2:g}), max_abs {mx:.3g} (tol {rule.max_abs})"
            )

    def record(self, rule: AccuracyRule) -> Accuracy:
        return Accuracy(
            passed=self.passed,
            checks=self.checks,
            checked_reps=self.checked,
            worst_rel_l2=self.worst_rel if np.isfinite(self.worst_rel) else None,
            worst_max_abs=self.worst_abs if np.isfinite(self.worst_abs) else None,
            tolerance={"rel_l2": rule.rel_l2, "max_abs": rule.max_abs},
            detail=self.detail,
            input_seeds=self.seeds,
        )
