"""The statistics of --lr-grid and --ladder against independent references:
LR sensitivity against hand-computed tables (Wortsman et al. 2023's definition), the L(C) fit
against scipy.optimize.curve_fit on synthetic data with known parameters, the compute
multiplier on curves whose answer is known, the tuned comparison against a hand table with
scipy's paired t and Holm by hand."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from scipy.optimize import curve_fit

from scipy import stats

from ablate.analysis.transfer_stats import (PowerLaw, best_lr, compute_multiplier, fit_power_laws,
                                      grid_curve, log_grid, lr_sensitivity, multiplier_ci,
                                      parse_lr_grid, rank_agreement, tuned_comparison,
                                      wins_every_rung)
from ablate.analysis.transfer_report import Point, ladder_report
from ablate.errors import ConfigError
from compare_fixtures import ladder_record
from ablate.sweep.transfer_record import TransferRecord

GRID = [1e-4, 1e-3, 1e-2, 1e-1]


@pytest.mark.parametrize("losses, init, expected", [
    # best 2.0; capped: 3, 2, 2.5, 4 -> (1 + 0 + 0.5 + 2) / 4
    ([3.0, 2.0, 2.5, 4.0], 5.0, 0.875),
    # a diverged point (None, inf) counts as the loss at init: (1 + 0 + 3 + 3) / 4
    ([3.0, 2.0, None, math.inf], 5.0, 1.75),
    ([3.0, 2.0, math.nan, None], 5.0, 1.75),
    # a loss above init (a run that got worse) is capped at init: (1 + 0 + 0.5 + 3) / 4
    ([3.0, 2.0, 2.5, 7.0], 5.0, 1.125),
    ([2.0, 2.0, 2.0, 2.0], 5.0, 0.0),  # flat: no sensitivity
    ([None, None, None, None], 5.0, 0.0),  # all diverged: no progress anywhere
    ([1.0, 2.0, 3.0, 4.0], 5.0, 1.5),  # best on the edge: (0 + 1 + 2 + 3) / 4
])
def test_lr_sensitivity_matches_hand_tables(losses, init, expected):
    assert lr_sensitivity(dict(zip(GRID, losses)), init) == pytest.approx(expected)


def test_lr_sensitivity_needs_three_points():
    with pytest.raises(ValueError):
        lr_sensitivity({1e-3: 2.0, 1e-2: 2.1}, 5.0)


def test_best_lr_flags_the_grids_edges():
    low = best_lr(dict(zip(GRID, [1.0, 2.0, 3.0, 4.0])))
    assert low.lr == 1e-4 and low.on_edge
    top = best_lr(dict(zip(GRID, [4.0, 3.0, 2.0, 1.0])))
    assert top.lr == 1e-1 and top.on_edge
    mid = best_lr(dict(zip(GRID, [4.0, 2.0, None, 3.0])))
    assert (mid.lr, mid.loss, mid.on_edge) == (1e-3, 2.0, False)
    assert best_lr(dict(zip(GRID, [None] * 4))).lr is None


def test_log_grid_and_its_bad_input():
    assert log_grid(1e-4, 1e-1, 4) == [1e-4, 1e-3, 1e-2, 1e-1]
    # 10^(-4 + k/3), by hand, at 3 significant digits
    assert log_grid(1e-4, 1e-2, 7) == [1e-4, 2.15e-4, 4.64e-4, 1e-3, 2.15e-3, 4.64e-3, 1e-2]
    assert parse_lr_grid("1e-3:1e-1:5") == [1e-3, 3.16e-3, 1e-2, 3.16e-2, 1e-1]
    for args, message in [((1e-3, 1e-1, 2), "an LR grid needs at least 3 points"),
                          ((0.0, 1e-1, 5), "learning rates must be positive"),
                          ((1e-3, -1.0, 5), "learning rates must be positive"),
                          ((1e-2, 1e-2, 5), "HI must be above its LO")]:
        with pytest.raises(ConfigError, match=message):
            log_grid(*args)
    for text, message in [("1e-3:1e-1:2", "at least 3"), ("0:1e-1:5", "positive"),
                          ("-1:1:4", "positive"), ("1e-1:1e-3:4", "above"), ("1e-3,1e-1", "LO:HI:N"),
                          ("a:b:c", "LO:HI:N"), ("1e-3:1e-1:2.5", "LO:HI:N"), ("", "LO:HI:N")]:
        with pytest.raises(ConfigError, match=message):
            parse_lr_grid(text)


TRUE = PowerLaw(1.5, 50.0, 0.3)
COMPUTE = [1e9, 1e10, 1e11, 1e12, 1e13]


def _law(c, l_inf, a, alpha):
    return l_inf + a * np.asarray(c, float) ** -alpha


def _reference(c, y, p0=(1.4, 40.0, 0.25)):
    """scipy's curve_fit (least squares in loss units) in log-compute, from a nearby start."""
    p, _ = curve_fit(lambda x, li, a, al: _law(10 ** x, li, a, al), np.log10(c), y, p0=p0, maxfev=20000)
    return p


def _noisy(law, noise, seed, computes=COMPUTE):
    rng = np.random.default_rng(seed)
    return [law.loss(c) + noise * rng.standard_normal() for c in computes]


@pytest.mark.parametrize("noise, seed", [(0.0, 0), (2e-4, 0), (2e-4, 1), (2e-3, 0), (2e-3, 2), (2e-3, 3)])
def test_fit_recovers_known_parameters_as_curve_fit_does(noise, seed):
    y = _noisy(TRUE, noise, seed)
    fit = fit_power_laws({"x": (COMPUTE, y)})["x"]
    ref = _reference(np.array(COMPUTE), np.array(y))
    # the same least-squares solution as curve_fit's: parameters and curve
    assert (fit.l_inf, fit.a, fit.alpha) == pytest.approx(tuple(ref), rel=1e-4)
    assert [fit.loss(c) for c in COMPUTE] == pytest.approx(list(_law(COMPUTE, *ref)), abs=1e-7)
    if noise == 0:
        assert (fit.l_inf, fit.a, fit.alpha) == pytest.approx((1.5, 50.0, 0.3), rel=1e-6)
    elif noise <= 2e-4:  # near the truth where the noise leaves it identified (A the least so)
        assert (fit.l_inf, fit.alpha) == (pytest.approx(1.5, abs=1e-3), pytest.approx(0.3, abs=0.01))
        assert fit.a == pytest.approx(50.0, rel=0.15)


def test_two_curves_share_one_l_inf_as_a_joint_curve_fit():
    other = PowerLaw(1.5, 80.0, 0.25)
    exact = {"a": (COMPUTE, [TRUE.loss(c) for c in COMPUTE]), "b": (COMPUTE, [other.loss(c) for c in COMPUTE])}
    fits = fit_power_laws(exact)
    assert fits["a"].l_inf == fits["b"].l_inf == pytest.approx(1.5, rel=1e-6)
    assert (fits["a"].a, fits["a"].alpha, fits["b"].a, fits["b"].alpha) == pytest.approx((50, 0.3, 80, 0.25), rel=1e-4)
    # with noise: the joint least squares (one L_inf, two A and alpha) by curve_fit
    ya, yb = _noisy(TRUE, 2e-3, 3), _noisy(other, 2e-3, 4)
    fits = fit_power_laws({"a": (COMPUTE, ya), "b": (COMPUTE, yb)})
    x = np.log10(COMPUTE)
    joint = lambda _, li, a1, al1, a2, al2: np.concatenate([_law(10 ** x, li, a1, al1), _law(10 ** x, li, a2, al2)])
    p, _ = curve_fit(joint, np.zeros(10), np.array(ya + yb), p0=(1.4, 40, 0.25, 60, 0.2), maxfev=50000)
    got = (fits["a"].l_inf, fits["a"].a, fits["a"].alpha, fits["b"].a, fits["b"].alpha)
    assert got == pytest.approx(tuple(p), rel=1e-3)
    assert fits["b"].l_inf == fits["a"].l_inf


def test_a_fixed_l_inf_is_kept_and_must_lie_below_the_losses():
    other = PowerLaw(1.5, 80.0, 0.25)
    y = _noisy(other, 2e-3, 5)
    fixed = fit_power_laws({"b": (COMPUTE, y)}, l_inf=1.5)["b"]
    p, _ = curve_fit(lambda x, a, al: _law(10 ** x, 1.5, a, al), np.log10(COMPUTE), y, p0=(60, 0.2), maxfev=20000)
    assert (fixed.l_inf, fixed.a, fixed.alpha) == (1.5, pytest.approx(p[0], rel=1e-4), pytest.approx(p[1], rel=1e-4))
    exact = fit_power_laws({"b": (COMPUTE, [other.loss(c) for c in COMPUTE])}, l_inf=1.5)["b"]
    assert (exact.a, exact.alpha) == pytest.approx((80.0, 0.25), rel=1e-6)
    for bad in (min(y), 10.0, -0.1):
        with pytest.raises(ValueError, match="below every loss"):
            fit_power_laws({"b": (COMPUTE, y)}, l_inf=bad)


def test_fewer_than_three_rungs_refuse_to_fit():
    with pytest.raises(ValueError, match="fewer than 3 rungs: no extrapolation"):
        fit_power_laws({"x": (COMPUTE[:2], [3.0, 2.5])})
    with pytest.raises(ValueError, match="b: fewer than 3 rungs"):  # one short curve is enough
        fit_power_laws({"a": (COMPUTE, [TRUE.loss(c) for c in COMPUTE]), "b": (COMPUTE[:2], [3.0, 2.5])})
    with pytest.raises(ValueError, match="3 computes but 2 losses"):
        fit_power_laws({"x": (COMPUTE[:3], [3.0, 2.5])})


def test_the_power_law_and_its_inverse():
    assert TRUE.loss(1e10) == pytest.approx(1.5 + 50 * 1e10 ** -0.3)
    assert TRUE.compute_for(TRUE.loss(3e11)) == pytest.approx(3e11, rel=1e-9)
    assert TRUE.compute_for(1.5) is None and TRUE.compute_for(1.4) is None


def test_a_variant_on_the_baselines_curve_at_twice_the_compute_has_multiplier_two():
    rungs = COMPUTE[:3]
    base = [TRUE.loss(c) for c in rungs]
    twice = [TRUE.loss(2 * c) for c in rungs]
    fits = fit_power_laws({"base": (rungs, base), "v": (rungs, twice)})
    assert [compute_multiplier(fits["base"], v, c) for v, c in zip(twice, rungs)] == pytest.approx([2, 2, 2], rel=1e-3)
    assert compute_multiplier(TRUE, TRUE.loss(2e13), 1e13) == pytest.approx(2, rel=1e-9)
    assert compute_multiplier(TRUE, TRUE.l_inf - 0.1, 1e9) is None  # below L_inf: never reached
    # no seed noise: the point estimate is 2 per rung and at the target, and so is each interval
    exact = multiplier_ci({"base": [[x] * 3 for x in base], "v": [[x] * 3 for x in twice]}, rungs, "base", "v")
    assert exact.target == 10 * rungs[-1] and exact.at_target == pytest.approx(2, rel=1e-3)
    assert exact.per_rung == pytest.approx([2, 2, 2], rel=1e-3)
    assert exact.ci == pytest.approx((2, 2), rel=1e-3) and exact.seeds == 3
    assert all(ci == pytest.approx((2, 2), rel=1e-3) for ci in exact.per_rung_ci)


def test_the_multiplier_ci_holds_two_and_narrows_with_more_seeds():
    rungs = COMPUTE[:3]
    base = [TRUE.loss(c) for c in rungs]
    twice = [TRUE.loss(2 * c) for c in rungs]
    rng = np.random.default_rng(1)
    seeds = lambda losses, k: [[x + 0.003 * rng.standard_normal() for _ in range(k)] for x in losses]
    few_seeds = {"base": seeds(base, 3), "v": seeds(twice, 3)}
    few = multiplier_ci(few_seeds, rungs, "base", "v")
    many = multiplier_ci({"base": seeds(base, 12), "v": seeds(twice, 12)}, rungs, "base", "v")
    for m in (few, many):
        assert m.ci[0] <= 2 <= m.ci[1]
        assert all(lo <= 2 <= hi for lo, hi in m.per_rung_ci)
    assert many.ci[1] - many.ci[0] < few.ci[1] - few.ci[0]  # more seeds, a narrower interval
    assert multiplier_ci(few_seeds, rungs, "base", "v") == few  # no randomness: the same numbers
    # each rung's interval is that rung's (around its own estimate, not all alike)
    assert all(lo <= x <= hi for x, (lo, hi) in zip(few.per_rung, few.per_rung_ci))
    assert len(set(few.per_rung_ci)) == 3
    # a 99.9% interval holds the 95% one, a 50% one lies inside it
    wide = multiplier_ci(few_seeds, rungs, "base", "v", alpha=0.001)
    narrow = multiplier_ci(few_seeds, rungs, "base", "v", alpha=0.5)
    assert wide.ci[0] < few.ci[0] < narrow.ci[0] < narrow.ci[1] < few.ci[1] < wide.ci[1]


def test_the_multiplier_ci_is_paired():
    """A variant equal to the baseline seed by seed: every paired difference is 0, so each
    interval is exactly 1; an unpaired interval would spread it."""
    rungs = COMPUTE[:3]
    rng = np.random.default_rng(2)
    same = [[TRUE.loss(c) + 0.004 * rng.standard_normal() for _ in range(6)] for c in rungs]
    m = multiplier_ci({"base": same, "v": same}, rungs, "base", "v")
    assert m.per_rung == pytest.approx([1, 1, 1], rel=1e-6) and m.at_target == pytest.approx(1, rel=1e-6)
    assert all(ci == pytest.approx((1, 1), rel=1e-6) for ci in m.per_rung_ci + [m.ci])


def test_one_seed_pair_gives_a_multiplier_but_no_interval():
    """With one seed per rung there is no seed noise to measure: an interval of zero width would
    claim a certainty the sweep does not have. A rung with two seeds keeps its own interval; the
    target's needs two seeds with a loss on every rung."""
    rungs = COMPUTE[:3]
    base = [TRUE.loss(c) for c in rungs]
    twice = [TRUE.loss(2 * c) for c in rungs]
    one = multiplier_ci({"base": [[x] for x in base], "v": [[x] for x in twice]}, rungs, "base", "v")
    assert one.per_rung == pytest.approx([2, 2, 2], rel=1e-3) and one.at_target == pytest.approx(2, rel=1e-3)
    assert one.per_rung_ci == [(None, None)] * 3 and one.ci == (None, None)
    mixed = multiplier_ci({"base": [[x, x + 0.01] for x in base[:2]] + [[base[2]]],
                           "v": [[x, x - 0.01] for x in twice[:2]] + [[twice[2]]]}, rungs, "base", "v")
    assert all(lo < hi for lo, hi in mixed.per_rung_ci[:2])
    assert mixed.per_rung_ci[2] == (None, None) and mixed.ci == (None, None)


def test_a_variant_of_the_tokens_alone_reads_as_the_twice_the_tokens_check():
    """compare names the check for a variant that only changes the ladder's tokens per parameter:
    k x the baseline's tokens should come out at x = k on every rung, and each rung is said to hold
    k, lie above it (too few tokens per parameter) or below it (too many)."""
    rungs = COMPUTE[:3]  # two seeds; a seed's offset nearly the same for every variant (paired)

    def points(variant, losses):
        noise = (0.002, -0.002) if variant == "baseline" else (0.0021, -0.0021)
        return [Point(variant, seed, 0.01, f"r{i}", loss + e, None, c, None, "")
                for i, (c, loss) in enumerate(zip(rungs, losses)) for seed, e in enumerate(noise)]
    record = ladder_record([(f"r{i}", 16 * (i + 1), i + 1) for i in range(3)])
    at_twice = [TRUE.loss(2 * c) for c in rungs]
    report = ladder_report(points("baseline", [TRUE.loss(c) for c in rungs])
                           + points("ladder.tokens_per_param=40", at_twice)   # 2x the tokens, x = 2
                           + points("ladder.tokens_per_param=80", at_twice)   # 4x the tokens, x = 2
                           + points("pos=rope", at_twice), record)
    checks = [n for n in report.notes if "its tokens: on a compute-optimal ladder" in n]
    assert len(checks) == 2  # pos=rope is no check of the ladder, whatever its multiplier
    two, four = checks
    assert two.startswith("ladder.tokens_per_param=40 is the baseline on 2x its tokens")
    assert two.count("holds 2") == 3 and "above" not in two.split(". ")[0]
    assert four.startswith("ladder.tokens_per_param=80 is the baseline on 4x its tokens")
    assert four.count("] below") == 3 and "20 tokens per parameter are too few" in four
    # one seed: the verdict has no interval behind it, and the note says so
    one = ladder_report([p for p in report.points if p.seed == 0], record)
    assert any("(one seed: no interval)" in n for n in one.notes)


def test_rank_agreement_and_wins_by_hand():
    small = {"a": 1.0, "b": 2.0, "c": 3.0}
    assert rank_agreement(small, {"a": 1.0, "b": 2.0, "c": 3.0}) == 1.0
    assert rank_agreement(small, {"a": 3.0, "b": 2.0, "c": 1.0}) == 0.0
    assert rank_agreement(small, {"a": 2.0, "b": 1.0, "c": 3.0}) == pytest.approx(2 / 3)  # a<b flips
    # a<b holds (2 < 3); a<c and b<c flip
    assert rank_agreement(small, {"a": 2.0, "b": 3.0, "c": 1.0}) == pytest.approx(1 / 3)
    assert rank_agreement(small, {"a": 1.0, "b": 2.0, "d": 0.0}) == 1.0  # names in both only
    assert rank_agreement({"a": 1.0, "b": 1.0, "c": 2.0}, {"a": 0.0, "b": 5.0, "c": 9.0}) == 1.0  # a tie: no ordering
    assert rank_agreement(small, {"a": 1.0, "b": 1.0, "c": 3.0}) == pytest.approx(2 / 3)  # a<b became a tie
    assert rank_agreement({"a": 2.0, "b": 1.0}, {"a": 1.0, "b": 1.0}) == 0.0  # b<a became a tie
    assert rank_agreement({"a": 1.0}, {"a": 1.0}) is None
    assert wins_every_rung([3.0, 2.0, 1.5], [2.9, 1.9, 1.4]) and not wins_every_rung([3.0, 2.0], [2.9, 2.1])
    assert not wins_every_rung([3.0, 2.0], [2.9, 2.0])  # a tie is not a win
    with pytest.raises(ValueError):
        wins_every_rung([3.0, 2.0, 1.5], [2.9, 1.9])


def test_a_variant_below_the_measured_baseline_at_a_rung_has_a_multiplier_above_one():
    """The fit need not pass through the baseline's rungs; the multiplier there must agree with
    the measured delta (the defect a pure-fit multiplier had: Δ < 0 and x < 1 on one rung)."""
    from ablate.analysis.transfer_stats import baseline_compute

    computes = [1e9, 1e10, 1e11, 1e12]
    base = [3.0, 2.40, 2.25, 1.95]  # kinked: no L_inf + A C^-alpha goes through all four
    fits = fit_power_laws({"base": (computes, base)})
    assert any(abs(fits["base"].loss(c) - b) > 1e-3 for c, b in zip(computes, base))
    for c, b in zip(computes, base):
        assert baseline_compute(computes, base, fits["base"], b) == pytest.approx(c, rel=1e-9)
        assert baseline_compute(computes, base, fits["base"], b - 0.005) > c
        assert baseline_compute(computes, base, fits["base"], b + 0.005) < c


def test_the_tuned_report_by_hand():
    """A hand table: the baseline is best at 1e-2, the variant at 1e-1 (each with 3 seeds there);
    at the shared LR 1e-2 the variant is worse, at its own best LR it is better: verdict differs."""
    from ablate.analysis.transfer_report import Point, lr_grid_report

    def pt(v, lr, seed, loss):
        return Point(v, seed, lr, None, loss, 5.0, None, None, f"{v}/{lr}/{seed}")

    grid = [1e-3, 1e-2, 1e-1]
    base = {1e-3: 3.0, 1e-2: 2.50, 1e-1: None}  # diverged at the top
    var = {1e-3: 3.1, 1e-2: 2.60, 1e-1: 2.40}
    points = [pt("baseline", lr, 0, v) for lr, v in base.items()] + [pt("v", lr, 0, x) for lr, x in var.items()]
    points += [pt("baseline", 1e-2, 1, 2.52), pt("baseline", 1e-2, 2, 2.48),
               pt("v", 1e-1, 1, 2.41), pt("v", 1e-1, 2, 2.43)]
    report = lr_grid_report(points, TransferRecord.lr_grid(grid, 1, 0.01))
    b, v = report.rows
    assert (b["best_lr"], v["best_lr"]) == (1e-2, 1e-1) and v["best_lr_on_edge"] and not b["best_lr_on_edge"]
    hand = ((2.40 - 2.50) + (2.41 - 2.52) + (2.43 - 2.48)) / 3  # paired by seed at each one's best LR
    assert v["tuned_delta"] == pytest.approx(hand) and v["n"] == 3
    assert v["shared_delta"] == pytest.approx(0.10)  # seed 0 at 1e-2: 2.60 - 2.50
    assert v["verdict_differs"] and any("verdict at the shared LR" in n for n in report.notes)
    # Wortsman: capped at loss_init 5.0, best 2.40 / 2.50
    assert v["lr_sensitivity"] == pytest.approx(((3.1 - 2.4) + (2.6 - 2.4) + 0) / 3)
    assert b["lr_sensitivity"] == pytest.approx(((3.0 - 2.5) + 0 + (5.0 - 2.5)) / 3)


# the baseline is best at 1e-2, the variant v at 1e-1 (3 seeds there; the grid is seed 0)
TUNED = {
    "baseline": {1e-3: {0: 3.0}, 1e-2: {0: 2.50, 1: 2.54, 2: 2.49}, 1e-1: {0: None}},
    "v": {1e-3: {0: 3.1}, 1e-2: {0: 2.60}, 1e-1: {0: 2.40, 1: 2.41, 2: 2.43}},
}
BASE_AT_BEST = [2.50, 2.54, 2.49]
W = {1e-3: {0: 3.05}, 1e-2: {0: 2.51, 1: 2.50, 2: 2.50}, 1e-1: {0: math.inf}}  # best at 1e-2 too
U = {1e-3: {0: 2.45, 1: 2.40, 2: 2.50}, 1e-2: {0: 2.55}, 1e-1: {0: 3.5}}  # best at 1e-3


def test_tuned_comparison_by_hand():
    """At the shared LR 1e-2 v is worse (+0.10); at its own best LR it is better (paired t by
    scipy, p < 0.05): the verdict differs."""
    out = tuned_comparison(TUNED, "baseline", 5.0, shared_lr=1e-2)
    b, v = out["baseline"], out["v"]
    assert list(out) == ["baseline", "v"]
    assert (b.best_lr, b.on_edge, v.best_lr, v.on_edge) == (1e-2, False, 1e-1, True)
    assert b.tuned_delta is None and b.shared_delta is None and not b.verdict_differs
    hand = ((2.40 - 2.50) + (2.41 - 2.54) + (2.43 - 2.49)) / 3  # paired by seed
    ref = stats.ttest_rel([2.40, 2.41, 2.43], BASE_AT_BEST)
    assert v.tuned_delta.test_delta == pytest.approx(hand) and v.tuned_delta.test == "paired t"
    assert v.tuned_delta.p_value == pytest.approx(ref.pvalue) and v.p_holm == pytest.approx(ref.pvalue)
    assert ref.pvalue < 0.05 and v.verdict == "better"
    # seed 0 only at 1e-2 for v: 2.60 - 2.50 (the baseline's mean there, 2.51, is not paired)
    assert v.shared_delta == pytest.approx(0.10) and v.verdict_differs
    assert (v.n, v.loss) == (3, pytest.approx(2.41333333))
    lo, hi = stats.t.interval(0.95, 2, loc=np.mean([2.40, 2.41, 2.43]), scale=stats.sem([2.40, 2.41, 2.43]))
    assert v.loss_ci == pytest.approx((lo, hi))
    assert v.lr_sensitivity == pytest.approx(((3.1 - 2.4) + (2.6 - 2.4) + 0) / 3)
    assert b.lr_sensitivity == pytest.approx(((3.0 - 2.5) + 0 + (5.0 - 2.5)) / 3)  # diverged: loss_init


def test_tuned_comparison_holm_over_variants():
    """Three variants: Holm by hand over scipy's paired p-values. v is noise after Holm, yet its
    shared delta lies outside its tuned CI: the verdict differs. u's shared delta has the other
    sign but lies inside its (wide) tuned CI, and w's agrees: neither differs."""
    out = tuned_comparison({**TUNED, "w": W, "u": U}, "baseline",
                           {"baseline": 5.0, "v": 5.0, "w": None, "u": 5.0}, shared_lr=0.01)
    v, w, u = out["v"], out["w"], out["u"]
    p = {n: stats.ttest_rel(x, BASE_AT_BEST).pvalue
         for n, x in [("v", [2.40, 2.41, 2.43]), ("w", [2.51, 2.50, 2.50]), ("u", [2.45, 2.40, 2.50])]}
    first, second, third = sorted(p, key=p.get)
    holm = {first: min(1, 3 * p[first])}
    holm[second] = max(holm[first], min(1, 2 * p[second]))
    holm[third] = max(holm[second], p[third])
    assert {n: out[n].p_holm for n in p} == pytest.approx(holm)
    # seeds needed for the Holm verdict over three variants: at 0.05 / 3
    from ablate.analysis.stats import seeds_needed

    for n in p:
        t = out[n].tuned_delta
        assert t.seeds_needed_alpha == pytest.approx(0.05 / 3)
        assert t.seeds_needed == seeds_needed(t.effect, 0.05 / 3)
    assert v.verdict == "noise" and v.verdict_differs
    assert (w.best_lr, w.on_edge) == (1e-2, False)
    assert w.shared_delta == pytest.approx((0.01 - 0.04 + 0.01) / 3) == pytest.approx(w.tuned_delta.test_delta)
    assert w.verdict == "noise" and not w.verdict_differs and w.lr_sensitivity is None
    assert (u.best_lr, u.on_edge) == (1e-3, True)
    assert u.tuned_delta.test_delta == pytest.approx((-0.05 - 0.14 + 0.01) / 3)
    assert u.shared_delta == pytest.approx(0.05) and u.tuned_delta.ci_high > 0.05
    assert u.verdict == "noise" and not u.verdict_differs
    # a shared LR outside the grid, or none: no shared delta, so nothing to differ
    for shared in (3e-2, None):
        none = tuned_comparison(TUNED, "baseline", 5.0, shared_lr=shared)
        assert none["v"].shared_delta is None and not none["v"].verdict_differs
    with pytest.raises(ValueError, match="baseline 'base'"):
        tuned_comparison(TUNED, "base", 5.0)


def test_the_grid_curve_compares_the_same_seeds_at_every_lr():
    """Extra seeds at one LR (the seeds run at a best LR) stay out of the grid's curve, and a
    seed that diverged makes its LR diverged: 1e-2 stays the best, not 1e-1."""
    runs = {1e-3: {0: 3.0, 1: None}, 1e-2: {0: 2.50, 1: 2.56, 2: 2.90}, 1e-1: {0: 2.55, 1: 2.60}}
    assert grid_curve(runs) == {1e-3: None, 1e-2: pytest.approx(2.53), 1e-1: pytest.approx(2.575)}
    assert grid_curve({1e-3: {0: 3.0}, 1e-2: {1: 2.5, 2: 2.7}}) == {1e-3: 3.0, 1e-2: pytest.approx(2.6)}
    out = tuned_comparison({"baseline": runs, "x": runs}, "baseline", 5.0)
    assert out["x"].best_lr == 1e-2 and out["x"].n == 3 and out["x"].tuned_delta.test_delta == 0


# ---- the multiplier's intervals are its Δ's -------------------------------------------------------
def _ladder_points(variant, losses):
    """Points of one variant: losses[rung][seed] on the rungs COMPUTE[:3]."""
    return [Point(variant, seed, 0.01, f"r{i}", loss, None, c, None, "")
            for i, (c, by_seed) in enumerate(zip(COMPUTE[:3], losses)) for seed, loss in enumerate(by_seed)]


LADDER = ladder_record([(f"r{i}", 16 * (i + 1), i + 1) for i in range(3)])


def _null_draw(rng, seeds):
    """A variant that is the baseline: the same curve plus seed noise (part shared by a seed's
    two runs, part each run's own)."""
    shared = 0.01 * rng.standard_normal((3, seeds))
    return [[[TRUE.loss(c) + shared[i, s] + 0.005 * rng.standard_normal() for s in range(seeds)]
             for i, c in enumerate(COMPUTE[:3])] for _ in range(2)]


@pytest.mark.parametrize("seeds", [2, 3])
def test_a_null_variants_multiplier_interval_holds_one_whenever_its_delta_interval_holds_zero(seeds):
    """No real difference, many draws: at every rung the multiplier's interval holds 1 exactly when
    the Δ's interval beside it (scipy's paired t) holds 0, so the multiplier is never surer than
    its Δ; and the projection's interval, a t over the seeds' own fits, holds 1 about 95% of the
    time (a percentile bootstrap over two seeds held it two times in three)."""
    rng = np.random.default_rng(seeds)
    for _ in range(25):
        base, var = _null_draw(rng, seeds)
        report = ladder_report(_ladder_points("baseline", base) + _ladder_points("v", var), LADDER)
        # a baseline whose seed noise outgrows its rungs' gaps has a curve that turns back: its
        # multiplier interval may then hold 1 where the Δ's excludes 0, never the reverse
        falls = bool(np.all(np.diff(np.mean(base, axis=1)) < 0))
        for i, rung in enumerate(report.rows[1]["rungs"]):
            ref = stats.ttest_rel(var[i], base[i]).confidence_interval(0.95)
            assert rung["delta_ci"] == pytest.approx([ref.low, ref.high], rel=1e-9)
            assert rung["beyond_noise"] == (not ref.low <= 0 <= ref.high)
            lo, hi = rung["compute_multiplier_ci"]
            assert lo <= 1 <= hi if ref.low <= 0 <= ref.high else (not lo <= 1 <= hi) or not falls
            assert lo <= rung["compute_multiplier"] <= hi
    held = []
    for _ in range(80):
        base, var = _null_draw(rng, seeds)
        m = multiplier_ci({"base": base, "v": var}, COMPUTE[:3], "base", "v")
        assert m.seeds == seeds and (m.ci[0] <= 1 <= m.ci[1]) == (m.delta_at_target_ci[0] <= 0 <= m.delta_at_target_ci[1])
        held.append(m.ci[0] <= 1 <= m.ci[1])
    assert np.mean(held) >= 0.85


def test_a_delta_of_zero_is_a_multiplier_of_exactly_one_at_every_rung():
    """Through the baseline's curve corrected to pass through its measured rungs, even where the
    fit misses them (a kinked baseline): the baseline's own loss at a rung needs that rung's compute."""
    from ablate.analysis.transfer_stats import rung_multiplier, target_multiplier

    computes = [1e9, 1e10, 1e11, 1e12]
    base = [3.0, 2.40, 2.25, 1.95]
    fit = fit_power_laws({"base": (computes, base)})["base"]
    assert any(abs(fit.loss(c) - b) > 1e-3 for c, b in zip(computes, base))
    for i in range(4):
        assert rung_multiplier(computes, base, fit, i, 0.0) == 1.0
        assert rung_multiplier(computes, base, fit, i, -0.01) > 1 > rung_multiplier(computes, base, fit, i, 0.01)
    assert target_multiplier(fit, 1e13, 0.0) == 1.0
    # a variant equal to the baseline seed by seed: 1 and [1, 1] on every rung, and projected
    same = [[x, x + 0.01, x - 0.02] for x in base[:3]]
    report = ladder_report(_ladder_points("baseline", same) + _ladder_points("v", same), LADDER)
    row = report.rows[1]
    assert [r["compute_multiplier"] for r in row["rungs"]] == [1.0, 1.0, 1.0]
    assert [r["compute_multiplier_ci"] for r in row["rungs"]] == [[1.0, 1.0]] * 3
    assert row["compute_multiplier"] == 1.0 and row["compute_multiplier_ci"] == [1.0, 1.0]


def test_wins_every_rung_says_on_how_many_the_win_is_beyond_noise():
    """Three seeds: a clear win at r0 (every seed 0.05 lower), small noisy wins at r1 and r2. The
    cell says yes, beyond noise on 1 of 3 (the rungs whose paired-t interval lies below 0); one
    seed says there is no interval."""
    base = [[TRUE.loss(c) + e for e in (0.01, -0.01, 0.0)] for c in COMPUTE[:3]]
    var = [[b - 0.05 + e for b, e in zip(base[0], (0.001, -0.001, 0.0))],
           [b - 0.004 + e for b, e in zip(base[1], (0.01, -0.012, 0.0))],
           [b - 0.002 + e for b, e in zip(base[2], (-0.008, 0.009, 0.0))]]
    report = ladder_report(_ladder_points("baseline", base) + _ladder_points("v", var), LADDER)
    row = report.rows[1]
    below = [stats.ttest_rel(v, b).confidence_interval(0.95).high < 0 for v, b in zip(var, base)]
    assert below == [True, False, False] and row["wins_every_rung"] and row["wins_beyond_noise"] == 1
    heads, cells = report.table.text_cells()
    assert cells[1][heads.index("wins every rung")] == "yes (beyond noise on 1 of 3)"
    assert cells[0][heads.index("wins every rung")] == "-"
    one = ladder_report([p for p in report.points if p.seed == 2], LADDER)
    assert one.rows[1]["wins_beyond_noise"] is None and one.rows[1]["compute_multiplier_ci"] is None
    assert one.table.text_cells()[1][1][heads.index("wins every rung")] == "yes (no interval: one seed)"


# ---- the LR grid's report and figure ----------------------------------------------------------------
def _grid_points(seeds):
    """Seeds 0..seeds-1 of two variants over the grid 1e-3, 3e-3, 1e-2, 3e-2, 1e-1."""
    grid = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1]
    curve = {"baseline": [3.0, 2.6, 2.5, 2.7, 3.2], "v": [2.9, 2.55, 2.45, 2.5, 2.8]}
    return grid, [Point(v, s, lr, None, loss + 0.01 * s, 5.0, None, 10.0 * (1 + i), f"{v}/{lr}/{s}")
                  for v, losses in curve.items() for i, (lr, loss) in enumerate(zip(grid, losses))
                  for s in range(seeds)]


def test_one_seed_says_why_the_tuned_delta_is_missing_beside_the_shared_one():
    """One seed: the tuned Δ is a seed test at each variant's own best LR, which needs two seeds
    a side, so it is '-'; the Δ at the shared LR is one seed's difference, shown. A note says so."""
    from ablate.analysis.transfer_report import lr_grid_report

    grid, points = _grid_points(1)
    report = lr_grid_report(points, TransferRecord.lr_grid(grid, 1, 1e-2))
    v = report.rows[1]
    assert v["tuned_delta"] is None and v["shared_delta"] == pytest.approx(-0.05)
    note = [n for n in report.notes if n.startswith("tuned Δ -")]
    assert note == ["tuned Δ - for v: the tuned test pairs each variant's seeds at its own best LR "
                    "with the baseline's at its own and needs at least 2 seeds a side (here v 1, "
                    "baseline 1); the Δ at LR 0.01 is the paired difference of the seeds there, "
                    "untested: run the grid with --seeds 2 or more"]
    grid, points = _grid_points(2)
    two = lr_grid_report(points, TransferRecord.lr_grid(grid, 1, 1e-2))
    assert two.rows[1]["tuned_delta"] is not None and not any(n.startswith("tuned Δ -") for n in two.notes)


def test_the_lr_axis_reads_in_decimals():
    """The LR axes (loss and attention logit) label their ticks 0.001, 0.01, ... as the grid is
    printed, not 10^-3; the ladder's compute axis keeps its powers of ten."""
    from ablate.analysis.transfer_report import lr_grid_report
    from ablate.tracking.transfer_plots import transfer_figure

    grid, points = _grid_points(1)
    fig = transfer_figure(lr_grid_report(points, TransferRecord.lr_grid(grid, 1, 1e-2)))
    fig.canvas.draw()
    assert len(fig.axes) == 2  # the loss and, with diagnostics, the attention logit
    for ax in fig.axes:
        lo, hi = ax.get_xlim()
        labels = {t.get_text(): t.get_position()[0] for t in ax.get_xticklabels() + ax.get_xticklabels(minor=True)
                  if t.get_text() and lo <= t.get_position()[0] <= hi}
        assert {"0.001", "0.01", "0.1"} <= set(labels), labels
        for text, x in labels.items():
            assert re.fullmatch(r"\d*\.?\d+", text) and float(text) == pytest.approx(x, rel=1e-9), labels
    import matplotlib.pyplot as plt

    plt.close(fig)
