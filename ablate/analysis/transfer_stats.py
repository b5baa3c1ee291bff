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
  compute, both fitted curves. Its CI is the Δ's own, mapped through the same curve, so it
  holds 1 whenever the Δ's holds 0: at a rung the Δ's t interval over seeds (paired); at the
  projection a t interval (df = seeds - 1) over the projected Δs of per-seed fits.
- The tuned comparison: each variant at its own best LR against the baseline at its own (paired
  t over seeds, ablate.analysis.stats; Holm 1979 over the variants), next to the comparison at
  one shared LR, which can tell another story.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, Union

from ablate.analysis.stats import ALPHA, SeedTest, for_family, holm, mean_std, seed_test, verdict
from ablate.errors import ConfigError
from ablate.names import VAL_LOSS

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
    """The compute multiplier of a variant against the baseline. Each interval is its Δ's,
    mapped through the same curve as the point estimate, so it holds 1 whenever the Δ's interval
    holds 0; (None, None) where the seeds give no interval; an upper end of inf where the
    baseline's curve never reaches that loss."""

    per_rung: list  # at each rung: the variant's mean loss against the baseline's corrected curve
    per_rung_ci: list  # (lo, hi) per rung: its Δ's t interval (stats.seed_test) mapped
    delta_ci: list  # (lo, hi) per rung: that Δ interval; (None, None) without a test
    target: float  # the projected compute
    at_target: Optional[float]  # the variant's fitted loss at `target` against the baseline's curve
    ci: tuple  # (lo, hi) at the target: delta_at_target_ci mapped
    delta_at_target: Optional[float]  # fitted variant minus fitted baseline loss at `target`
    delta_at_target_ci: tuple  # its t interval over the per-seed fits (df = seeds - 1)
    seeds: int  # the seeds with a loss on every rung for both: their per-seed fits give that spread
    method: str = "Δ t-intervals mapped through the baseline's curve; projection: t over per-seed fits"


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


def _ratio(need, ref) -> Optional[float]:
    return None if need is None or ref is None else need / ref


def rung_multiplier(computes: Sequence[float], base_means: Sequence[float], fit: PowerLaw, rung: int,
                    delta: float) -> Optional[float]:
    """The multiplier at `rung` of a loss `delta` from the baseline's mean there: the baseline's
    (corrected) compute for that loss over its compute for its own (the rung's compute, so a Δ
    of 0 is exactly 1). None: the curve never gets there (or has no shape to read)."""
    ref = baseline_compute(computes, base_means, fit, base_means[rung])
    return _ratio(baseline_compute(computes, base_means, fit, base_means[rung] + delta), ref)


def target_multiplier(fit: PowerLaw, target: float, delta: float) -> Optional[float]:
    """The multiplier at `target` of a loss `delta` from the baseline's fitted loss there."""
    return _ratio(fit.compute_for(fit.loss(target) + delta), fit.compute_for(fit.loss(target)))


def _mapped(to_mult, ci: tuple, kinks: Sequence[float] = ()) -> tuple:
    """A Δ interval (lo, hi) as the multipliers it spans: the range of to_mult over it, read at its
    ends and at the `kinks` inside it (where to_mult, linear in log compute between them, turns:
    a baseline whose measured losses do not fall along its rungs); unbounded where the curve never
    reaches a loss. It holds to_mult(0) = 1 whenever the Δ interval holds 0."""
    if ci[0] is None:
        return None, None
    values = [to_mult(d) for d in (ci[0], ci[1], *(k for k in kinks if ci[0] < k < ci[1]))]
    reached = [v for v in values if v is not None]
    if not reached:
        return None, None
    return min(reached), math.inf if len(reached) < len(values) else max(reached)


def _seed_dict(losses) -> dict:
    return dict(losses) if isinstance(losses, Mapping) else dict(enumerate(losses))


def _projected_delta_ci(by_seed: Mapping[str, list], computes: Sequence[float], base: str, variant: str,
                        target: float, centre: float, alpha: float) -> tuple[tuple, int]:
    """The t interval of the projected Δ at `target`: each seed's own two-curve fit gives one Δ;
    centred on `centre` (the fit of the means), half-width t(1 - alpha/2, k - 1) x sd / sqrt(k)
    over the k seeds with a loss on every rung for both. ((None, None), k) when k < 2."""
    from scipy import stats

    seeds = set.intersection(*(set(r) for n in (base, variant) for r in by_seed[n]))
    deltas = []
    for s in sorted(seeds, key=str):
        try:
            fits = fit_power_laws({n: (computes, [r[s] for r in by_seed[n]]) for n in (base, variant)})
        except (ValueError, FloatingPointError):
            continue  # a seed whose losses have no curve: it adds no spread
        deltas.append(fits[variant].loss(target) - fits[base].loss(target))
    sd = mean_std(deltas)[1]
    if sd is None:
        return (None, None), len(deltas)
    half = float(stats.t.ppf(1 - alpha / 2, len(deltas) - 1)) * sd / math.sqrt(len(deltas))
    return (centre - half, centre + half), len(deltas)


def multiplier_ci(seed_losses: Mapping[str, Sequence[Any]], computes: Sequence[float], base: str,
                  variant: str, target: Optional[float] = None, alpha: float = ALPHA) -> Multiplier:
    """seed_losses[name][rung]: {seed: final loss} at that rung (a list: index = seed). The point
    estimates fit the per-rung means (one L_inf shared). At a rung the interval is the Δ's own
    (stats.seed_test: paired t over the common seeds, else Welch; none with one seed a side)
    mapped through the baseline's corrected curve; at `target` (10x the largest rung unless
    given), the projected Δ's t interval over per-seed fits mapped through its fitted curve."""
    target = target if target is not None else 10 * max(computes)
    by_seed = {n: [_seed_dict(r) for r in seed_losses[n]] for n in (base, variant)}
    means = {n: [mean_std(list(r.values()))[0] for r in by_seed[n]] for n in by_seed}
    fits = fit_power_laws({n: (computes, means[n]) for n in (base, variant)})
    per_rung, rung_ci, delta_ci = [], [], []
    for i, (b, v) in enumerate(zip(by_seed[base], by_seed[variant])):
        to_mult = lambda d, i=i: rung_multiplier(computes, means[base], fits[base], i, d)
        test = seed_test(b, v, alpha)
        delta_ci.append((test.ci_low, test.ci_high))
        per_rung.append(to_mult(means[variant][i] - means[base][i]))
        rung_ci.append(_mapped(to_mult, delta_ci[-1], [m - means[base][i] for m in means[base]]))
    centre = fits[variant].loss(target) - fits[base].loss(target)
    at_ci, k = _projected_delta_ci(by_seed, computes, base, variant, target, centre, alpha)
    to_mult = lambda d: target_multiplier(fits[base], target, d)
    return Multiplier(per_rung, rung_ci, delta_ci, float(target), to_mult(centre), _mapped(to_mult, at_ci),
                      centre, at_ci, k)


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
    values: Mapping = field(default_factory=dict)  # seed -> loss at the best LR (what tuned_delta pairs)


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


def mean_ci(values: list, alpha: float) -> tuple:
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
                     shared_lr: Optional[float] = None, alpha: float = ALPHA,
                     reference: Optional[Mapping[str, Optional[str]]] = None) -> dict[str, Tuned]:
    """runs[variant][lr][seed]: final loss (None/nan/inf: diverged). Each variant's best LR is
    the best of its grid_curve; tuned_delta is stats.seed_test of its seeds there against the
    baseline's at the baseline's best LR (paired by seed); p-values are Holm-adjusted over the
    variants. shared_delta: the mean paired difference at `shared_lr` (None: not given, not in
    the grid, or no common seed); seeds_needed at alpha / (variants tested), the bar of the Holm
    verdict (stats.for_family). loss_init: one value, or one per variant (None: no
    lr_sensitivity). reference: variant -> the variant it is compared with (None: a baseline;
    two crossed axes have one per level), by default `baseline` for all. Returns {variant: Tuned},
    the baseline first."""
    if baseline not in runs:
        raise ValueError(f"baseline {baseline!r} is not among the variants: {', '.join(runs)}")
    names = [baseline] + [n for n in runs if n != baseline]
    ref = dict(reference) if reference is not None else {n: None if n == baseline else baseline for n in names}
    best = {n: best_lr(grid_curve(runs[n])) for n in names}
    at = {n: _at(runs[n], best[n].lr) for n in names}
    tests = {n: seed_test(at[ref[n]], at[n], alpha) if ref[n] is not None else None for n in names}
    adjusted = dict(zip(names, holm([t.p_value if t else None for t in tests.values()])))
    tested = sum(t is not None and t.p_value is not None for t in tests.values())
    tests = {n: for_family(t, alpha, tested) if t else None for n, t in tests.items()}  # seeds for the Holm verdict
    out = {}
    for n in names:
        init = loss_init.get(n) if isinstance(loss_init, Mapping) else loss_init
        shared = None
        if ref[n] is not None:
            b, v = _at(runs[ref[n]], shared_lr), _at(runs[n], shared_lr)
            common = set(b) & set(v)
            shared = sum(v[s] - b[s] for s in common) / len(common) if common else None
        t = tests[n]
        word = verdict(t.t, adjusted[n], VAL_LOSS, alpha) if t else None
        vals = list(at[n].values())
        out[n] = Tuned(n, best[n].lr, best[n].on_edge, len(vals), mean_std(vals)[0],
                       mean_ci(vals, alpha), t, adjusted[n], word, shared_lr, shared,
                       lr_sensitivity(grid_curve(runs[n]), init) if init is not None else None,
                       _differs(t, word, shared), at[n])
    return out
