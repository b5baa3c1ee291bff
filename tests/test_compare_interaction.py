"""`ablate compare` of two crossed axes: the Δ of A at each level of B paired over seeds, the
interaction (per seed (a, b) - (a0, b) - (a, b0) + (a0, b0)) with its CI and Holm p, checked
against scipy's one-sample t-test and a least-squares fit with seed fixed effects over many
grids; the stratified comparison (one baseline per level of B), the `interaction` key of
--json, --cross over any key (a setting that follows a crossed axis is no mixing), an --lr-grid
sweep's cells each at its own best LR, the figure, and the one-line refusals."""

from __future__ import annotations

import csv
import io
import json
import math

import numpy as np
import pytest
from scipy import stats

from ablate.analysis import CompareError
from ablate.analysis.crossing import Factor
from ablate.analysis.interaction import interaction_cells
from ablate.analysis.report import CompareOptions, ReportKind, build_report
from compare_fixtures import (LR_BEST, X_BASE, X_CELLS, X_DELTA, X_HOLDS, X_INTERACTION, cli, set_config, write_grid,
                              write_ladder_sweep, write_lr_grid_crossed, write_run)

INTERACTION_KEYS = {"a", "b", "baseline", "reference", "delta", "delta_ci", "difference", "difference_ci", "p",
                    "p_holm", "n_seeds", "differs", "delta_p_holm"}


# ---- the statistics against an independent computation -------------------------------------------
def holm_by_definition(ps: list) -> list:
    """Holm's adjusted p: the largest (m - j + 1) p_(j) over the j-th smallest p-values up to this one."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    m = len(ps)
    out = [0.0] * m
    for rank, i in enumerate(order):
        out[i] = min(1.0, max((m - j) * ps[order[j]] for j in range(rank + 1)))
    return out


def least_squares_cells(values: dict, a: Factor, b: Factor, seeds: list) -> dict:
    """Cell effects of y = seed effect + cell mean (a0, b0 absorbed), fitted by numpy lstsq on
    the given seeds: {(a, b): effect relative to (a0, b0)}."""
    cells = [(x, y) for x in a.levels for y in b.levels]
    free = cells[1:]
    rows, ys = [], []
    for s in seeds:
        for cell in cells:
            rows.append([1.0 * (s == t) for t in seeds] + [1.0 * (cell == c) for c in free])
            ys.append(values[cell][s])
    beta = np.linalg.lstsq(np.array(rows), np.array(ys), rcond=None)[0]
    return {cells[0]: 0.0, **{c: beta[len(seeds) + i] for i, c in enumerate(free)}}


def random_grid(rng, n_a: int, n_b: int, n_seeds: int) -> tuple[dict, Factor, Factor]:
    a = Factor("a", tuple(f"a{i}" for i in range(n_a)))
    b = Factor("b", tuple(f"b{i}" for i in range(n_b)))
    seed_effect = rng.normal(3.0, 0.05, n_seeds)
    noise = rng.uniform(0.0005, 0.02)
    values = {}
    for x in a.levels:
        for y in b.levels:
            true = rng.normal(0, 0.03) * (rng.random() < 0.6)  # some cells interact, some do not
            values[x, y] = {s: float(seed_effect[s] + true + rng.normal(0, noise)) for s in range(n_seeds)}
    return values, a, b


def test_the_interaction_is_the_least_squares_one_with_scipys_interval_and_p_over_many_grids():
    rng = np.random.default_rng(48)
    ps = []
    for case in range(40):
        n_a, n_b, n_seeds = 2 + case % 2, 2 + case % 3, 2 + case % 6
        values, a, b = random_grid(rng, n_a, n_b, n_seeds)
        cells = interaction_cells(values, a, b)
        seeds = list(range(n_seeds))
        fit = least_squares_cells(values, a, b, seeds)
        a0, b0 = a.first, b.first
        assert [(c.level_a, c.level_b) for c in cells] == [(x, y) for x in a.levels[1:] for y in b.levels]
        for c in cells:
            x, y = c.level_a, c.level_b
            assert c.delta == pytest.approx(fit[x, y] - fit[a0, y], abs=1e-9)
            diffs = [values[x, y][s] - values[a0, y][s] for s in seeds]
            r = stats.ttest_1samp(diffs, 0.0)
            assert [c.delta_test.ci_low, c.delta_test.ci_high] == pytest.approx(
                list(r.confidence_interval(0.95)), abs=1e-9)
            if c.reference:
                assert c.difference is None and c.p_holm is None
                continue
            contrast = [values[x, y][s] - values[a0, y][s] - values[x, b0][s] + values[a0, b0][s] for s in seeds]
            assert c.difference == pytest.approx(fit[x, y] - fit[a0, y] - fit[x, b0] + fit[a0, b0], abs=1e-9)
            r = stats.ttest_1samp(contrast, 0.0)
            assert c.difference_test.p_value == pytest.approx(r.pvalue, rel=1e-6)
            assert c.difference_test.t == pytest.approx(r.statistic, rel=1e-6)
            assert [c.difference_test.ci_low, c.difference_test.ci_high] == pytest.approx(
                list(r.confidence_interval(0.95)), abs=1e-9)
            assert c.n_seeds == n_seeds
        family = [c for c in cells if not c.reference]
        expected = holm_by_definition([c.difference_test.p_value for c in family])
        assert [c.p_holm for c in family] == pytest.approx(expected, rel=1e-9)
        assert [c.differs for c in family] == [p < 0.05 for p in expected]
        assert [c.delta_p_holm for c in cells] == pytest.approx(
            holm_by_definition([c.delta_test.p_value for c in cells]), rel=1e-9)
        ps += [c.difference_test.p_value for c in family]
    assert min(ps) < 1e-3 and max(ps) > 0.3  # the cases span clear interactions and none


def test_a_seed_missing_from_one_cell_leaves_the_contrasts_that_need_it():
    rng = np.random.default_rng(7)
    values, a, b = random_grid(rng, 2, 3, 5)
    del values["a1", "b2"][4]  # diverged
    cells = {(c.level_a, c.level_b): c for c in interaction_cells(values, a, b)}
    fit = least_squares_cells(values, a, b, [0, 1, 2, 3])  # the seeds every cell has
    assert cells["a1", "b2"].n_seeds == 4 and cells["a1", "b1"].n_seeds == 5
    assert cells["a1", "b2"].difference == pytest.approx(fit["a1", "b2"] - fit["a0", "b2"] - fit["a1", "b0"]
                                                         + fit["a0", "b0"], abs=1e-9)
    one = {k: {s: v for s, v in d.items() if s < 1} for k, d in values.items()}
    lonely = interaction_cells(one, a, b)
    assert all(c.difference_test.ci_low is None and c.p_holm is None and c.differs is None
               for c in lonely if not c.reference)


# ---- compare on a grid sweep ------------------------------------------------------------------------
def test_a_grid_sweep_is_compared_within_each_level_with_its_interaction(tmp_path):
    report = build_report([write_grid(tmp_path)], CompareOptions())
    cmp, inter = report.comparison, report.interaction
    assert [(r.variant, r.baseline) for r in cmp] == [
        ("qk_norm=off,norm=layernorm", True), ("qk_norm=off,norm=rmsnorm", True),
        ("qk_norm=on,norm=layernorm", False), ("qk_norm=on,norm=rmsnorm", False)]
    rows = {r.variant: r for r in cmp}
    mean = {cell: sum(X_BASE[s] + d[s] for s in X_BASE) / 3 for cell, d in X_CELLS.items()}
    # each cell against qk_norm=off at its own norm, not against one baseline
    assert rows["qk_norm=on,norm=rmsnorm"].vs.delta == pytest.approx(mean["on", "rmsnorm"] - mean["off", "rmsnorm"])
    assert report.table.head[0].startswith("baseline: qk_norm=off at each level of norm (")
    by = {(c.level_a, c.level_b): c for c in inter.cells}
    assert by["on", "layernorm"].delta == pytest.approx(X_DELTA["layernorm"], abs=1e-6)
    assert by["on", "rmsnorm"].delta == pytest.approx(X_DELTA["rmsnorm"], abs=1e-6)
    assert by["on", "rmsnorm"].difference == pytest.approx(X_INTERACTION, abs=1e-6) and by["on", "rmsnorm"].differs
    assert [" ".join(line.split()) for line in inter.table.head] == [
        f"verdict: qk_norm=on: its Δ differs under norm=rmsnorm (+0.0297 {_ci(by['on', 'rmsnorm'].difference_test)}, "
        f"Holm p={by['on', 'rmsnorm'].p_holm:.3g}) from its Δ at norm=layernorm"]
    assert report.tables == [report.table, inter.table]
    # --baseline names the baseline cell: its qk_norm the baseline level, its norm the reference
    flipped = build_report([tmp_path / "grid2"], CompareOptions(baseline="qk_norm=on,norm=rmsnorm")).interaction
    assert [(c.level_a, c.level_b) for c in flipped.cells] == [("off", "rmsnorm"), ("off", "layernorm")]
    assert flipped.cells[0].delta == pytest.approx(-X_DELTA["rmsnorm"], abs=1e-6)
    assert flipped.cells[1].difference == pytest.approx(X_INTERACTION, abs=1e-6)  # both levels swapped: same sign
    with pytest.raises(CompareError, match="^--baseline nope: matches no cell of the grid qk_norm × norm; cells: "
                                           "qk_norm=off,norm=layernorm, qk_norm=off,norm=rmsnorm, "):
        build_report([tmp_path / "grid2"], CompareOptions(baseline="nope"))
    seeds = build_report([tmp_path / "grid2"], CompareOptions(per_seed=True)).rows
    on_rms = [r.delta for r in seeds if r.variant == "qk_norm=on,norm=rmsnorm"]
    assert on_rms == pytest.approx([X_CELLS["on", "rmsnorm"][s] - X_CELLS["off", "rmsnorm"][s] for s in X_BASE])


def _ci(test) -> str:
    return f"[{test.ci_low:+.4f}, {test.ci_high:+.4f}]"


def test_a_gain_that_holds_under_every_level_says_so(tmp_path):
    inter = build_report([write_grid(tmp_path, X_HOLDS)], CompareOptions()).interaction
    (line,) = [" ".join(line.split()) for line in inter.table.head]
    assert line.startswith("verdict: qk_norm=on: the gain holds under every level of norm: Δ beyond seed noise "
                           "at each (Holm p<0.05), and no interaction beyond seed noise (Holm p ≥ 0.05;")
    assert [c.differs for c in inter.cells] == [None, False]


def test_json_csv_and_markdown_carry_the_interaction(tmp_path):
    sweep = write_grid(tmp_path)
    res = cli("compare", str(sweep), "--json")
    assert res.exit_code == 0, res.output
    rows = {r["variant"]: r for r in json.loads(res.stdout)}
    assert rows["qk_norm=off,norm=rmsnorm"]["interaction"] is None and rows["qk_norm=off,norm=rmsnorm"]["baseline"]
    ln, rms = rows["qk_norm=on,norm=layernorm"]["interaction"], rows["qk_norm=on,norm=rmsnorm"]["interaction"]
    assert set(ln) == set(rms) == INTERACTION_KEYS
    assert ln["reference"] is None and ln["difference"] is None and ln["p"] is None and ln["n_seeds"] == 3
    assert rms["a"] == "qk_norm=on" and rms["b"] == "norm=rmsnorm" and rms["baseline"] == "qk_norm=off,norm=rmsnorm"
    assert rms["reference"] == "norm=layernorm" and rms["difference"] == pytest.approx(X_INTERACTION, abs=1e-6)
    assert rms["delta"] == pytest.approx(X_DELTA["rmsnorm"], abs=1e-6) and len(rms["difference_ci"]) == 2
    assert rms["p_holm"] == rms["p"] < 0.05 and rms["differs"] is True
    assert "interaction" not in json.loads(cli("compare", str(sweep), "--where", "norm=layernorm", "--json").stdout)[0]
    res = cli("compare", str(sweep), "--format", "csv")
    head, *lines = list(csv.reader(io.StringIO(res.stdout)))
    at = {name: i for i, name in enumerate(head)}
    assert float(lines[3][at["interaction_difference"]]) == pytest.approx(X_INTERACTION, abs=1e-6)
    assert lines[0][at["interaction_p_holm"]] == "" and "verdict: qk_norm=on" in res.stderr
    md = cli("compare", str(sweep), "--format", "markdown").stdout
    assert "| qk_norm | norm | seeds | Δ vs qk_norm=off | 95% CI of Δ | Δ − Δ at norm=layernorm |" in md
    assert "| on | rmsnorm | 3 | -0.0107 |" in md and "| yes |" in md


# ---- --cross over any key; what may differ -----------------------------------------------------------
def write_optimizer_runs(root, steps=None):
    """qk_norm x train.beta2 (a stand-in for an optimizer axis) as runs made apart, each level of
    beta2 with its own learning rate (as optim=muon brings its own), three seeds each: not a grid
    sweep. Δ of qk_norm=on: -0.04 at beta2 0.95, -0.01 at 0.99."""
    for qk in ("off", "on"):
        for beta2, lr in ((0.95, 3e-3), (0.99, 2e-2)):
            for s, base in X_BASE.items():
                loss = base - (0.04 if beta2 == 0.95 else 0.01) * (qk == "on") + 0.001 * s * (qk == "on")
                d = write_run(root, f"{qk}_{beta2}_s{s}", {"qk_norm": qk}, s, round(loss, 6))
                set_config(d, "train.beta2", beta2)
                set_config(d, "train.lr", lr)
                summary = json.loads((d / "summary.json").read_text())
                summary["overrides"] += [f"train.beta2={beta2}", f"train.lr={lr}"]
                (d / "summary.json").write_text(json.dumps(summary))
    if steps:
        set_config(root / "on_0.99_s2", "train.steps", steps)
    return root


def test_cross_stratifies_any_key_and_a_setting_that_follows_it_is_not_mixing(tmp_path):
    root = write_optimizer_runs(tmp_path / "opt")
    with pytest.raises(CompareError, match="differ in more than axis options and seed.*train.beta2"):
        build_report([root], CompareOptions())  # not crossed: mixed, as before
    report = build_report([root], CompareOptions(cross="qk_norm,train.beta2"))
    assert [(r.variant, r.baseline) for r in report.comparison] == [
        ("qk_norm=off,train.beta2=0.95", True), ("qk_norm=off,train.beta2=0.99", True),
        ("qk_norm=on,train.beta2=0.95", False), ("qk_norm=on,train.beta2=0.99", False)]
    by = {c.level_b: c for c in report.interaction.cells}
    assert by["0.95"].delta == pytest.approx(-0.039) and by["0.99"].delta == pytest.approx(-0.009)
    assert by["0.99"].difference == pytest.approx(0.03) and "(--cross)" in report.interaction.table.title
    # crossed the other way: train.beta2's Δ under each level of qk_norm
    flipped = build_report([root], CompareOptions(cross="train.beta2,qk_norm")).interaction
    assert [(c.level_a, c.level_b) for c in flipped.cells] == [("0.99", "off"), ("0.99", "on")]
    assert flipped.cells[1].difference == pytest.approx(0.03)
    mixed = write_optimizer_runs(tmp_path / "mixed", steps=7)
    with pytest.raises(CompareError, match=r"differ in more than the crossed axes \(qk_norm, train.beta2\) and seed, "
                                           r"so their deltas would mix effects: train.steps \(6 in 11 runs, 7 in 1 run\)"):
        build_report([mixed], CompareOptions(cross="qk_norm,train.beta2"))


def test_a_sweep_of_an_axis_not_crossed_compares_its_levels_as_variants(tmp_path):
    sweep = tmp_path / "ofat"
    for beta2 in (0.95, 0.99):
        for s, base in X_BASE.items():
            d = write_run(sweep, f"{beta2}_s{s}", {}, s, base - 0.01 * (beta2 == 0.99), sweep="ofat",
                          variant="baseline" if beta2 == 0.95 else f"train.beta2={beta2}")
            set_config(d, "train.beta2", beta2)
    report = build_report([sweep], CompareOptions())
    assert report.interaction is None and [r.variant for r in report.comparison] == ["baseline", "train.beta2=0.99"]


def test_a_grid_of_three_axes_asks_which_two_and_crossing_two_holds_the_third(tmp_path):
    learned = write_grid(tmp_path, name="learned", more=(("pos", "learned"),))
    rope = write_grid(tmp_path, name="rope", more=(("pos", "rope"),), cells=X_HOLDS)
    report = build_report([learned, rope], CompareOptions())
    assert report.interaction is None and len(report.comparison) == 8
    assert ("a grid of 3 axes (qk_norm, norm, pos): name the two whose interaction you want with --cross A,B "
            "(e.g. --cross qk_norm,norm), the others held at one level with --where") in report.notes
    with pytest.raises(CompareError, match=r"crossed axes \(qk_norm, norm\).*pos.name \(learned in 12 runs, rope "
                                           r"in 12 runs\); compare like with like \(e.g. --where pos.name=VALUE\)"):
        build_report([learned, rope], CompareOptions(cross="qk_norm,norm"))
    held = build_report([learned, rope], CompareOptions(cross="qk_norm,norm", where=("pos=rope",))).interaction
    assert held.table.head[0].startswith("verdict: qk_norm=on: the gain holds under every level of norm")


# ---- an --lr-grid sweep: each cell at its own best LR -------------------------------------------------
def test_an_lr_grid_of_two_axes_takes_each_cell_at_its_own_best_lr(tmp_path):
    report = build_report([write_lr_grid_crossed(tmp_path)], CompareOptions())
    assert report.kind == ReportKind.LR_GRID
    rows = {r.variant: r for r in report.rows}
    assert {n: r.best_lr for n, r in rows.items()} == {f"qk_norm={qk},norm={n}": LR_BEST[qk] for qk, n in X_CELLS}
    assert [r.baseline for r in report.rows] == [True, True, False, False]
    # the tuned Δ of qk_norm=on under rmsnorm is against qk_norm=off under rmsnorm, each at its best LR
    assert rows["qk_norm=on,norm=rmsnorm"].tuned_delta == pytest.approx(X_DELTA["rmsnorm"], abs=1e-6)
    cell = report.interaction.of("qk_norm=on,norm=rmsnorm")
    assert cell.difference == pytest.approx(X_INTERACTION, abs=1e-6) and cell.n_seeds == 3
    assert report.interaction.table.title.endswith("(paired over seeds, each cell at its own best LR)")
    assert rows["qk_norm=on,norm=rmsnorm"]["interaction"]["difference"] == pytest.approx(X_INTERACTION, abs=1e-6)
    assert rows["qk_norm=off,norm=rmsnorm"]["interaction"] is None
    odd = next((tmp_path / "lr_grid2").glob("*qk_norm=on,norm=rmsnorm_lr0.1_seed2"))
    set_config(odd, "train.steps", 7)  # one run trained longer: its cell would mix effects
    with pytest.raises(CompareError, match=r"crossed axes \(qk_norm, norm\) and seed, .*train.steps \(6 in 19 runs, "
                                           r"7 in 1 run\); compare like with like \(e.g. --where train.steps=VALUE\)$"):
        build_report([tmp_path / "lr_grid2"], CompareOptions())


# ---- the figure -----------------------------------------------------------------------------------------
def test_the_plot_draws_the_delta_of_a_across_the_levels_of_b_with_its_interval(tmp_path):
    from ablate.tracking.plots import interaction_figure

    sweep = write_grid(tmp_path)
    res = cli("compare", str(sweep), "--plot", str(tmp_path / "x.png"))
    assert res.exit_code == 0, res.output
    assert f"plot: {tmp_path / 'x_interaction.png'}" in res.stdout and (tmp_path / "x_interaction.png").stat().st_size
    inter = build_report([sweep], CompareOptions()).interaction
    fig = interaction_figure(inter)
    ax = fig.axes[0]
    (drawn,) = [c for c in ax.containers if c.get_label() == "qk_norm=on vs qk_norm=off"]
    line, _, (bars,) = drawn.lines
    assert list(line.get_ydata()) == pytest.approx([c.delta for c in inter.cells])
    assert [y for seg in bars.get_segments() for y in seg[:, 1]] == pytest.approx(
        [y for c in inter.cells for y in (c.delta_test.ci_low, c.delta_test.ci_high)])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["norm=layernorm", "norm=rmsnorm"]
    assert any(t.get_text().startswith("Δ−Δ +0.0297") for t in ax.texts)


# ---- bad input: one line, exit 2 ------------------------------------------------------------------------
def one_error_line(res) -> str:
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and not res.stdout, res.output
    return lines[0]


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    sweep = write_grid(tmp_path)
    assert one_error_line(cli("compare", str(sweep), "--cross", "qk_norm,pos")) == (
        "error: --cross pos: the runs do not vary pos (every run has pos=learned); they vary qk_norm, norm")
    assert one_error_line(cli("compare", str(sweep), "--cross", "qk_norm")).startswith(
        "error: --cross qk_norm: name two different axes, A,B")
    assert one_error_line(cli("compare", str(write_ladder_sweep(tmp_path)), "--cross", "pos,norm")).startswith(
        "error: --cross: not available for a --ladder sweep")
    gap = write_grid(tmp_path, name="gap", skip={("on", "rmsnorm")})
    assert one_error_line(cli("compare", str(gap))) == (
        "error: the grid qk_norm × norm has no runs at qk_norm=on,norm=rmsnorm; run its sweep again, which trains "
        "only the jobs it lacks: ablate sweep qk_norm=off,on norm=layernorm,rmsnorm model.d_model=32 train.steps=6 "
        f"--mode grid --seeds 3 hydra.sweep.dir={gap}")
    one = write_grid(tmp_path, name="one", base={0: 3.0})
    assert one_error_line(cli("compare", str(one), "--cross", "qk_norm,norm")) == (
        "error: the interaction of qk_norm × norm needs at least 2 seeds shared by the four cells it compares (the "
        "same seed and data seed in each); these runs have 1 at most: run the grid with --seeds 3 or more (ablate "
        "sweep qk_norm=off,on norm=layernorm,rmsnorm model.d_model=32 train.steps=6 --mode grid --seeds 3 "
        f"hydra.sweep.dir={one})")
    # not asked for by --cross, the grid sweep's comparison stands, and says why it has no interaction
    res = cli("compare", str(one), "--json")
    assert res.exit_code == 0 and all("interaction" not in r for r in json.loads(res.stdout))
    said = " ".join(cli("compare", str(one)).stdout.split())
    assert "note: no interaction table: the interaction of qk_norm × norm needs at least 2 seeds" in said
    apart = write_optimizer_runs(tmp_path / "apart")
    for d in apart.glob("on_0.99_s*"):
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
    assert one_error_line(cli("compare", str(apart), "--cross", "qk_norm,train.beta2")) == (
        "error: the grid qk_norm × train.beta2 has no runs at qk_norm=on,train.beta2=0.99; run it: ablate sweep "
        "qk_norm=on train.beta2=0.99 --seeds 3 model.d_model=32 train.lr=0.02 train.steps=6")
