"""The loss at other context lengths for `ablate compare --plot FILE.png`: FILE_lengths.png, one
panel per evaluation protocol, each variant's mean loss over seeds against the evaluation length
(log x axis, a tick at each length) with its 95% CI as error bars, the training length marked by a dashed
line. A length where a variant has no loss (n/a: a learned table past its rows) is left out of
its line and said in its legend entry (Press et al. 2022, Fig. 1, draws the same picture)."""

from __future__ import annotations

from pathlib import Path


def lengths_path(plot: Path) -> Path:
    """FILE_lengths.png beside the comparison's FILE.png."""
    plot = Path(plot)
    return plot.with_name(f"{plot.stem}_lengths{plot.suffix}")


def plot_lengths(lengths, plot: Path) -> Path:
    """Write the figure of a length_eval.LengthEval beside `plot`; returns its path."""
    from ablate.tracking.plots import save_figure

    return save_figure(lengths_figure(lengths), lengths_path(plot))


def lengths_figure(lengths):
    """The figure (a matplotlib Figure, for a file or a test to read)."""
    import matplotlib

    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    n = len(lengths.protocols)
    fig, axes = plt.subplots(1, n, figsize=(6.5 * n, 4.6), squeeze=False, layout="constrained")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, protocol in zip(axes[0], lengths.protocols):
        _draw(ax, protocol, colors)
    fig.suptitle("ablate compare: loss vs evaluation length (mean over seeds, bars: 95% CI)")
    return fig


def _draw(ax, protocol, colors) -> None:
    from matplotlib.ticker import NullLocator

    from ablate.evaluation.length_record import EvalStatus
    from ablate.tracking.plots import legend_label

    for i, row in enumerate(protocol.rows):
        ok = [c for c in row.cells if c.mean is not None]
        na = [c.key.length for c in row.cells if c.status == EvalStatus.NOT_AVAILABLE]
        label = legend_label(row.variant) + (f" (n/a at {', '.join(map(str, na))})" if na else "")
        if not ok:
            continue
        xs, ys = [c.key.length for c in ok], [c.mean for c in ok]
        err = [[c.mean - c.ci[0] if c.ci else 0.0 for c in ok], [c.ci[1] - c.mean if c.ci else 0.0 for c in ok]]
        ax.errorbar(xs, ys, yerr=err, fmt="o-", ms=4, capsize=3, color=colors[i % len(colors)], label=label)
    for t in protocol.train_lengths:
        ax.axvline(t, color="0.4", ls="--", lw=1, label=f"training length {t}")
    ax.set_xscale("log")
    ticks = sorted({k.length for k in protocol.keys} | set(protocol.train_lengths))
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("evaluation length (tokens of context)")
    ax.set_ylabel("val loss")
    ax.set_title(protocol.name)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
