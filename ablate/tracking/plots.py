"""Curves for `ablate compare --plot FILE.png`: one panel per metrics.jsonl key, x-axis tokens,
per variant a mean line over its completed seeds with a min-max band; runs that diverged or
failed are drawn as thin dotted lines ending in an x, so they are visible, not averaged in.

Panels are data (`Panel`), so more keys (the `diag/...` diagnostics) are one entry away:
`plot_comparison(cmp, path, keys=["train_loss", "grad_norm", "diag/max_logit"])`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from ablate.errors import AblateError


@dataclass(frozen=True)
class Panel:
    key: str  # metrics.jsonl key drawn as curves
    title: str
    points: Optional[str] = None  # a sparser key drawn as markers on the same axes (eval rows)
    log_y: bool = False
    # Fit the y-range to the curves after this fraction of the tokens: the first steps' drop
    # would otherwise squeeze the end of training, where variants differ, into a few pixels.
    tail: float = 0.0


PANELS = {
    "train_loss": Panel("train_loss", "loss (line: train, markers: val)", points="val_loss", tail=0.2),
    "val_loss": Panel("val_loss", "validation loss", tail=0.2),
    "grad_norm": Panel("grad_norm", "grad norm (before clipping)", log_y=True),
    "lr": Panel("lr", "learning rate"),
    "tokens_per_s": Panel("tokens_per_s", "tokens/s"),
}
DEFAULT_KEYS = ("train_loss", "grad_norm")


def panel_for(key: str) -> Panel:
    return PANELS.get(key) or Panel(key, key)


def _short(label: str, limit: int = 40) -> str:
    return label if len(label) <= limit else label[:limit - 1] + "~"


def _series(run, key: str) -> dict[int, tuple[float, float]]:
    """step -> (tokens, value) for the rows that carry `key` with a finite number."""
    out = {}
    for row in run.rows:
        v = row.get(key)
        try:
            v = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(v) and "step" in row:
            out[int(row["step"])] = (float(row.get("tokens", row["step"])), v)
    return out


def _band(runs, key: str):
    """x (mean tokens), mean, min, max over runs at each step any of them logged."""
    series = [_series(r, key) for r in runs]
    steps = sorted(set().union(*series)) if series else []
    xs, mean, lo, hi = [], [], [], []
    for s in steps:
        pts = [ser[s] for ser in series if s in ser]
        vals = [v for _, v in pts]
        xs.append(sum(t for t, _ in pts) / len(pts))
        mean.append(sum(vals) / len(vals))
        lo.append(min(vals))
        hi.append(max(vals))
    return xs, mean, lo, hi


def _fit_tail(ax, curves: list[tuple[list, list]], tail: float) -> bool:
    """Set the y-range to what the curves reach after `tail` of the largest x; True if set."""
    x_end = max((max(xs) for xs, _ in curves if xs), default=None)
    if not x_end:
        return False
    ys = [y for xs, vals in curves for x, y in zip(xs, vals) if x >= tail * x_end]
    if not ys or max(ys) <= min(ys):
        return False
    margin = 0.05 * (max(ys) - min(ys))
    ax.set_ylim(min(ys) - margin, max(ys) + margin)
    return True


def plot_comparison(cmp, path: Path, keys: Sequence[str] = DEFAULT_KEYS) -> Path:
    """Write the figure for a `compare_dirs` result; returns the path."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed (and none on a cluster node)
    import matplotlib.pyplot as plt

    path = Path(path)
    panels = [panel_for(k) for k in dict.fromkeys(keys)]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.0 * len(panels), 4.5), squeeze=False,
                             layout="constrained")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn = 0
    for ax, panel in zip(axes[0], panels):
        curves = []  # (xs, ys) of everything drawn: the y-range of a tail panel fits them
        for i, (group, row) in enumerate(zip(cmp.groups, cmp)):
            color = colors[i % len(colors)]
            ok = [r for r in group.runs if r.status == "completed"]
            xs, mean, lo, hi = _band(ok, panel.key)
            label = _short(row["variant"]) + (f" (n={len(ok)})" if ok else "")
            if xs:
                ax.plot(xs, mean, color=color, lw=1.6, label=label)
                if len(ok) > 1:
                    ax.fill_between(xs, lo, hi, color=color, alpha=0.2, lw=0)
                curves += [(xs, lo), (xs, hi)]
                drawn += 1
            if panel.points:
                px, pm, plo, phi = _band(ok, panel.points)
                if px:
                    yerr = [[m - l for m, l in zip(pm, plo)], [h - m for m, h in zip(pm, phi)]]
                    ax.errorbar(px, pm, yerr=yerr, fmt="o", ms=4, color=color, capsize=2,
                                label=None if xs else label)
                    curves += [(px, plo), (px, phi)]
                    drawn += 1
            for r in group.runs:  # not averaged in, but not hidden either
                if r.status == "completed":
                    continue
                ser = _series(r, panel.key)
                if ser:
                    pts = [ser[s] for s in sorted(ser)]
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], ls=":", lw=1, color=color,
                            label=f"{_short(row['variant'])} seed {r.seed[0]}: {r.status}")
                    ax.plot(pts[-1][0], pts[-1][1], "x", color=color, ms=7)
                    drawn += 1
        zoomed = panel.tail > 0 and _fit_tail(ax, curves, panel.tail)
        ax.set_title(panel.title + (f"\ny fitted to the last {1 - panel.tail:.0%} of tokens" if zoomed else ""))
        ax.set_xlabel("tokens")
        ax.set_ylabel("loss" if panel.points == "val_loss" else panel.key)
        if panel.log_y:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if not drawn:
        plt.close(fig)
        raise AblateError(f"nothing to plot: no run logged {', '.join(p.key for p in panels)}")
    fig.suptitle(f"ablate compare ({len(cmp)} variants; band = min-max over seeds)")
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise AblateError(f"cannot write the plot {path}: {e.strerror or e}") from None
    finally:
        plt.close(fig)
    return path


def check_plot_path(path: Path) -> None:
    """Refuse an unwritable place or an unknown image type before any work is done."""
    path = Path(path)
    if not path.parent.is_dir():
        raise AblateError(f"--plot {path}: the folder {path.parent} does not exist")
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in ("png", "pdf", "svg", "jpg", "jpeg"):
        raise AblateError(f"--plot {path}: use a .png, .pdf or .svg file name")
