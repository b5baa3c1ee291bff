"""The statistics of answers that transfer: pure functions of numbers (numpy; scipy imported
where used).

- LR sensitivity, Wortsman et al. 2023 ("Small-scale proxies for large-scale Transformer
  training instabilities", section 3.1): the mean over a log-spaced LR grid of
  min(loss(lr), loss_init) - loss_best, with loss_init the loss at initialisation, so a diverged
  run (no loss) counts as no progress rather than infinity; loss_best is the grid's best.
- Loss vs compute, L(C) = L_inf + A * C^-alpha (the form of Kaplan et al. 2020, "Scaling laws
  for neural language models", with the irreducible term of Hoffmann et al. 2022), fitted with
  one L_inf shared by all variants: with 3-5 rungs a free L_inf per curve is not identified (it
  trades off against A and alpha), and the variants of one ablation share the data, hence its
  entropy floor. Given L_inf, each curve's A and alpha are the linear least-squares fit of
  log(L - L_inf) = log A - alpha log C; L_inf minimises the squared residual of all curves in
  loss units (variable projection, Golub & Pereyra 1973) by a scan, then a bounded Brent search.
- The effective-compute multiplier: the compute the baseline needs to reach the variant's loss,
  divided by the compute the variant was given (the baseline's, at that rung). At a rung, the
  baseline's fitted curve corrected to pass through its measured rungs; at the projected
  compute, both fitted curves. Its CI is a paired percentile bootstrap over seeds (Efron &
  Tibshirani 1993).
- The tuned comparison: each variant at its own best LR against the baseline at its own (paired
  t over seeds, ablate.analysis.stats; Holm 1979 over the variants), next to the comparison at
  one shared LR, which can tell another story.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Union

from ablate.analysis.stats import ALPHA, SeedTest, for_family, holm, mean_std, seed_test, verdict
from ablate.errors import ConfigError

MIN_GRID = 3
MIN_RUNGS = 3
_SCAN = 32  # L_inf scan points before Brent: the profile need not be unimodal
_GN_STEPS = 8  # Gauss-Newton steps per curve from the log-linear start (it is close: 2-4 suffice)


# ---- the LR grid --------------------------------------------------------------------------------
def log_grid(lo: float, hi: float, n: int) -> list[float]:
    """n log-spaced learning rates from lo to hi, both included, at 3 significant digits (so a
    run's name, which shows its LR, is the same on every machine)."""
    if n < MIN_GRID:
        raise ConfigError(f"an LR grid needs at least {MIN_GRID} points, got {n}")
    if lo <= 0 or hi <= 0:
        raise ConfigError(f"learning rates must be positive, got {lo:g}:{hi:g}")
    if hi <= lo:
        raise ConfigError(f"the grid's HI must be above its LO, got {lo:g}:{hi:g}")
    step = (math.log(hi) - math.log(lo)) / (n - 1)
    return [float(f"{math.exp(math.log(lo) + i * step):.3g}") for i in range(n)]


def parse_lr_grid(text: str) -> list[float]:
    """"LO:HI:N" (e.g. 1e-4:1e-1:7) as its grid."""
    parts = str(text).split(":")
    try:
        if len(parts) != 3:
            raise ValueError
        lo, hi, n = float(parts[0]), float(parts[1]), int(parts[2])
    except ValueError:
        raise ConfigError(f"--lr-grid {text}: give LO:HI:N, e.g. 1e-4:1e-1:7 (N log-spaced "
                          "learning rates from LO to HI)") from None
    return log_grid(lo, hi, n)


def _finite(v: Optional[float]) -> bool:
    return v is not None and math.isfinite(v)


def lr_sensitivity(losses: Mapping[float, Optional[float]], loss_init: float) -> float:
    """Wortsman et al.'s LR sensitivity of one curve {lr: final loss (None/nan/inf: diverged)}."""
    if len(losses) < MIN_GRID:
        raise ValueError(f"LR sensitivity needs a grid of at least {MIN_GRID} points")
    # capped at loss_init: a diverged or worsening run counts as no progress, not as infinity
    capped = [min(v, loss_init) if _finite(v) else loss_init for v in losses.values()]
    best = min(capped)
    return sum(c - best for c in capped) / len(capped)


@dataclass(frozen=True)
class BestLR:
    lr: Optional[float]  # None: every grid point diverged
    loss: Optional[float]
    on_edge: bool  # the smallest or the largest grid LR: the optimum may lie outside: widen the grid


def best_lr(losses: Mapping[float, Optional[float]]) -> BestLR:
    done = {lr: v for lr, v in losses.items() if _finite(v)}
    if not done:
        return BestLR(None, None, False)
    lr = min(done, key=done.get)
    return BestLR(lr, done[lr], lr in (min(losses), max(losses)))


# ---- loss vs compute ----------------------------------------------------------------------------
@dataclass(frozen=True)
class PowerLaw:
    l_inf: float
    a: float
    alpha: float

    def loss(self, compute: float) -> float:
        return self.l_inf + self.a * compute ** -self.alpha

    def compute_for(self, loss: float) -> Optional[float]:
        """The compute at which the curve reaches `loss` (None: at or below L_inf, never)."""
        if loss <= self.l_inf or self.a <= 0 or self.alpha <= 0:
            return None
        return ((loss - self.l_inf) / self.a) ** (-1 / self.alpha)


def _curve(x, y, l_inf: float) -> tuple[float, float, float]:
    """(log A, alpha, squared loss residual) of one curve given L_inf, x = log C: the linear
    least-squares fit of log(L - L_inf) = log A - alpha log C, then Gauss-Newton steps on the
    residual in loss units (the log fit alone overweights the rungs nearest L_inf)."""
    import numpy as np

    xm = float(x.mean())
    xc = x - xm  # centred: log A and alpha decouple, and the 2x2 normal equations stay well posed
    z = np.log(y - l_inf)
    alpha, b = -float(np.dot(xc, z) / np.dot(xc, xc)), float(z.mean())

    def resid(b: float, alpha: float):
        with np.errstate(over="ignore", invalid="ignore"):  # an overshoot: inf, then rejected
            m = np.exp(b - alpha * xc)
        r = y - l_inf - m
        return m, r, float(np.dot(r, r))

    m, r, sse = resid(b, alpha)
    for _ in range(_GN_STEPS):
        g = xc * m  # the Jacobian's columns: m and -g
        mm, mg, gg = float(np.dot(m, m)), float(np.dot(m, g)), float(np.dot(g, g))
        mr, gr = float(np.dot(m, r)), float(np.dot(g, r))
        det = mm * gg - mg * mg
        if not det > 0:
            break
        db, da = (gg * mr - mg * gr) / det, (mg * mr - mm * gr) / det
        for t in (1.0, 0.5, 0.25):  # halve a step that overshoots
            m2, r2, sse2 = resid(b + t * db, alpha + t * da)
            if sse2 < sse:
                break
        if not sse2 < sse:
            break
        gain, (b, alpha, m, r, sse) = sse - sse2, (b + t * db, alpha + t * da, m2, r2, sse2)
        if gain <= 1e-12 * (sse + gain):  # converged
            break
    return b + alpha * xm, alpha, sse


def fit_power_laws(curves: Mapping[str, tuple[Sequence[float], Sequence[float]]],
                   l_inf: Optional[float] = None) -> dict[str, PowerLaw]:
    """name -> L(C) = L_inf + A C^-alpha for curves {name: (computes, losses)}: one L_inf shared by
    all (fixed if `l_inf` is given); given L_inf, each curve's A and alpha are its log-linear fit
    refined by Gauss-Newton in loss units (_curve); L_inf minimises the total squared residual
    of L over [0, min loss): least squares in loss units, as curve_fit, on a 1-D profile."""
    import numpy as np
    from scipy.optimize import minimize_scalar

    data = {}
    for name, (c, y) in curves.items():
        if len(c) != len(y):
            raise ValueError(f"{name}: {len(c)} computes but {len(y)} losses")
        if len(c) < MIN_RUNGS:
            raise ValueError(f"{name}: fewer than {MIN_RUNGS} rungs: no extrapolation")
        c, y = np.asarray(c, float), np.asarray(y, float)
        if not (np.all(np.isfinite(c) & (c > 0)) and np.all(np.isfinite(y) & (y > 0))) or np.ptp(c) == 0:
            raise ValueError(f"{name}: the computes must be positive and distinct, the losses positive")
        data[name] = (np.log(c), y)
    floor = min(float(y.min()) for _, y in data.values())
    if l_inf is not None and not 0 <= l_inf < floor:
        raise ValueError(f"a fixed L_inf must lie in [0, {floor:g}) (below every loss), got {l_inf:g}")

    def sse(li: float) -> float:
        return sum(_curve(x, y, li)[2] for x, y in data.values())

    if l_inf is None:
        # a scan first (denser near the floor, where the profile bends), then Brent in the
        # bracket around the scan's best: Brent alone can settle in a local minimum
        scan = [floor * (1 - 10 ** -k) for k in np.linspace(0, 6, _SCAN)]  # 0 .. floor(1 - 1e-6)
        vals = [sse(li) for li in scan]
        i = int(np.argmin(vals))
        lo, hi = scan[max(i - 1, 0)], scan[min(i + 1, len(scan) - 1)]
        res = minimize_scalar(sse, bounds=(lo, hi), method="bounded",
                              options={"xatol": 1e-10 * max(floor, 1.0)})
        l_inf = float(res.x) if res.fun <= vals[i] else scan[i]
    out = {}
    for name, (x, y) in data.items():
        log_a, alpha, _ = _curve(x, y, l_inf)
        out[name] = PowerLaw(float(l_inf), math.exp(log_a), alpha)
    return out


def compute_multiplier(base: PowerLaw, variant_loss: float, compute: float) -> Optional[float]:
    """How much more compute than `compute` the baseline needs to reach `variant_loss` (None:
    the baseline's curve never gets there)."""
    need = base.compute_for(variant_loss)
    return None if need is None else need / compute


@dataclass(frozen=True)
class Multiplier:
    per_rung: list  # at each rung: the variant's mean loss against the baseline's curve
    per_rung_ci: list  # (lo, hi) per rung; (None, None) where no resample had one
    target: float  # the projected compute
    at_target: Optional[float]  # the variant's fitted loss at `target` against the baseline's curve
    ci: tuple  # (lo, hi) at the target
    n_boot: int
    method: str = "paired bootstrap over seeds, shared L_inf"


def baseline_compute(computes: Sequence[float], losses: Sequence[float], fit: PowerLaw,
                     loss: float) -> Optional[float]:
    """The compute at which the baseline reaches `loss`: its fitted curve, corrected to pass
    through each measured rung (the log-compute residuals at the two rungs around `loss`,
    interpolated; beyond the rungs, the nearest one's), so a variant below the baseline's
    measured loss at a rung always gets a multiplier above 1 there."""
    need = fit.compute_for(loss)
    at = [fit.compute_for(v) for v in losses]
    if need is None or None in at:
        return None
    pts = sorted((math.log(a), math.log(c) - math.log(a)) for a, c in zip(at, computes))
    x = math.log(need)
    if x <= pts[0][0]:
        return math.exp(x + pts[0][1])
    for (x0, r0), (x1, r1) in zip(pts, pts[1:]):
        if x <= x1:
            return math.exp(x + r0 + (x - x0) / (x1 - x0) * (r1 - r0)) if x1 > x0 else math.exp(x + r1)
    return math.exp(x + pts[-1][1])


def _multipliers(means: Mapping[str, Sequence[float]], computes: Sequence[float], base: str,
                 variant: str, target: float) -> tuple[list, Optional[float]]:
    """Per rung: the compute the baseline needs for the variant's measured loss / the rung's
    compute; at `target`: the fitted curves (both projected, neither measured)."""
    fits = fit_power_laws({n: (computes, means[n]) for n in (base, variant)})
    per_rung = [None if (need := baseline_compute(computes, means[base], fits[base], v)) is None
                else need / c for v, c in zip(means[variant], computes)]
    return per_rung, compute_multiplier(fits[base], fits[variant].loss(target), target)


def _percentile_ci(values: Sequence[float], alpha: float) -> tuple:
    import numpy as np

    vals = np.asarray(values, float)
    vals = vals[np.isfinite(vals)]  # resamples with no multiplier (unreachable) drop out
    if not len(vals):
        return None, None
    return tuple(float(x) for x in np.percentile(vals, (100 * alpha / 2, 100 * (1 - alpha / 2))))


def multiplier_ci(seed_losses: Mapping[str, Sequence[Sequence[float]]], computes: Sequence[float],
                  base: str, variant: str, target: Optional[float] = None, n_boot: int = 1000,
                  seed: int = 0, alpha: float = ALPHA) -> Multiplier:
    """seed_losses[name][rung]: the final losses of the seeds at that rung, index i the same seed
    for both names (paired). The point estimate fits the per-rung means; the CI refits on
    `n_boot` resamples of the seed indices (the same indices for both: paired, so seed noise
    shared by the two variants cancels). `target`: 10x the largest rung unless given."""
    import numpy as np

    target = target if target is not None else 10 * max(computes)
    data = {n: [np.asarray(v, float) for v in seed_losses[n]] for n in (base, variant)}
    means = {n: [float(v.mean()) for v in data[n]] for n in data}
    per_rung, at_target = _multipliers(means, computes, base, variant, target)
    # one seed pair at a rung: every resample is the same, so no interval there (nor at the target)
    pairs = [min(len(b), len(v)) for b, v in zip(data[base], data[variant])]
    rng = np.random.default_rng(seed)
    boots_rung, boots_target = [], []
    for _ in range(n_boot if max(pairs) > 1 else 0):
        # per rung, seeds past the shorter side have no partner and stay out of the pairing
        picks = [rng.integers(0, k, k) for k in pairs]
        m = {n: [float(x[p].mean()) for x, p in zip(data[n], picks)] for n in data}
        try:
            r, t = _multipliers(m, computes, base, variant, target)
        except (ValueError, FloatingPointError):
            continue
        boots_rung.append([math.nan if x is None else x for x in r])
        boots_target.append(math.nan if t is None else t)
    rung_ci = [_percentile_ci([b[i] for b in boots_rung], alpha) if k > 1 else (None, None)
               for i, k in enumerate(pairs)]
    return Multiplier(per_rung, rung_ci, float(target), at_target,
                      _percentile_ci(boots_target, alpha) if min(pairs) > 1 else (None, None), n_boot)


# ---- rankings across rungs ----------------------------------------------------------------------
def rank_agreement(small: Mapping[str, float], large: Mapping[str, float]) -> Optional[float]:
    """The fraction of pairwise orderings (lower loss is better) at the small rung that hold at
    the large one; a pair tied at the small rung has no ordering and is left out. None with
    fewer than 2 names in both (or every pair tied)."""
    names = [n for n in small if n in large]
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:] if small[a] != small[b]]
    if not pairs:
        return None
    held = sum((small[a] < small[b]) == (large[a] < large[b]) and large[a] != large[b]
               for a, b in pairs)
    return held / len(pairs)


def wins_every_rung(base: Sequence[float], variant: Sequence[float]) -> bool:
    """The variant's loss is below the baseline's at every rung."""
    if len(base) != len(variant) or not base:
        raise ValueError(f"wins_every_rung: {len(base)} baseline and {len(variant)} variant rungs")
    return all(v < b for b, v in zip(base, variant))


# ---- each variant at its own best LR ------------------------------------------------------------
@dataclass(frozen=True)
class Tuned:
    variant: str
    best_lr: Optional[float]  # None: every grid point diverged
    on_edge: bool  # the best LR is the grid's smallest or largest: widen the grid
    n: int  # seeds finished at the best LR
    loss: Optional[float]  # their mean loss
    loss_ci: tuple  # its (1 - alpha) t interval; (None, None) with fewer than 2 seeds
    tuned_delta: Optional[SeedTest]  # vs the baseline at its own best LR; None for the baseline
    p_holm: Optional[float]  # tuned_delta's p, Holm-adjusted over the variants
    verdict: Optional[str]  # better / worse / noise at p_holm; None without a test
    shared_lr: Optional[float]
    shared_delta: Optional[float]  # mean paired difference at shared_lr; None: no common seed
    lr_sensitivity: Optional[float]  # None without a loss at initialisation
    verdict_differs: bool


Runs = Mapping[float, Mapping[Any, Optional[float]]]  # lr -> {seed: final loss, None: diverged}


def grid_curve(runs: Runs) -> dict[float, Optional[float]]:
    """{lr: loss} of one variant's grid: the mean over the seeds present at every LR (more seeds
    at one LR would make it look less noisy, not better); None where any of them diverged (an LR
    that diverges on some seed is not one to pick). No seed at every LR: all seeds at each LR."""
    seeds = set.intersection(*(set(v) for v in runs.values())) if runs else set()
    curve = {}
    for lr, by_seed in runs.items():
        vals = [by_seed[s] for s in seeds] if seeds else list(by_seed.values())
        curve[lr] = sum(vals) / len(vals) if vals and all(_finite(v) for v in vals) else None
    return curve


def _at(runs: Runs, lr: Optional[float]) -> dict:
    """{seed: loss} of the finished seeds at `lr` (matched to 1e-6 relative, as LRs are printed)."""
    hit = [k for k in runs if lr is not None and math.isclose(k, lr, rel_tol=1e-6)]
    return {s: v for s, v in runs[hit[0]].items() if _finite(v)} if hit else {}


def _mean_ci(values: list, alpha: float) -> tuple:
    from scipy import stats

    mean, sd = mean_std(values)
    if sd is None:
        return None, None
    half = stats.t.ppf(1 - alpha / 2, len(values) - 1) * sd / math.sqrt(len(values))
    return mean - half, mean + half


def _differs(test: Optional[SeedTest], word: Optional[str], shared: Optional[float]) -> bool:
    """The shared LR tells another story: the tuned test finds a difference (Holm) and the
    shared delta is zero or points the other way, or the tuned test finds none and the shared
    delta lies outside the tuned CI (a difference the tuned comparison rules out)."""
    if test is None or test.test_delta is None or shared is None:
        return False
    if word in ("better", "worse"):
        return shared == 0 or (shared > 0) != (test.test_delta > 0)
    return test.ci_low is not None and not test.ci_low <= shared <= test.ci_high


def tuned_comparison(runs: Mapping[str, Runs], baseline: str,
                     loss_init: Union[None, float, Mapping[str, Optional[float]]],
                     shared_lr: Optional[float] = None, alpha: float = ALPHA) -> dict[str, Tuned]:
    """runs[variant][lr][seed]: final loss (None/nan/inf: diverged). Each variant's best LR is
    the best of its grid_curve; tuned_delta is stats.seed_test of its seeds there against the
    baseline's at the baseline's best LR (paired by seed); p-values are Holm-adjusted over the
    variants. shared_delta: the mean paired difference at `shared_lr` (None: not given, not in
    the grid, or no common seed); seeds_needed at alpha / (variants tested), the bar of the Holm
    verdict (stats.for_family). loss_init: one value, or one per variant (None: no
    lr_sensitivity). Returns {variant: Tuned}, the baseline first."""
    if baseline not in runs:
        raise ValueError(f"baseline {baseline!r} is not among the variants: {', '.join(runs)}")
    names = [baseline] + [n for n in runs if n != baseline]
    best = {n: best_lr(grid_curve(runs[n])) for n in names}
    at = {n: _at(runs[n], best[n].lr) for n in names}
    tests = {n: seed_test(at[baseline], at[n], alpha) if n != baseline else None for n in names}
    adjusted = dict(zip(names, holm([t.p_value if t else None for t in tests.values()])))
    tested = sum(t is not None and t.p_value is not None for t in tests.values())
    tests = {n: for_family(t, alpha, tested) if t else None for n, t in tests.items()}  # seeds for the Holm verdict
    out = {}
    for n in names:
        init = loss_init.get(n) if isinstance(loss_init, Mapping) else loss_init
        shared = None
        if n != baseline:
            b, v = _at(runs[baseline], shared_lr), _at(runs[n], shared_lr)
            common = set(b) & set(v)
            shared = sum(v[s] - b[s] for s in common) / len(common) if common else None
        t = tests[n]
        word = verdict(t.t, adjusted[n], "val_loss", alpha) if t else None
        vals = list(at[n].values())
        out[n] = Tuned(n, best[n].lr, best[n].on_edge, len(vals), mean_std(vals)[0],
                       _mean_ci(vals, alpha), t, adjusted[n], word, shared_lr, shared,
                       lr_sensitivity(grid_curve(runs[n]), init) if init is not None else None,
                       _differs(t, word, shared))
    return out
