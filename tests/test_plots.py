"""The figures of `ablate compare --plot` (ablate/tracking/plots.py): a grid of panels with each
key's difference from the baseline beside it, diverged runs drawn to where they ended, plain
tick labels on a log axis, and the loss panel fitted to the end of training."""

from __future__ import annotations

import json
import struct

import pytest

from ablate.analysis import compare_dirs
from compare_fixtures import BASE, PAIRED, write_run


def png_size(path) -> tuple[int, int]:
    return struct.unpack(">II", path.read_bytes()[16:24])


def test_plot_grid_delta_panel_and_plain_log_ticks(compare_runs, tmp_path):
    from ablate.tracking.plots import _delta_series, plain_ticks, plot_comparison

    cmp = compare_dirs([compare_runs])
    # the Δ panel's numbers: rmsnorm's curves are the baseline's (same synthetic rows) -> 0
    base, rms = cmp.groups[0], next(g for g, r in zip(cmp.groups, cmp) if r["variant"] == "norm=rmsnorm")
    for r in rms.runs:
        rows = [json.loads(line) for line in (r.dir / "metrics.jsonl").read_text().splitlines()]
        for row in rows:
            row["train_loss"] -= 0.01 * (1 + r.seed[0])  # seed s: 0.01 * (s + 1) lower
        r.rows = rows
    xs, mean, lo, hi = _delta_series(rms, base, "train_loss")
    assert xs == [128.0, 256.0, 384.0]
    assert mean == pytest.approx([-0.02] * 3) and lo == pytest.approx([-0.03] * 3) and hi == pytest.approx([-0.01] * 3)

    one = plot_comparison(cmp, tmp_path / "one.png", keys=["train_loss"])
    four = plot_comparison(cmp, tmp_path / "four.png", keys=["train_loss", "grad_norm", "lr", "tokens_per_s"])
    (w1, h1), (w4, h4) = png_size(one), png_size(four)
    assert h1 == pytest.approx(4.6 * 110, abs=2)  # one row
    assert w1 == pytest.approx(2 * 6.0 * 110, abs=2)  # the key + its Δ panel, side by side
    assert w4 == pytest.approx(3 * 6.0 * 110, abs=2) and h4 == pytest.approx(2 * 4.6 * 110, abs=2)  # a grid

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [2.42, 2.5, 2.61])
    ax.set_yscale("log")
    plain_ticks(ax)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels(minor=True) + ax.get_yticklabels()
              if t.get_text() and ax.get_ylim()[0] <= t.get_position()[1] <= ax.get_ylim()[1]]
    assert labels and all(float(t) > 0 for t in labels)  # "2.5", not "2.5×10^0" / "$\\mathdefault{...}$"
    plt.close(fig)


def test_plot_draws_bands_diverged_runs_and_extra_keys(tmp_path):
    runs = tmp_path / "runs"
    for s, v in BASE.items():
        write_run(runs, f"base_s{s}", {}, s, v)
    for s, v in PAIRED.items():
        write_run(runs, f"rms_s{s}", {"norm": "rmsnorm"}, s, v)
    write_run(runs, "rms_s9", {"norm": "rmsnorm"}, 9, None, status="diverged")
    from ablate.errors import AblateError
    from ablate.tracking.plots import plot_comparison

    d = runs / "rms_s9"  # the diverged run has a curve that ends in inf
    rows_ = [{"step": 1, "tokens": 128, "train_loss": 5.0, "grad_norm": 3.0, "diag/max_logit": 9.0},
             {"step": 2, "tokens": 256, "train_loss": "inf", "grad_norm": "nan"}]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows_))
    rows = compare_dirs([runs])
    png = plot_comparison(rows, tmp_path / "c.png")
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 20_000
    three = plot_comparison(rows, tmp_path / "d.png", keys=["train_loss", "grad_norm", "diag/max_logit"])
    assert three.stat().st_size > png.stat().st_size  # a third panel
    with pytest.raises(AblateError, match="nothing to plot: no run logged diag/none"):
        plot_comparison(rows, tmp_path / "e.png", keys=["diag/none"])
    assert not (tmp_path / "e.png").exists()


def test_loss_panel_is_fitted_to_the_end_of_training_where_variants_differ():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ablate.tracking.plots import _fit_tail

    xs = list(range(0, 1001, 100))
    a = [5.5, 3.0, 2.6, 2.5, 2.45, 2.42, 2.40, 2.38, 2.37, 2.36, 2.35]  # a steep start
    b = [v - 0.02 for v in a]
    fig, ax = plt.subplots()
    ax.plot(xs, a)
    ax.plot(xs, b)
    assert _fit_tail(ax, [(xs, a), (xs, b)], tail=0.2)
    lo, hi = ax.get_ylim()
    assert lo < 2.33 and 2.6 < hi < 2.7  # the tail from token 200 on, not the 5.5 at the start
    assert not _fit_tail(ax, [([0, 1], [1.0, 1.0])], tail=0.2)  # flat: matplotlib's own range
    plt.close(fig)
