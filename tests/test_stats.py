"""The statistics compare prints (ablate/analysis/stats.py) against independent computations:
"seeds needed" and the power behind it against a simulation of the t-test compare runs (numpy
draws, scipy's ttest), over effects from a fraction of the seed noise to 50 times it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from ablate.analysis.stats import (ALPHA, POWER, family_alpha, for_family, seed_test, seeds_needed,
                                   t_test_power)

DRAWS = 20_000


def simulated_power(effect: float, n: int, alpha: float, paired: bool, rng) -> float:
    """The share of DRAWS experiments of n seeds per variant whose t-test rejects at alpha:
    paired, a one-sample t on the per-seed differences (as scipy's ttest_rel); else Welch's."""
    if paired:
        p = stats.ttest_1samp(rng.normal(effect, 1.0, (DRAWS, n)), 0.0, axis=1).pvalue
    else:
        p = stats.ttest_ind(rng.normal(effect, 1.0, (DRAWS, n)), rng.normal(0.0, 1.0, (DRAWS, n)),
                            axis=1, equal_var=False).pvalue
    return float(np.mean(p < alpha))


@pytest.mark.parametrize("paired", [True, False], ids=["paired", "welch"])
def test_seeds_needed_never_grows_as_the_effect_grows(paired):
    """A bigger difference never needs more seeds: dense over 0.2 to 50 sigma (scipy's noncentral
    t returns NaN at large noncentrality with one or two degrees of freedom, which made 5 sigma
    need 7 seeds and 4 or 8 sigma need 3)."""
    effects = np.geomspace(0.2, 50, 240)
    needed = [seeds_needed(e, paired=paired) for e in effects]
    assert all(isinstance(n, int) and n >= 2 for n in needed)
    assert all(a >= b for a, b in zip(needed, needed[1:])), list(zip(effects, needed))
    assert needed[-1] == 2 and needed[0] > 100
    assert [seeds_needed(-e, paired=paired) for e in (4.0, 5.06, 8.0)] == \
        [seeds_needed(e, paired=paired) for e in (4.0, 5.06, 8.0)]


@pytest.mark.parametrize("alpha", [ALPHA, ALPHA / 3], ids=["alpha", "alpha/3"])
@pytest.mark.parametrize("paired", [True, False], ids=["paired", "welch"])
def test_seeds_needed_is_within_one_seed_of_a_simulated_t_test(paired, alpha):
    """Per effect: the smallest n whose simulated t-test (20,000 draws) rejects 80% of the time is
    within one seed of seeds_needed, and the simulated power at seeds_needed is the computed one."""
    rng = np.random.default_rng(7)
    for effect in (0.8, 1.5, 2.5, 4.0, 5.06, 8.0, 20.0):
        n = seeds_needed(effect, alpha, paired=paired)
        power = {k: simulated_power(effect, k, alpha, paired, rng) for k in range(max(2, n - 2), n + 2)}
        assert min(power) == 2 or power[min(power)] < POWER, (effect, power)  # the scan starts below
        simulated = min(k for k, p in power.items() if p >= POWER)
        assert abs(simulated - n) <= 1, (effect, n, power)
        se = math.sqrt(POWER * (1 - POWER) / DRAWS)
        assert power[n] == pytest.approx(t_test_power(effect, n, alpha, paired), abs=4 * se + 1e-3), effect


def test_the_power_of_small_effects_matches_the_simulation():
    """Where many seeds are needed the simulation's noise spans seeds; its power is still the
    computed one, at seeds_needed and a few seeds off it."""
    rng = np.random.default_rng(11)
    for effect, paired in [(0.3, True), (0.5, False)]:
        n = seeds_needed(effect, paired=paired)
        for k in (n // 2, n):
            se = math.sqrt(0.25 / DRAWS)
            assert simulated_power(effect, k, ALPHA, paired, rng) == pytest.approx(
                t_test_power(effect, k, ALPHA, paired), abs=4 * se)


def test_the_power_where_scipys_noncentral_t_gives_nan():
    """df = 2, noncentrality 8.76 (5.06 sigma, 3 seeds): scipy's nct is NaN; the integral is a
    number, and at moderate noncentrality it equals nct's."""
    crit, nc = stats.t.ppf(0.975, 2), 5.06 * math.sqrt(3)
    assert math.isnan(stats.nct.sf(crit, 2, nc) + stats.nct.cdf(-crit, 2, nc))
    assert 0.97 < t_test_power(5.06, 3) < 0.99
    for effect, n in [(1.0, 5), (0.4, 30), (2.0, 2)]:
        df, nc = n - 1, effect * math.sqrt(n)
        c = stats.t.ppf(0.975, df)
        assert t_test_power(effect, n) == pytest.approx(stats.nct.sf(c, df, nc) + stats.nct.cdf(-c, df, nc),
                                                        abs=1e-9)


def test_seeds_needed_for_a_holm_family_is_at_bonferronis_alpha():
    """The seeds that pass a verdict Holm-corrected over m tests whatever the others' p-values:
    alpha / m, what Holm asks of the smallest p; alpha itself for one test."""
    assert family_alpha(0.05, 1) == 0.05 and family_alpha(0.05, 4) == 0.0125 and family_alpha(0.05, 0) == 0.05
    test = seed_test({0: 3.0, 1: 3.1, 2: 3.05}, {0: 2.95, 1: 3.08, 2: 3.01})
    assert test.seeds_needed == seeds_needed(test.effect) and test.seeds_needed_alpha == 0.05
    four = for_family(test, 0.05, 4)
    assert four.seeds_needed == seeds_needed(test.effect, 0.0125) > test.seeds_needed
    assert four.seeds_needed_alpha == 0.0125 and four.p_value == test.p_value
    welch = for_family(seed_test({0: 3.0, 1: 3.1}, {2: 2.9, 3: 3.05}), 0.05, 2)
    assert welch.test == "Welch t" and welch.seeds_needed == seeds_needed(welch.effect, 0.025, paired=False)


def test_seeds_needed_matches_textbook_sample_sizes_and_a_monte_carlo_power():
    # G*Power / Cohen's tables: paired dz=0.5 -> 34 pairs; dz=1.0 -> 10; two groups d=1.0 -> 17, d=0.5 -> 64
    assert seeds_needed(0.5) == 34 and seeds_needed(-1.0) == 10
    assert seeds_needed(1.0, paired=False) == 17 and seeds_needed(0.5, paired=False) == 64
    assert seeds_needed(0.0) is None and seeds_needed(math.inf) == 2
    assert seeds_needed(0.01) is None  # beyond the limit: said, not invented
    # Monte Carlo: simulate paired differences with that effect; a two-sided t-test at n seeds
    # rejects >= 80% of the time, at n - 1 seeds less often
    rng = np.random.default_rng(0)
    effect = 1.3
    n = seeds_needed(effect)

    def power(k, trials=40_000):
        x = rng.normal(effect, 1.0, size=(trials, k))
        t = x.mean(1) / (x.std(1, ddof=1) / math.sqrt(k))
        return float(np.mean(np.abs(t) > stats.t.ppf(0.975, k - 1)))

    assert power(n) >= 0.8 - 0.01 and power(n - 1) < 0.8 + 0.01
    assert power(n) - power(n - 1) > 0.02
