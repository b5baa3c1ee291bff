"""Issue 23, part 3: the statistics of --lr-grid and --ladder against independent references:
LR sensitivity against hand-computed tables (Wortsman et al. 2023's definition), the L(C) fit
against scipy.optimize.curve_fit on synthetic data with known parameters, the compute
multiplier on curves whose answer is known."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import curve_fit

from ablate.analysis.transfer import (PowerLaw, best_lr, compute_multiplier, fit_power_laws,
                                      log_grid, lr_sensitivity, multiplier_ci, parse_lr_grid,
                                      rank_agreement, wins_every_rung)
from ablate.errors import ConfigError

GRID = [1e-4, 1e-3, 1e-2, 1e-1]


@pytest.mark.parametrize("losses, init, expected", [
    # best 2.0; capped: 3, 2, 2.5, 4 -> (1 + 0 + 0.5 + 2) / 4
    ([3.0, 2.0, 2.5, 4.0], 5.0, 0.875),
    # a diverged point (None, inf) counts as the loss at init: (1 + 0 + 3 + 3) / 4
    ([3.0, 2.0, None, math.inf], 5.0, 1.75),
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
    assert parse_lr_grid("1e-3:1e-1:5") == [1e-3, 3.16e-3, 1e-2, 3.16e-2, 1e-1]
    for text, message in [("1e-3:1e-1:2", "at least 3"), ("0:1e-1:5", "positive"),
                          ("-1:1:4", "positive"), ("1e-1:1e-3:4", "above"), ("1e-3,1e-1", "LO:HI:N"),
                          ("a:b:c", "LO:HI:N")]:
        with pytest.raises(ConfigError, match=message):
            parse_lr_grid(text)


TRUE = PowerLaw(1.5, 50.0, 0.3)
COMPUTE = [1e9, 1e10, 1e11, 1e12, 1e13]


def _law(c, l_inf, a, alpha):
    return l_inf + a * c ** -alpha


def _reference(c, y):
    """scipy's curve_fit in log-compute (the usual way to fit a saturating power law)."""
    p, _ = curve_fit(lambda x, li, a, al: _law(10 ** x, li, a, al), np.log10(c), y,
                     p0=(1.0, 10.0, 0.2), maxfev=20000)
    return p


@pytest.mark.parametrize("noise", [0.0, 0.002])
def test_fit_recovers_known_parameters_as_curve_fit_does(noise):
    rng = np.random.default_rng(0)
    y = np.array([TRUE.loss(c) for c in COMPUTE]) + noise * rng.standard_normal(len(COMPUTE))
    fit = fit_power_laws({"x": (COMPUTE, list(y))})["x"]
    ref = _reference(np.array(COMPUTE), y)
    tol = 1e-4 if noise == 0 else 0.05
    assert fit.l_inf == pytest.approx(TRUE.l_inf, rel=tol, abs=tol)
    assert fit.alpha == pytest.approx(TRUE.alpha, rel=20 * tol)
    # the same curve as curve_fit's, where it was measured
    assert [fit.loss(c) for c in COMPUTE] == pytest.approx([_law(c, *ref) for c in COMPUTE], abs=2 * noise + 1e-6)


def test_two_curves_share_one_l_inf():
    other = PowerLaw(1.5, 80.0, 0.25)
    curves = {"a": (COMPUTE, [TRUE.loss(c) for c in COMPUTE]), "b": (COMPUTE, [other.loss(c) for c in COMPUTE])}
    fits = fit_power_laws(curves)
    assert fits["a"].l_inf == fits["b"].l_inf == pytest.approx(1.5, rel=1e-3)
    assert (fits["a"].alpha, fits["b"].alpha) == (pytest.approx(0.3, rel=1e-2), pytest.approx(0.25, rel=1e-2))
    fixed = fit_power_laws(curves, l_inf=1.5)
    assert fixed["b"].a == pytest.approx(80.0, rel=1e-6)


def test_fewer_than_three_rungs_refuse_to_fit():
    with pytest.raises(ValueError, match="fewer than 3 rungs"):
        fit_power_laws({"x": (COMPUTE[:2], [3.0, 2.5])})


def test_a_variant_on_the_baselines_curve_at_twice_the_compute_has_multiplier_two():
    rungs = COMPUTE[:3]
    base = [TRUE.loss(c) for c in rungs]
    twice = [TRUE.loss(2 * c) for c in rungs]
    fits = fit_power_laws({"base": (rungs, base), "v": (rungs, twice)})
    assert [compute_multiplier(fits["base"], v, c) for v, c in zip(twice, rungs)] == pytest.approx([2, 2, 2], rel=1e-3)
    assert compute_multiplier(TRUE, TRUE.l_inf - 0.1, 1e9) is None  # below L_inf: never reached
    rng = np.random.default_rng(1)
    seeds = lambda losses, k: [[x + 0.003 * rng.standard_normal() for _ in range(k)] for x in losses]
    few = multiplier_ci({"base": seeds(base, 3), "v": seeds(twice, 3)}, rungs, "base", "v", n_boot=300)
    many = multiplier_ci({"base": seeds(base, 12), "v": seeds(twice, 12)}, rungs, "base", "v", n_boot=300)
    for m in (few, many):
        assert m.ci[0] <= 2 <= m.ci[1]
        assert all(lo <= 2 <= hi for lo, hi in m.per_rung_ci)
    assert many.ci[1] - many.ci[0] < few.ci[1] - few.ci[0]  # more seeds, a narrower interval


def test_rank_agreement_and_wins_by_hand():
    small = {"a": 1.0, "b": 2.0, "c": 3.0}
    assert rank_agreement(small, {"a": 1.0, "b": 2.0, "c": 3.0}) == 1.0
    assert rank_agreement(small, {"a": 3.0, "b": 2.0, "c": 1.0}) == 0.0
    assert rank_agreement(small, {"a": 2.0, "b": 1.0, "c": 3.0}) == pytest.approx(2 / 3)  # a<b flips
    assert rank_agreement({"a": 1.0}, {"a": 1.0}) is None
    assert wins_every_rung([3.0, 2.0, 1.5], [2.9, 1.9, 1.4]) and not wins_every_rung([3.0, 2.0], [2.9, 2.1])


def test_a_variant_below_the_measured_baseline_at_a_rung_has_a_multiplier_above_one():
    """The fit need not pass through the baseline's rungs; the multiplier there must agree with
    the measured delta (the defect a pure-fit multiplier had: Δ < 0 and x < 1 on one rung)."""
    from ablate.analysis.transfer import baseline_compute

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
    report = lr_grid_report(points, {"kind": "lr_grid", "grid": grid, "shared_lr": 0.01})
    b, v = report.rows
    assert (b["best_lr"], v["best_lr"]) == (1e-2, 1e-1) and v["best_lr_on_edge"] and not b["best_lr_on_edge"]
    hand = ((2.40 - 2.50) + (2.41 - 2.52) + (2.43 - 2.48)) / 3  # paired by seed at each one's best LR
    assert v["tuned_delta"] == pytest.approx(hand) and v["n"] == 3
    assert v["shared_delta"] == pytest.approx(0.10)  # seed 0 at 1e-2: 2.60 - 2.50
    assert v["verdict_differs"] and any("verdict at the shared LR" in n for n in report.notes)
    # Wortsman: capped at loss_init 5.0, best 2.40 / 2.50
    assert v["lr_sensitivity"] == pytest.approx(((3.1 - 2.4) + (2.6 - 2.4) + 0) / 3)
    assert b["lr_sensitivity"] == pytest.approx(((3.0 - 2.5) + 0 + (5.0 - 2.5)) / 3)
