"""Console output of a finished run: one readable table, also written to the run's ablate.log."""

from __future__ import annotations

import io
import logging
import sys
from pathlib import Path

log = logging.getLogger("ablate")


def _fmt(v, spec=".4f"):
    if v is None:
        return "-"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def summary_table(summary: dict, run_dir: Path):
    from rich.markup import escape
    from rich.table import Table

    status = summary.get("status", "?")
    color = {"completed": "green", "diverged": "yellow", "failed": "red"}.get(status, "magenta")
    # The variant is a row, not the title: a title wraps at the table's width.
    t = Table(title=f"ablate run (seed {summary.get('seed')})", show_header=False, title_justify="left")
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")  # a long run dir folds on a narrow terminal, never cut with "…"
    # escape: overrides such as data.paths=[a.txt] look like markup tags to rich
    t.add_row("variant", escape(str(summary.get("variant", ""))))
    t.add_row("status", f"[{color}]{status}[/{color}]" + escape((f" ({summary['reason']})" if summary.get("reason") else "")
                                                     + (f" ({summary['error']})" if summary.get("error") else "")))
    t.add_row("axes", " ".join(f"{k}={v}" for k, v in summary.get("axes", {}).items()))
    if "params" in summary:
        t.add_row("params", f"{summary['params']:,} ({summary.get('non_embedding_params', 0):,} non-embedding)")
        t.add_row("FLOPs/token", f"{summary.get('flops_per_token', 0):,}")
    if "step" in summary:
        t.add_row("steps", f"{summary['step']}/{summary.get('steps')} ({summary.get('tokens', 0):,} tokens)")
    t.add_row("train_loss", _fmt(summary.get("train_loss")))
    t.add_row("val_loss", _fmt(summary.get("val_loss")))
    t.add_row("val_bpb", _fmt(summary.get("val_bpb")))
    if summary.get("tokens_per_s"):
        t.add_row("tokens/s", f"{summary['tokens_per_s']:,.0f} on {summary.get('device', '?')} ({summary.get('precision', '')})")
    if summary.get("mfu") is not None:
        t.add_row("MFU", f"{100 * summary['mfu']:.1f}%")
    if summary.get("time_to_first_step_s") is not None:
        t.add_row("first step after", f"{summary['time_to_first_step_s']:.2f} s")
    t.add_row("wall time", f"{summary.get('wall_time_s', 0):.1f} s")
    t.add_row("run dir", escape(str(run_dir)))
    return t


def table_console():
    """A TTY: its own width (cells fold to fit). Piped or redirected: wide enough that no
    table folds or cuts a cell, whatever COLUMNS says."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=1000, soft_wrap=False)


def render(table, width: int = 1000) -> str:
    """Plain text at the table's natural width (up to `width`): for files and pipes."""
    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, soft_wrap=False).print(table)
    return "".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines())


def print_summary(summary: dict, run_dir: Path, console: bool = True) -> None:
    """The table on stdout (unless `console` is off: a sweep job) and in ablate.log. Off a
    terminal it is printed at its natural width: a log file is not 80 columns wide."""
    table = summary_table(summary, run_dir)
    text = render(table)
    log.info("\n" + text.rstrip("\n"))
    if not console:
        return
    if sys.stdout.isatty():
        from rich.console import Console

        Console().print(table)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
