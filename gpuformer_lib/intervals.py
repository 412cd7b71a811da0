"""A statistic with its confidence interval: what the case studies' bootstraps return (``ltsf.block_bootstrap``
on forecast errors, ``retrieval.bootstrap_scores`` on BLEU and chrF), so that a verdict such as "which model
wins" is read from an interval rather than from two numbers side by side."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Interval:
    """A statistic (``value``) and its ``level`` interval, ``low`` to ``high``."""

    value: float
    low: float
    high: float
    level: float

    def __post_init__(self):
        if not 0 < self.level < 1:
            raise ValueError(f"level must lie in (0, 1), got {self.level!r}")
        if not self.low <= self.high:
            raise ValueError(f"an interval needs low <= high, got {self.low!r} > {self.high!r}")

    def excludes(self, x: float) -> bool:
        """True when ``x`` lies outside the interval (a difference's interval that excludes 0 separates the two)."""
        return not (self.low <= x <= self.high)
