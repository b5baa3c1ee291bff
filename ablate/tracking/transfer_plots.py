"""Figures of an --lr-grid or --ladder sweep (ablate compare --plot): final loss vs learning
rate per variant on a log axis, diverged points marked (Wortsman et al. 2023, Fig. 1), with the
max attention logit at each LR where diagnostics were on; or loss vs compute on log-log axes
per variant with its fitted L(C) and the projection."""

from __future__ import annotations

from pathlib import Path


def plot_transfer(report, path: Path) -> Path:
    fig = transfer_figure(report)
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def transfer_figure(report):
    """The report's figure (a matplotlib Figure, for a file or a test to read)."""
    import matplotlib

    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    from ablate.analysis.report import ReportKind

    logits = report.kind == ReportKind.LR_GRID and any(p.max_attn_logit is not None for p in report.points)
    fig, axes = plt.subplots(1, 2 if logits else 1, figsize=(12 if logits else 6.5, 4.5), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    draw = _draw_lr if report.kind == ReportKind.LR_GRID else _draw_ladder
    draw(axes[0][0], report, colors)
    if logits:
        _draw_logits(axes[0][1], report, colors)
    fig.tight_layout()
    return fig


def _draw_lr(ax, report, colors) -> None:
    for i, row in enumerate(report.rows):
        c = colors[i % len(colors)]
        lrs = [float(k) for k in row.curve]
        ok = [(lr, v) for lr, v in zip(lrs, row.curve.values()) if v is not None]
        if ok:
            ax.plot(*zip(*ok), "o-", color=c, label=f"{row.variant} (sensitivity "
                    f"{row.lr_sensitivity:.3f})" if row.lr_sensitivity is not None else row.variant)
        bad = [lr for lr, v in zip(lrs, row.curve.values()) if v is None]
        if bad and row.loss_init is not None:  # a diverged run counts as no progress
            ax.plot(bad, [row.loss_init] * len(bad), "x", color=c, markersize=9,
                    label=f"{row.variant} diverged")
    _decorate(ax, "learning rate", "final val_loss", "final loss vs learning rate (x: diverged)", x="plain log")


def _draw_logits(ax, report, colors) -> None:
    for i, name in enumerate(dict.fromkeys(p.variant for p in report.points)):
        pts = sorted((p.lr, p.max_attn_logit) for p in report.points
                     if p.variant == name and p.max_attn_logit is not None)
        if pts:
            ax.plot(*zip(*pts), "o-", color=colors[i % len(colors)], label=name)
    _decorate(ax, "learning rate", "max attention logit (over the run)", "attention logit growth", "log",
              x="plain log")


def _draw_ladder(ax, report, colors) -> None:
    import numpy as np

    fits, target, computes = report.ladder.fits, report.ladder.target, report.ladder.computes
    for i, row in enumerate(report.rows):
        c = colors[i % len(colors)]
        pts = [(p.compute, p.loss) for p in report.points
               if p.variant == row.variant and p.compute and p.loss is not None]
        if pts:
            ax.plot(*zip(*pts), "o", color=c, alpha=0.5)
        means = [(x.compute, x.mean) for x in row.rungs if x.compute and x.mean is not None]
        fit = fits.get(row.variant)
        if fit is not None and target:
            xs = np.geomspace(min(computes), target, 50)
            ax.plot(xs, [fit.loss(x) for x in xs], "-", color=c,
                    label=f"{row.variant}: L_inf+{fit.a:.3g}C^-{fit.alpha:.3f}")
            ax.plot([target], [fit.loss(target)], "*", color=c, markersize=12)
        elif means:
            ax.plot(*zip(*means), "-", color=c, label=row.variant)
    _decorate(ax, "compute (FLOPs)", "final val_loss", "loss vs compute per rung; fitted L(C), * projection",
              "plain log")


def _decorate(ax, xlabel: str, ylabel: str, title: str, y: str = "linear", x: str = "log") -> None:
    """x log, or log with plain decimals (learning rates: 0.003, not 3 x 10^-3; compute keeps
    its powers of ten); y linear, log, or log with plain numbers (losses: 1.8, not 1.8 x 10^0)."""
    from ablate.tracking.plots import plain_ticks

    ax.set_xscale("log")
    if x == "plain log":
        plain_ticks(ax, "x")
    if y != "linear":
        ax.set_yscale("log")
    if y == "plain log":
        plain_ticks(ax, "y")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
