"""Console output of a finished run: one readable table, also written to the run's ablate.log."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from ablate.run.collapse import collapse_of
from ablate.run.record import RunRecord, WandbInfo, active_note
from ablate.terminal import print_table, render
from ablate.names import TRAIN_LOSS, VAL_BPB, VAL_LOSS

log = logging.getLogger("ablate")


def _fmt(v, spec=".4f"):
    if v is None:
        return "-"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def summary_table(record: RunRecord, run_dir: Path):
    from rich.markup import escape
    from rich.table import Table

    color = record.status.color
    # The variant is a row, not the title: a title wraps at the table's width.
    t = Table(title=f"ablate run (seed {record.seed})", show_header=False, title_justify="left")
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")  # a long run dir folds on a narrow terminal, never cut with "…"
    # escape: overrides such as data.paths=[a.txt] look like markup tags to rich
    t.add_row("variant", escape(record.variant or ""))
    t.add_row("status", f"[{color}]{record.status}[/{color}]" + escape((f" ({record.reason})" if record.reason else "")
                                                            + (f" ({record.error})" if record.error else "")))
    collapse = collapse_of(record)
    if collapse is not None:  # completed, and it learned only token frequencies (ablate/run/collapse.py)
        t.add_row("note", f"[yellow]collapsed[/yellow]: {escape(collapse.reason())}")
    t.add_row("axes", " ".join(f"{k}={v}" for k, v in (record.axes or {}).items()))
    info, result = record.info, record.result
    if info.params is not None:
        t.add_row("params", f"{info.params or 0:,} ({info.non_embedding_params or 0:,} non-embedding"
                  + active_note(info) + ")")
        t.add_row("FLOPs/token", f"{info.flops_per_token or 0:,}")
    if record.step is not None:
        t.add_row("steps", f"{record.step}/{record.steps} ({result.tokens or 0:,} tokens)")
    evaluated = last_eval_step(run_dir) if record.step is not None else None
    for metric in (TRAIN_LOSS, VAL_LOSS, VAL_BPB):
        value = getattr(result, metric)
        # a run stopped between evaluations: its validation figures are older than its last step
        at = f" (at step {evaluated})" if metric != TRAIN_LOSS and value is not None and \
            evaluated is not None and evaluated != record.step else ""
        t.add_row(metric, _fmt(value) + at)
    if result.tokens_per_s:
        t.add_row("tokens/s", f"{result.tokens_per_s:,.0f} on {info.device or '?'} ({info.precision or ''})")
    if result.mfu is not None:
        t.add_row("MFU", f"{100 * result.mfu:.1f}%")
    if result.time_to_first_step_s is not None:
        t.add_row("first step after", f"{result.time_to_first_step_s:.2f} s")
    t.add_row("wall time", f"{record.wall_time_s or 0:.1f} s")
    t.add_row("run dir", escape(str(run_dir)))
    wandb = _wandb_row(info.wandb)
    if wandb:  # said at the start too, but that has scrolled away
        t.add_row("W&B", escape(wandb))
    return t


def last_eval_step(run_dir: Path) -> Optional[int]:
    """The step of the run's last evaluation in metrics.jsonl (None: none, or no file)."""
    import json

    from ablate.run.directory import METRICS

    try:
        lines = (Path(run_dir) / METRICS).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if f'"{VAL_LOSS}"' in line:
            try:
                return int(json.loads(line)["step"])
            except (ValueError, KeyError, TypeError):
                continue
    return None


def _wandb_row(where: Optional[WandbInfo]) -> str:
    """Where the W&B run went: its URL, or the command that uploads its offline folder."""
    if where is None:
        return ""
    if where.mode == "offline" and where.dir:
        return f"offline; upload with: wandb sync {where.dir}"
    return where.url or ""


def print_summary(record: RunRecord, run_dir: Path, console: bool = True) -> None:
    """The table on stdout (unless `console` is off: a sweep job) and in ablate.log. Off a
    terminal it is printed at its natural width: a log file is not 80 columns wide."""
    table = summary_table(record, run_dir)
    text = render(table)
    log.info("\n" + text.rstrip("\n"))
    if console:
        print_table(table, text)
