"""The statistics of a comparison, as typed results: is a difference between two sets of
per-seed values bigger than seed noise (seed_test), Holm's correction over a family of tests,
the verdict, and the seeds a test would need (seeds_needed). Pure functions of numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Optional, Sequence

from ablate.names import higher_is_better

ALPHA = 0.05
POWER = 0.8  # "seeds needed": the seeds that detect the observed difference this often
SEEDS_NEEDED_LIMIT = 1000  # beyond this, "seeds needed" is reported as more than the limit
_WELCH_NODES = 24  # Gauss-Jacobi nodes over Welch's df (its critical value is smooth in them)
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
    of seed noise; `seeds_needed`: the seeds per variant that detect it with 80% power in a
    two-sided t-test at `seeds_needed_alpha` (the test's alpha; for_family makes it the alpha
    that passes a Holm-corrected verdict)."""

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
    seeds_needed_alpha: Optional[float] = None


NO_TEST = SeedTest()


def t_test_power(effect: float, n: int, alpha: float = ALPHA, paired: bool = True) -> float:
    """The chance that a two-sided t-test at `alpha` on n seeds per variant rejects when the true
    difference is `effect` (in units of seed noise). Paired: T = (Z + nc) / S with
    nc = effect * sqrt(n), S^2 = V / df, V ~ chi2(df), df = n - 1. Welch, two samples of n with
    equal noise: the same with nc = effect * sqrt(n / 2), df = 2n - 2 for S, and the test's own
    Satterthwaite df = (n - 1) / (B^2 + (1 - B)^2), B = V1 / (V1 + V2) ~ Beta((n-1)/2, (n-1)/2)
    independent of S (so its critical value varies with B: Gauss-Jacobi nodes over B).

    The power is the integral over S of P(|Z + nc| > c S) = Phi(nc - c S) + Phi(-nc - c S): a
    bounded, smooth integrand, so it stays exact where scipy's noncentral t (stats.nct, which
    statsmodels uses too) returns NaN (df 1-2, large nc)."""
    import numpy as np
    from scipy import integrate, special

    df = n - 1 if paired else 2 * n - 2
    nc = abs(effect) * math.sqrt(n if paired else n / 2)
    if paired:
        crit, weight = np.array([special.stdtrit(df, 1 - alpha / 2)]), np.ones(1)
    else:
        x, weight = special.roots_jacobi(_WELCH_NODES, (n - 3) / 2, (n - 3) / 2)
        b = (1 + x) / 2
        crit, weight = special.stdtrit((n - 1) / (b * b + (1 - b) ** 2), 1 - alpha / 2), weight / weight.sum()
    # S's density, 2 df s f_chi2(df s^2), on its central 1 - 2e-14 (the rest cannot move 0.8)
    lo, mid, hi = (math.sqrt(special.chdtri(df, q) / df) for q in (1 - 1e-14, 0.5, 1e-14))
    log_norm = math.log(2) + (df / 2) * math.log(df / 2) - special.gammaln(df / 2)

    def integrand(s: float) -> float:
        density = math.exp(log_norm + (df - 1) * math.log(s) - df * s * s / 2)
        return float(np.dot(weight, special.ndtr(nc - crit * s) + special.ndtr(-nc - crit * s))) * density

    return float(integrate.quad(integrand, lo, hi, points=[mid], epsabs=1e-12, limit=200)[0])


def seeds_needed(effect: Optional[float], alpha: float = ALPHA, power: float = POWER,
                 paired: bool = True, limit: int = SEEDS_NEEDED_LIMIT) -> Optional[int]:
    """Seeds per variant for a two-sided t-test at `alpha` to detect a true difference of
    `effect` (in units of seed noise: Δ / sd) with probability `power`: the smallest n whose
    t_test_power reaches it (a bisection: the power grows with n). None when no n up to
    `limit` does (a zero effect never does)."""
    if effect is None or math.isnan(effect) or effect == 0:
        return None
    if math.isinf(effect):
        return 2  # no noise at all: the smallest test there is
    if t_test_power(effect, limit, alpha, paired) < power:
        return None
    lo, hi = 1, limit  # power(lo) < power <= power(hi); n = 1 has no test
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if t_test_power(effect, mid, alpha, paired) >= power else (mid, hi)
    return hi


def family_alpha(alpha: float, family: int) -> float:
    """The alpha at which a test of a Holm family of `family` tests passes whatever the others'
    p-values: Bonferroni's alpha / family, what Holm asks of the smallest p (alpha itself for one)."""
    return alpha / max(family, 1)


def for_family(test: SeedTest, alpha: float, family: int) -> SeedTest:
    """`test` with seeds_needed for a verdict Holm-corrected over `family` tests: the seeds that
    would detect its effect at family_alpha, 80% of the time."""
    if test.test is None:
        return test
    at = family_alpha(alpha, family)
    return replace(test, seeds_needed=seeds_needed(test.effect, at, paired=test.test == "paired t"),
                   seeds_needed_alpha=at)


def _exact(name: str, diff: float, df, seeds: list, alpha: float, paired: bool) -> SeedTest:
    """Identical differences on every seed: no noise to compare against."""
    effect = 0.0 if diff == 0 else math.copysign(math.inf, diff)
    return SeedTest(name, effect, 1.0 if diff == 0 else 0.0, df, seeds, diff, diff, diff, effect,
                    seeds_needed(effect, alpha, paired=paired), alpha)


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


def contrast_test(per_seed: Mapping, alpha: float = ALPHA) -> SeedTest:
    """Is the mean of per-seed contrasts (seed -> a difference or an interaction, each computed
    within one seed) away from 0? A one-sample t-test, T = mean / (sd / sqrt(n)) on n - 1 degrees
    of freedom, two-sided, with its (1 - alpha) interval (the paired t-test of the contrast's two
    sides); no test with fewer than two seeds. No seeds_needed: the interaction reports none."""
    from scipy import stats

    if len(per_seed) < 2:
        return NO_TEST
    seeds = sorted(per_seed, key=str)
    values = [per_seed[s] for s in seeds]
    n, (mean, sd) = len(values), mean_std(values)
    if sd == 0:  # identical on every seed: no noise to compare against
        return SeedTest("paired t", math.copysign(math.inf, mean) if mean else 0.0, 0.0 if mean else 1.0, n - 1,
                        shown_seeds(seeds), mean, mean, mean, math.copysign(math.inf, mean) if mean else 0.0)
    se = sd / math.sqrt(n)
    t = mean / se
    half = float(stats.t.ppf(1 - alpha / 2, n - 1)) * se
    return SeedTest("paired t", t, float(2 * stats.t.sf(abs(t), n - 1)), n - 1, shown_seeds(seeds), mean,
                    mean - half, mean + half, mean / sd)


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
                    float(mean - half), float(mean + half), effect, seeds_needed(effect, alpha), alpha)


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
                    float(diff - half), float(diff + half), effect, seeds_needed(effect, alpha, paired=False),
                    alpha)


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
