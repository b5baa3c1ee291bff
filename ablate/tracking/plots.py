"""Curves for `ablate compare --plot FILE.png`: one panel per metrics.jsonl key, x-axis tokens,
per variant a mean line over its completed seeds with a min-max band; runs that diverged or
failed are drawn as thin dotted lines ending in an x, so they are visible, not averaged in.
One more panel shows each variant's difference from the baseline (its mean curve minus the
baseline's, on the first key), where a gain of 1% is visible that the loss panel squeezes into
a pixel. Panels are laid out in a grid (at most GRID_COLUMNS wide), log-y ticks as plain decimals.

Panels are data (`Panel`), so more keys (the `diag/...` diagnostics) are one entry away:
`plot_comparison(cmp, path, keys=["train_loss", "grad_norm", "diag/max_logit"])`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from ablate.errors import AblateError
from ablate.names import GRAD_NORM, TOKENS, TRAIN_LOSS, VAL_LOSS, Status, metric


@dataclass(frozen=True)
class Panel:
    key: str  # metrics.jsonl key drawn as curves
    title: str
    points: Optional[str] = None  # a sparser key drawn as markers on the same axes (eval rows)
    log_y: bool = False
    # Fit the y-range to the curves after this fraction of the tokens: the first steps' drop
    # would otherwise squeeze the end of training, where variants differ, into a few pixels.
    tail: float = 0.0


# What a panel adds to a metric's title and scale (ablate.names.metric: the METRICS row, or a loss
# term's or statistic's by its rule): the train loss carries
# the validation points, and the losses fit their y-range to the end of training.
PANEL_EXTRAS = {
    TRAIN_LOSS: {"title": "loss (line: train, markers: val)", "points": VAL_LOSS, "tail": 0.2},
    VAL_LOSS: {"tail": 0.2},
}
DEFAULT_KEYS = (TRAIN_LOSS, GRAD_NORM)


def panel_for(key: str) -> Panel:
    row = metric(key)
    base = {"title": row.title, "log_y": row.log_scale} if row else {"title": key}
    return Panel(key, **{**base, **PANEL_EXTRAS.get(key, {})})


GRID_COLUMNS = 3


def legend_label(label: str, width: int = 38) -> str:
    """A long variant name on several lines, never cut (it is the only way to tell the lines apart)."""
    parts, line = [], ""
    for piece in label.split(","):
        piece = piece if not line else "," + piece
        if line and len(line) + len(piece) > width:
            parts.append(line + ",")
            piece = piece[1:]
            line = ""
        line += piece
    return "\n".join(parts + [line])


def _tokens(v: float, _=None) -> str:
    """400k, 1.2M: token counts a reader can take in at a glance."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.4g}{unit}"
    return f"{v:.4g}"


def plain_ticks(ax, axis: str = "y") -> None:
    """Log-scale ticks as plain decimals (2.4, not 2.4x10^0). Under a decade of range only
    minor ticks fall inside, so those are labelled too (at 1-9 x 10^k), fewer on wider ranges."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    a = ax.yaxis if axis == "y" else ax.xaxis
    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    decades = math.log10(hi / lo) if lo > 0 and hi > lo else 10.0
    fmt = FuncFormatter(lambda v, _: f"{v:.4g}")
    a.set_major_locator(LogLocator(base=10))
    a.set_major_formatter(fmt)
    if decades < 1.5:
        a.set_minor_locator(LogLocator(base=10, subs=(1, 2, 3, 4, 5, 6, 7, 8, 9) if decades > 0.3 else
                                       [i / 10 for i in range(10, 100)]))
        a.set_minor_formatter(fmt)
    elif decades < 4:
        a.set_minor_locator(LogLocator(base=10, subs=(2, 5)))
        a.set_minor_formatter(fmt)
    else:
        a.set_minor_formatter(NullFormatter())


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
            out[int(row["step"])] = (float(row.get(TOKENS, row["step"])), v)
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


def _delta_series(group, base, key: str):
    """x, mean difference, min and max of the per-seed differences from the baseline, at the
    steps both logged; per-seed differences over the seeds both completed (paired), else only
    the difference of the mean curves (min = max = mean)."""
    ok = [r for r in group.runs if r.status == Status.COMPLETED]
    base_ok = [r for r in base.runs if r.status == Status.COMPLETED]
    gx, gm, _, _ = _band(ok, key)
    bx, bm, _, _ = _band(base_ok, key)
    steps_g = sorted(set().union(*[_series(r, key) for r in ok])) if ok else []
    steps_b = sorted(set().union(*[_series(r, key) for r in base_ok])) if base_ok else []
    mine, theirs = dict(zip(steps_g, zip(gx, gm))), dict(zip(steps_b, bm))
    pairs = [(r, b) for r in ok for b in base_ok if b.seed == r.seed]
    xs, mean, lo, hi = [], [], [], []
    for s in sorted(set(mine) & set(theirs)):
        d = [_series(r, key).get(s) for r, _ in pairs]
        e = [_series(b, key).get(s) for _, b in pairs]
        per_seed = [x[1] - y[1] for x, y in zip(d, e) if x is not None and y is not None]
        xs.append(mine[s][0])
        mean.append(mine[s][1] - theirs[s])
        lo.append(min(per_seed) if len(per_seed) > 1 else mean[-1])
        hi.append(max(per_seed) if len(per_seed) > 1 else mean[-1])
    return xs, mean, lo, hi


def _smooth(values: list[float], window: int) -> list[float]:
    """A centred running mean: per-step training losses are noisy; the trend is what matters."""
    if window <= 1:
        return values
    half = window // 2
    out = []
    for i in range(len(values)):
        part = values[max(0, i - half):i + half + 1]
        out.append(sum(part) / len(part))
    return out


def _draw_delta(ax, cmp, key: str, colors) -> int:
    """Each variant's mean curve minus its baseline's (band: min-max of the per-seed paired
    differences); returns the number of curves drawn. Crossed axes: each cell's baseline is A's
    baseline at its level of B (Group.ref)."""
    bases = [g for g, r in zip(cmp.groups, cmp) if r.baseline]
    if not bases:
        ax.text(0.5, 0.5, "no baseline (pick one with --baseline)", ha="center", va="center",
                transform=ax.transAxes, color="0.5")
        ax.set_title(f"Δ {key} vs baseline")
        return 0
    drawn, window, curves = 0, 1, []
    for i, (group, row) in enumerate(zip(cmp.groups, cmp)):
        if group.ref is None:
            continue
        xs, mean, lo, hi = _delta_series(group, group.ref, key)
        if not xs:
            continue
        window = max(1, len(xs) // 20)  # ~5% of the curve
        color = colors[i % len(colors)]
        mean, lo, hi = _smooth(mean, window), _smooth(lo, window), _smooth(hi, window)
        ax.plot(xs, mean, color=color, lw=1.6, label=legend_label(row.variant))
        if any(a != b for a, b in zip(lo, hi)):
            ax.fill_between(xs, lo, hi, color=color, alpha=0.15, lw=0)
        curves += [(xs, lo), (xs, hi), (xs, mean)]
        drawn += 1
    ax.axhline(0.0, color="0.3", lw=1, ls="--", label=f"baseline: {legend_label(base_label(cmp))}")
    zoomed = False
    if curves:  # the start of training differs most and says least: fit y to the second half (and 0)
        x_end = max(max(xs) for xs, _ in curves)
        zoomed = _fit_tail(ax, curves + [([0.5 * x_end, x_end], [0.0, 0.0])], 0.5)
    how = [f"running mean over {window} points"] if window > 1 else []
    how += ["band: min-max over paired seeds"] if drawn else []
    how += ["y fitted to the last 50% of tokens"] if zoomed else []
    ax.set_title(f"Δ {key} vs baseline (below 0: lower than the baseline)"
                 + ("\n" + "; ".join(how) if how else ""))
    ax.set_xlabel(TOKENS)
    ax.set_ylabel(f"Δ {key}")
    ax.grid(alpha=0.3)
    return drawn


def base_label(cmp) -> str:
    return getattr(cmp, "baseline", None) or "-"


def plot_comparison(cmp, path: Path, keys: Sequence[str] = DEFAULT_KEYS) -> Path:
    """Write the figure for a `compare_dirs` result; returns the path. One panel per key plus
    the Δ-vs-baseline panel of the first key, in a grid at most GRID_COLUMNS wide."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed (and none on a cluster node)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    path = Path(path)
    panels = [panel_for(k) for k in dict.fromkeys(keys)]
    n = len(panels) + 1  # + the difference from the baseline
    ncols = min(n, GRID_COLUMNS if n > 4 else 2)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.0 * ncols, 4.6 * nrows), squeeze=False,
                             layout="constrained")
    flat = list(axes.flat)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    if not sum(_draw_panel(ax, panel, cmp, colors) for ax, panel in zip(flat, panels)):
        plt.close(fig)
        raise AblateError(f"nothing to plot: no run logged {', '.join(p.key for p in panels)}")
    delta_ax = flat[len(panels)]
    _draw_delta(delta_ax, cmp, panels[0].key, colors)
    if delta_ax.get_legend_handles_labels()[0]:
        delta_ax.legend(fontsize=8)
    for ax in flat[:n]:
        ax.xaxis.set_major_formatter(FuncFormatter(_tokens))
    for ax in flat[n:]:
        ax.set_visible(False)
    fig.suptitle(f"ablate compare ({len(cmp)} variants; band = min-max over seeds)")
    return save_figure(fig, path)


def save_figure(fig, path: Path) -> Path:
    """Write and close a figure; a place that cannot be written is one line (AblateError)."""
    import matplotlib.pyplot as plt

    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise AblateError(f"cannot write the plot {path}: {e.strerror or e}") from None
    finally:
        plt.close(fig)
    return path


def _draw_panel(ax, panel: Panel, cmp, colors) -> int:
    """One key's panel: each variant's mean and band (and its eval points), each failed or
    diverged run dotted to where it stopped. Returns how many things it drew."""
    curves, drawn = [], 0  # (xs, ys) of everything drawn: the y-range of a tail panel fits them
    for i, (group, row) in enumerate(zip(cmp.groups, cmp)):
        color = colors[i % len(colors)]
        ok = [r for r in group.runs if r.status == Status.COMPLETED]
        xs, mean, lo, hi = _band(ok, panel.key)
        label = legend_label(row.variant) + (f" (n={len(ok)})" if ok else "")
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
        drawn += _draw_stopped(ax, panel.key, group, row.variant, color)
    zoomed = panel.tail > 0 and _fit_tail(ax, curves, panel.tail)
    ax.set_title(panel.title + (f"\ny fitted to the last {1 - panel.tail:.0%} of tokens" if zoomed else ""))
    ax.set_xlabel(TOKENS)
    ax.set_ylabel("loss" if panel.points == VAL_LOSS else panel.key)
    if panel.log_y and ax.lines:
        ax.set_yscale("log")
        plain_ticks(ax)
    if not ax.lines:
        ax.text(0.5, 0.5, f"no run logged {panel.key}", ha="center", va="center",
                transform=ax.transAxes, color="0.5")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    return drawn


def _draw_stopped(ax, key: str, group, variant: str, color) -> int:
    """The runs that did not complete: not averaged in, but not hidden either."""
    drawn = 0
    for r in group.runs:
        ser = _series(r, key) if r.status != Status.COMPLETED else None
        if ser:
            pts = [ser[s] for s in sorted(ser)]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ls=":", lw=1, color=color,
                    label=f"{legend_label(variant)} seed {r.seed[0]}: {r.status}")
            ax.plot(pts[-1][0], pts[-1][1], "x", color=color, ms=7)
            drawn += 1
    return drawn


def check_plot_path(path: Path) -> None:
    """Refuse an unwritable place or an unknown image type before any work is done."""
    path = Path(path)
    if not path.parent.is_dir():
        raise AblateError(f"--plot {path}: the folder {path.parent} does not exist")
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in ("png", "pdf", "svg", "jpg", "jpeg"):
        raise AblateError(f"--plot {path}: use a .png, .pdf or .svg file name")


# ---- two crossed axes ---------------------------------------------------------------------------
def interaction_path(plot: Path) -> Path:
    """FILE_interaction.png beside the comparison's FILE.png."""
    plot = Path(plot)
    return plot.with_name(f"{plot.stem}_interaction{plot.suffix}")


def plot_interaction(inter, plot: Path) -> Path:
    """Write the figure of an interaction.Interaction beside `plot`; returns its path."""
    return save_figure(interaction_figure(inter), interaction_path(plot))


def interaction_figure(inter):
    """The Δ of each of A's other levels (vs its baseline at the same level of B) across the levels
    of B, with its CI as error bars; a level where the Δ differs from the one at B's first level
    beyond seed noise (Holm) is marked and its difference written beside it. A matplotlib Figure,
    for a file or a test to read."""
    import matplotlib

    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    a, b = inter.crossing.a, inter.crossing.b
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(b.levels) + 3.0), 4.4), layout="constrained")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    others = a.levels[1:]
    width = 0.25 / max(1, len(others) - 1) if len(others) > 1 else 0.0
    for i, level in enumerate(others):
        cells = [c for c in inter.cells if c.level_a == level]
        xs = [b.levels.index(c.level_b) + (i - (len(others) - 1) / 2) * width for c in cells]
        drawn = [(x, c) for x, c in zip(xs, cells) if c.delta is not None]
        if not drawn:
            continue
        ys = [c.delta for _, c in drawn]
        err = [[c.delta - c.delta_test.ci_low if c.delta_test.ci_low is not None else 0.0 for _, c in drawn],
               [c.delta_test.ci_high - c.delta if c.delta_test.ci_low is not None else 0.0 for _, c in drawn]]
        color = colors[i % len(colors)]
        ax.errorbar([x for x, _ in drawn], ys, yerr=err, fmt="o-", ms=5, capsize=4, color=color,
                    label=f"{a.name(level)} vs {a.name(a.first)}")
        for x, c in drawn:
            if c.reference or c.difference is None:
                continue
            said = f"Δ−Δ {c.difference:+.4f}" + (f"\nHolm p={c.p_holm:.2g}" if c.p_holm is not None else "")
            ax.annotate(said, (x, c.delta), textcoords="offset points", xytext=(8, 6), fontsize=8,
                        color=color, fontweight="bold" if c.differs else "normal")
            if c.differs:
                ax.plot(x, c.delta, marker="*", ms=14, color=color, ls="none")
    ax.axhline(0.0, color="0.3", lw=1, ls="--")
    ax.set_xticks(range(len(b.levels)), [b.name(x) for x in b.levels])
    ax.set_xlim(-0.5, len(b.levels) - 0.1)  # room for the last level's note
    ax.set_xlabel(f"{b.key} (the reference level first)")
    ax.set_ylabel(f"Δ {inter.metric}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Δ {inter.metric} of {a.key} at each level of {b.key}\nbars: {100 * (1 - inter.alpha):g}% CI, "
                 f"paired over seeds\n★: differs from the Δ at {b.name(b.first)} (Holm p<{inter.alpha:g})",
                 fontsize=10)
    return fig
