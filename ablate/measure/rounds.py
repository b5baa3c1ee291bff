"""How sure a timing is: the median over a benchmark's rounds and the spread of the rounds around
it. Torch-free: the tables of `ablate bench` read it from the results as well.

Each figure of `ablate bench` is the median of its rounds (a speed, or a ratio of two speeds timed
in the same round). Its interval is distribution-free (order statistics, as for any median): the
k-th smallest and k-th largest of n rounds hold the true median with probability
1 - 2 P(Binom(n, 1/2) <= k - 1); k is the largest whose coverage is at least COVERAGE, else 1 (the
range: fewer than 5 rounds cannot reach 90%). Its spread is that interval's half-width over the
median: rounds further apart than SPREAD_LIMIT (±10%) disagree, and the figure is marked: the
machine's load changed while it was timed, so it is noise as much as a result.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence

COVERAGE = 0.9
SPREAD_LIMIT = 0.10  # a half-width above 10% of the median: the rounds disagree
MARK = "*"  # after a figure whose rounds disagree


def coverage(n: int, k: int) -> float:
    """P(the k-th smallest of n draws <= the median <= the k-th largest), for any continuous
    distribution: 1 - 2 P(Binom(n, 1/2) <= k - 1)."""
    return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n


@dataclass(frozen=True)
class Spread:
    """A figure's rounds: their median, its interval (low, high) and that interval's coverage."""

    n: int
    median: float
    low: Optional[float]  # None with one round: no spread to measure
    high: Optional[float]
    coverage: Optional[float]

    @property
    def relative(self) -> Optional[float]:
        """The interval's half-width over the median (0.04: ±4%)."""
        if self.low is None or not self.median:
            return None
        return (self.high - self.low) / (2 * abs(self.median))

    @property
    def disagrees(self) -> bool:
        return disagree(self.relative)


def disagree(relative: Optional[float]) -> bool:
    """Whether rounds with this spread (Spread.relative; None: one round) disagree."""
    return relative is not None and relative > SPREAD_LIMIT


def marked(text: str, relative: Optional[float]) -> str:
    """A figure's text, marked when its rounds (of this spread) disagree."""
    return text + MARK if disagree(relative) else text


def shown(relative: Optional[float]) -> str:
    """A spread as a table shows it: ±4% (one round: -)."""
    return "-" if relative is None else f"±{100 * relative:.0f}%"


def spread(values: Sequence[float]) -> Spread:
    """The median of `values` (one per round) and its interval (module docstring)."""
    xs = sorted(float(v) for v in values)
    n = len(xs)
    if n == 0:
        raise ValueError("no rounds")
    median = statistics.median(xs)
    if n == 1:
        return Spread(1, median, None, None, None)
    k = max([k for k in range(1, (n + 1) // 2 + 1) if coverage(n, k) >= COVERAGE], default=1)
    return Spread(n, median, xs[k - 1], xs[n - k], coverage(n, k))
