"""The statistics of answers that transfer: pure functions of numbers.

- LR sensitivity, Wortsman et al. 2023 ("Small-scale proxies for large-scale Transformer
  training instabilities", section 3.1): the mean over a log-spaced LR grid of
  min(loss(lr), loss_init) - loss_best, with loss_init the loss at initialisation, so a diverged
  run (no loss) counts as no progress rather than infinity; loss_best is the grid's best.
- Loss vs compute, L(C) = L_inf + A * C^-alpha (the form of Kaplan et al. 2020 and of Marin's
  promotion criteria), fitted with one L_inf shared by all variants: with 3-5 rungs a free L_inf
  per curve is not identified (it trades off against alpha), and the variants of one ablation
  share the data, hence its entropy floor. Each curve's A and alpha come from a log-linear fit
  given L_inf; L_inf minimises the squared loss residual of all curves (variable projection).
- The effective-compute multiplier: the compute the baseline needs to reach the variant's loss,
  divided by the compute the variant was given (the baseline's, at that rung). At a rung, the
  baseline's fitted curve corrected to pass through its measured rungs; at the projected
  compute, both fitted curves. Its CI is a paired
  percentile bootstrap over seeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from ablate.errors import ConfigError

MIN_GRID = 3
MIN_RUNGS = 3


# ---- the LR grid --------------------------------------------------------------------------------
def log_grid(lo: float, hi: float, n: int) -> list[float]:
    """n log-spaced learning rates from lo to hi, both included, at 3 significant digits."""
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
    """Wortsman et al.'s LR sensitivity of one curve {lr: final loss (None: diverged)}."""
    if len(losses) < MIN_GRID:
        raise ValueError(f"LR sensitivity needs a grid of at least {MIN_GRID} points")
    capped = [min(v, loss_init) if _finite(v) else loss_init for v in losses.values()]
    best = min(capped)
    return sum(c - best for c in capped) / len(capped)


@dataclass(frozen=True)
class BestLR:
    lr: Optional[float]  # None: every grid point diverged
    loss: Optional[float]
    on_edge: bool  # the smallest or the largest grid LR: the optimum may lie outside the grid


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


def _loglinear(c: Sequence[float], y: Sequence[float], l_inf: float) -> PowerLaw:
    """log(L - L_inf) = log A - alpha log C by least squares."""
    import numpy as np

    x, z = np.log(np.asarray(c, float)), np.log(np.asarray(y, float) - l_inf)
    slope, intercept = np.polyfit(x, z, 1)
    return PowerLaw(float(l_inf), float(math.exp(intercept)), float(-slope))


def fit_power_laws(curves: Mapping[str, tuple[Sequence[float], Sequence[float]]],
                   l_inf: Optional[float] = None) -> dict[str, PowerLaw]:
    """name -> L(C) for curves {name: (computes, losses)}, one L_inf shared (or fixed: `l_inf`)."""
    import numpy as np
    from scipy.optimize import minimize_scalar

    for name, (c, y) in curves.items():
        if len(c) < MIN_RUNGS or len(c) != len(y):
            raise ValueError(f"{name}: fewer than {MIN_RUNGS} rungs: no fit, no extrapolation")

    def fits(li: float) -> dict[str, PowerLaw]:
        return {n: _loglinear(c, y, li) for n, (c, y) in curves.items()}

    def sse(li: float) -> float:
        return sum(float(np.sum((np.asarray(y) - [f.loss(x) for x in c]) ** 2))
                   for f, (c, y) in zip(fits(li).values(), curves.values()))

    if l_inf is None:
        floor = min(min(y) for _, y in curves.values())
        res = minimize_scalar(sse, bounds=(0.0, floor * (1 - 1e-6)), method="bounded",
                              options={"xatol": 1e-9 * max(floor, 1.0)})
        l_inf = float(res.x)
    return fits(l_inf)


def compute_multiplier(base: PowerLaw, variant_loss: float, compute: float) -> Optional[float]:
    """How much more compute than `compute` the baseline needs to reach `variant_loss`."""
    need = base.compute_for(variant_loss)
    return None if need is None else need / compute


@dataclass(frozen=True)
class Multiplier:
    per_rung: list  # at each rung: the variant's mean loss against the baseline's curve
    per_rung_ci: list  # (lo, hi) per rung
    target: float  # the projected compute
    at_target: Optional[float]  # the variant's fitted loss at `target` against the baseline's curve
    ci: tuple  # (lo, hi) at the target
    n_boot: int
    method: str = "paired percentile bootstrap over seeds, shared L_inf"


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


def multiplier_ci(seed_losses: Mapping[str, Sequence[Sequence[float]]], computes: Sequence[float],
                  base: str, variant: str, target: Optional[float] = None, n_boot: int = 1000,
                  seed: int = 0, alpha: float = 0.05) -> Multiplier:
    """seed_losses[name][rung]: the final losses of the seeds at that rung, index i the same seed
    for both names (paired). The point estimate fits the per-rung means; the CI refits on
    `n_boot` resamples of the seed indices (the same indices for both: paired)."""
    import numpy as np

    target = target if target is not None else 10 * max(computes)
    data = {n: [np.asarray(v, float) for v in seed_losses[n]] for n in (base, variant)}
    means = {n: [float(v.mean()) for v in data[n]] for n in data}
    per_rung, at_target = _multipliers(means, computes, base, variant, target)
    rng = np.random.default_rng(seed)
    boots_rung, boots_target = [], []
    for _ in range(n_boot):
        picks = [rng.integers(0, min(len(b), len(v)), min(len(b), len(v)))
                 for b, v in zip(data[base], data[variant])]
        m = {n: [float(x[p].mean()) for x, p in zip(data[n], picks)] for n in data}
        try:
            r, t = _multipliers(m, computes, base, variant, target)
        except (ValueError, FloatingPointError):
            continue
        boots_rung.append([math.nan if x is None else x for x in r])
        boots_target.append(math.nan if t is None else t)
    q = (100 * alpha / 2, 100 * (1 - alpha / 2))

    def interval(values) -> tuple:
        vals = np.asarray(values, float)
        vals = vals[np.isfinite(vals)]
        return tuple(float(x) for x in np.percentile(vals, q)) if len(vals) else (None, None)

    rung_ci = [interval([b[i] for b in boots_rung]) for i in range(len(computes))]
    return Multiplier(per_rung, rung_ci, float(target), at_target, interval(boots_target), n_boot)


# ---- rankings across rungs ----------------------------------------------------------------------
def rank_agreement(small: Mapping[str, float], large: Mapping[str, float]) -> Optional[float]:
    """The fraction of pairwise orderings (lower loss is better) at the small rung that hold at
    the large one; None with fewer than 2 names in both."""
    names = [n for n in small if n in large]
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    if not pairs:
        return None
    held = sum((small[a] < small[b]) == (large[a] < large[b]) for a, b in pairs)
    return held / len(pairs)


def wins_every_rung(base: Sequence[float], variant: Sequence[float]) -> bool:
    return all(v < b for b, v in zip(base, variant))
