"""How sure a benchmark figure is (ablate/measure/rounds.py): the median of its rounds and the
distribution-free interval around it, checked against scipy's binomial and a simulation; rounds
further apart than the limit disagree, fewer than two have no spread."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from ablate.measure.rounds import COVERAGE, SPREAD_LIMIT, coverage, disagree, marked, shown, spread


@pytest.mark.parametrize("n", range(1, 25))
def test_the_interval_is_the_widest_order_statistics_that_reach_the_coverage(n):
    for k in range(1, (n + 1) // 2 + 1):
        assert coverage(n, k) == pytest.approx(1 - 2 * stats.binom.cdf(k - 1, n, 0.5), abs=1e-12)
    xs = np.random.default_rng(n).normal(size=n)
    s = spread(xs)
    assert s.median == pytest.approx(np.median(xs))
    if n == 1:
        assert (s.low, s.relative, s.disagrees) == (None, None, False)
        return
    k = sorted(xs).index(s.low) + 1  # the k-th smallest and the k-th largest
    assert s.high == sorted(xs)[n - k] and s.coverage == pytest.approx(coverage(n, k))
    assert s.coverage >= COVERAGE or k == 1  # under 5 rounds only the range, below 90%
    assert k == (n + 1) // 2 or coverage(n, k + 1) < COVERAGE  # the narrowest that reaches it


def test_the_interval_holds_the_true_median_as_often_as_it_says():
    rng = np.random.default_rng(0)
    draws = rng.lognormal(0.0, 0.5, size=(4000, 10))  # skewed, as round times are; median 1
    held = [s.low <= 1.0 <= s.high for s in map(spread, draws)]
    assert spread(draws[0]).coverage == pytest.approx(coverage(10, 2))  # 0.979: k = 2 of 10
    assert np.mean(held) == pytest.approx(coverage(10, 2), abs=0.01)


def test_rounds_further_apart_than_the_limit_are_marked():
    agree = spread([1.0, 1.05, 0.97, 1.02, 1.0])  # 5 rounds: the range, ±4%
    assert agree.relative == pytest.approx((1.05 - 0.97) / 2) and not agree.disagrees
    apart = spread([1.0, 1.3, 0.95, 1.02, 1.0])
    assert apart.relative == pytest.approx((1.3 - 0.95) / 2) and apart.relative > SPREAD_LIMIT and apart.disagrees
    assert marked("2,060", apart.relative) == "2,060*" and marked("2,060", agree.relative) == "2,060"
    assert shown(agree.relative) == "±4%" and shown(None) == "-" and not disagree(None)
