"""Plots of the diagnostics rows runs log (ablate/train/diagnostics.py) for `ablate compare --plot`:
gradient norms and residual RMS by block, max attention logit, dead FFN units, update-to-weight
ratios and loss spikes over steps. matplotlib is imported when a figure is drawn."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Optional

from ablate.train.diagnostics import PREFIX
from ablate.names import GRAD_NORM, Status

def diag_rows(rows: list[dict]) -> list[dict]:
    return [r for r in rows if any(k.startswith(PREFIX) for k in r)]


def _by_layer(row: dict, key: str) -> tuple[list[int], list[float]]:
    pts = []
    for k, v in row.items():
        if k.startswith(f"{PREFIX}{key}/block") and "." not in k[len(PREFIX + key) + 6:]:
            try:
                pts.append((int(k[len(PREFIX + key) + 6:]), float(v)))
            except ValueError:
                continue
    pts.sort()
    return [p[0] for p in pts], [p[1] for p in pts]


def _over_steps(rows: list[dict], key_prefix: str, reduce: Callable) -> tuple[list, list]:
    xs, ys = [], []
    for r in rows:
        vals = [float(v) for k, v in r.items() if k.startswith(PREFIX + key_prefix)
                and isinstance(v, (int, float))]
        if vals:
            xs.append(r["step"])
            ys.append(reduce(vals))
    return xs, ys


def plot_diagnostics(runs: dict[str, list[dict]], path) -> Optional[str]:
    """One figure of diagnostics for several runs ({label: metrics.jsonl rows}); returns the
    path written, or None when no run has diagnostics rows."""
    runs = {label: diag_rows(rows) for label, rows in runs.items()}
    runs = {label: rows for label, rows in runs.items() if rows}
    if not runs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    (a_grad, a_rms, a_logit), (a_dead, a_upd, a_spk) = axes
    for i, (label, rows) in enumerate(runs.items()):
        color = f"C{i % 10}"
        first, last = rows[0], rows[-1]
        xs, ys = _by_layer(first, GRAD_NORM)
        a_grad.plot(xs, ys, "--o", color=color, ms=3, label=f"{label} (step {first['step']})")
        if last is not first:
            xs, ys = _by_layer(last, GRAD_NORM)
            a_grad.plot(xs, ys, "-o", color=color, ms=3, label=f"{label} (step {last['step']})")
        xs, ys = _by_layer(last, "resid_rms")
        a_rms.plot(xs, ys, "-o", color=color, ms=3, label=label)
        a_logit.plot(*_over_steps(rows, "max_attn_logit/", max), color=color, label=label)
        xs, ys = _over_steps(rows, "dead_ffn_frac/", lambda v: sum(v) / len(v))
        if xs:
            a_dead.plot(xs, ys, color=color, label=label)
        xs, ys = _over_steps(rows, "update_ratio/", lambda v: math.exp(sum(map(math.log, v)) / len(v))
                             if all(u > 0 for u in v) else float("nan"))
        a_upd.plot(xs, ys, color=color, label=label)
        a_spk.step(*_over_steps(rows, "loss_spikes", max), where="post", color=color, label=label)
    for ax, title, xl, log in (
            (a_grad, "grad norm by block (dashed: first, solid: last row)", "block", True),
            (a_rms, "residual-stream RMS after each block (last row)", "block", True),
            (a_logit, "max attention logit (max over blocks)", "step", False),
            (a_dead, "dead FFN units (mean over blocks; ReLU family)", "step", False),
            (a_upd, "update / weight ratio (geo. mean over groups)", "step", True),
            (a_spk, "loss spikes (cumulative)", "step", False)):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xl)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if not ax.lines:
            ax.text(0.5, 0.5, "not logged by these runs", ha="center", va="center",
                    transform=ax.transAxes, color="0.5")
        if log and ax.lines:
            ax.set_yscale("log")
        if ax.lines:
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def plot_comparison_diagnostics(cmp, plot_path) -> Optional[str]:
    """For `ablate compare --plot FILE.png`: FILE_diag.png with the diagnostics of one run per
    variant (its first completed seed), when any run logged them; else None."""
    runs = {}
    for group, row in zip(cmp.groups, cmp):
        ordered = sorted(group.runs, key=lambda r: (r.status != Status.COMPLETED, str(r.seed)))
        for r in ordered:
            if diag_rows(r.rows):
                runs[f"{row.variant} (seed {r.seed[0]})"] = r.rows
                break
    path = Path(plot_path)
    return plot_diagnostics(runs, path.with_name(f"{path.stem}_diag{path.suffix}")) if runs else None
