"""`ablate coord-check --plot FILE`: the `mup` package's coordinate-check panels
(mup/coord_check.py, plot_coord_data): one panel per step, the swept width (or depth) on a log-2
axis, a line per module (its mean |x| averaged over layers, the residual stream's the last
block's; the mean over seeds, the band the seeds' smallest to largest), log y. A flat line is what muP promises; a line rising to the right
is an activation that grows with width."""

from __future__ import annotations

from pathlib import Path

COLUMNS = 5  # panels per row


def plot_coord_check(check, path: Path) -> Path:
    """Write the figure of an ablate.measure.coord_check.CoordCheck to `path`; returns it."""
    from ablate.tracking.plots import save_figure

    return save_figure(coord_figure(check), Path(path))


def coord_figure(check):
    """The figure (a matplotlib Figure, for a file or a test to read)."""
    import matplotlib

    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    steps = check.request.steps
    cols = min(COLUMNS, steps)
    rows = -(-steps // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.3 * rows + 0.6), squeeze=False,
                             sharey=True, layout="constrained")
    for step in range(1, steps + 1):
        ax = axes[(step - 1) // cols][(step - 1) % cols]
        _panel(ax, check, step, first_column=(step - 1) % cols == 0)
    for k in range(steps, rows * cols):
        axes[k // cols][k % cols].set_visible(False)
    s, r = check.setting, check.request
    base = f", base {r.sweep.value} {s.base}" if s.base is not None else ""
    fig.suptitle(f"ablate coord-check: param={s.param}{base}, lr={s.lr:g} constant, {r.seeds} seed(s), "
                 f"batch {s.batch_size} x {s.seq_len}")
    return fig


def _panel(ax, check, step: int, first_column: bool) -> None:
    from ablate.measure.coord_check import Module

    sizes = list(check.request.sizes)
    for m in Module:
        per_size = [[t.mean(m, step) for t in check.traces if t.size == size] for size in sizes]
        mean = [sum(v) / len(v) for v in per_size]
        line, = ax.plot(sizes, mean, "o-", ms=3, label=m.label)
        ax.fill_between(sizes, [min(v) for v in per_size], [max(v) for v in per_size],
                        color=line.get_color(), alpha=0.2, lw=0)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xticks(sizes, [str(x) for x in sizes])
    ax.minorticks_off()
    ax.set_title(f"t={step}")
    ax.set_xlabel(check.request.sweep.value)
    if first_column:
        ax.set_ylabel("mean |x|")
    ax.grid(alpha=0.3)
    if step == 1:
        ax.legend(fontsize=7)
