"""The statistics of a comparison, as typed results: is a difference between two sets of
per-seed values bigger than seed noise (seed_test), Holm's correction over a family of tests,
the verdict, and the seeds a test would need (seeds_needed). Pure functions of numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from ablate.vocab import higher_is_better

ALPHA = 0.05
POWER = 0.8  # "seeds needed": the seeds that detect the observed difference this often
SEEDS_NEEDED_LIMIT = 1000  # beyond this, "seeds needed" is reported as more than the limit
MIN_SEEDS = 3  # fewer seeds in a test: a warning (one or two degrees of freedom say little)


def mean_std(values: Sequence[float]) -> tuple[Optional[float], Optional[float]]:
    if not values:
        return None, None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def shown_seeds(keys: Iterable) -> list:
    """Seeds as shown: a run's key is (seed, data_seed); the data seed is shared in a sweep."""
    return [k[0] if isinstance(k, tuple) else k for k in keys]


@dataclass(frozen=True)
class SeedTest:
    """A seed-noise test of mean(other) - mean(base). `test_seeds`: the seeds of `other` in the
    test; `test_delta`: the difference it tested (the mean paired difference, or the difference of
    the means); `ci_*`: its (1 - alpha) confidence interval; `effect`: that difference in units
    of seed noise; `seeds_needed`: the seeds per variant that detect it with 80% power."""

    test: Optional[str] = None  # "paired t" | "Welch t" | None (fewer than 2 seeds on a side)
    t: Optional[float] = None
    p_value: Optional[float] = None
    df: Optional[float] = None
    test_seeds: Optional[list] = None
    test_delta: Optional[float] = None
    ci_low: Optional[float] = None
    ci_high: Optional[float] = None
    effect: Optional[float] = None
    seeds_needed: Optional[int] = None


NO_TEST = SeedTest()


def seeds_needed(effect: Optional[float], alpha: float = ALPHA, power: float = POWER,
                 paired: bool = True, limit: int = SEEDS_NEEDED_LIMIT) -> Optional[int]:
    """Seeds per variant for a two-sided t-test at `alpha` to detect a true difference of
    `effect` (in units of seed noise: Δ / sd) with probability `power`: the smallest n whose
    power, from the noncentral t distribution, reaches it. Paired: df = n - 1, noncentrality
    effect * sqrt(n); two independent samples of n: df = 2n - 2, effect * sqrt(n / 2).
    None when no n up to `limit` does (a zero effect never does)."""
    from scipy import stats

    if effect is None or math.isnan(effect) or effect == 0:
        return None
    if math.isinf(effect):
        return 2  # no noise at all: the smallest test there is
    for n in range(2, limit + 1):
        df, nc = (n - 1, abs(effect) * math.sqrt(n)) if paired else (2 * n - 2, abs(effect) * math.sqrt(n / 2))
        crit = stats.t.ppf(1 - alpha / 2, df)
        if stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc) >= power:
            return n
    return None


def _exact(name: str, diff: float, df, seeds: list, alpha: float, paired: bool) -> SeedTest:
    """Identical differences on every seed: no noise to compare against."""
    effect = 0.0 if diff == 0 else math.copysign(math.inf, diff)
    return SeedTest(name, effect, 1.0 if diff == 0 else 0.0, df, seeds, diff, diff, diff, effect,
                    seeds_needed(effect, alpha, paired=paired))


def seed_test(base: dict, other: dict, alpha: float = ALPHA) -> SeedTest:
    """Is mean(other) - mean(base) bigger than seed noise? `base`/`other` map seed -> value.

    Paired t-test on per-seed differences over the seeds both have (when >= 2: a diverged seed
    on one side drops out of the pairing instead of turning the test into Welch), else Welch's
    t-test when both have >= 2 values, else no test."""
    if len(base) < 2 or len(other) < 2:
        return NO_TEST
    common = sorted(set(base) & set(other), key=str)
    if len(common) >= 2:
        return _paired([other[s] for s in common], [base[s] for s in common], shown_seeds(common), alpha)
    return _welch(list(other.values()), list(base.values()), shown_seeds(sorted(other, key=str)), alpha)


def _paired(a: list, b: list, seeds: list, alpha: float) -> SeedTest:
    from scipy import stats

    diffs = [x - y for x, y in zip(a, b)]
    mean, sd = mean_std(diffs)
    n = len(diffs)
    if sd == 0:
        return _exact("paired t", mean, n - 1, seeds, alpha, paired=True)
    r = stats.ttest_rel(a, b)
    half = stats.t.ppf(1 - alpha / 2, n - 1) * sd / math.sqrt(n)
    effect = mean / sd  # Cohen's d_z: the difference in units of its seed-to-seed sd
    return SeedTest("paired t", float(r.statistic), float(r.pvalue), n - 1, seeds, mean,
                    float(mean - half), float(mean + half), effect, seeds_needed(effect, alpha))


def _welch(a: list, b: list, seeds: list, alpha: float) -> SeedTest:
    from scipy import stats

    (ma, sa), (mb, sb) = mean_std(a), mean_std(b)
    diff = ma - mb
    if sa == 0 and sb == 0:
        return _exact("Welch t", diff, None, seeds, alpha, paired=False)
    r = stats.ttest_ind(a, b, equal_var=False)
    va, vb = sa ** 2 / len(a), sb ** 2 / len(b)  # Welch-Satterthwaite degrees of freedom
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = stats.t.ppf(1 - alpha / 2, df) * math.sqrt(va + vb)
    pooled = math.sqrt(((len(a) - 1) * sa ** 2 + (len(b) - 1) * sb ** 2) / (len(a) + len(b) - 2))
    effect = diff / pooled  # Cohen's d
    return SeedTest("Welch t", float(r.statistic), float(r.pvalue), df, seeds, diff,
                    float(diff - half), float(diff + half), effect, seeds_needed(effect, alpha, paired=False))


def holm(p_values: Sequence[Optional[float]]) -> list[Optional[float]]:
    """Holm-Bonferroni adjusted p-values (None stays None): the k-th smallest of m is
    multiplied by m - k + 1, made monotone and capped at 1. Rejecting where the adjusted p is
    below alpha keeps the chance of any false "better/worse" among the m tests below alpha."""
    idx = sorted((i for i, p in enumerate(p_values) if p is not None), key=lambda i: p_values[i])
    m, out, running = len(idx), list(p_values), 0.0
    for k, i in enumerate(idx):
        running = max(running, min(1.0, (m - k) * p_values[i]))
        out[i] = running
    return out


def verdict(direction: Optional[float], p_value: Optional[float], metric: str,
            alpha: float = ALPHA) -> Optional[str]:
    """better / worse (p < alpha, in the metric's direction) or noise; None without a test.
    `direction`: the sign of the difference the test saw (its t), which can differ from the
    all-seeds delta when the pairing leaves seeds out."""
    if direction is None or p_value is None:
        return None
    if p_value >= alpha or direction == 0:
        return "noise"
    return "better" if (direction > 0) == higher_is_better(metric) else "worse"
