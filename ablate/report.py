"""Console output of a finished run: one readable table, also written to the run's ablate.log."""

from __future__ import annotations

import io
import logging
import re
import sys
from pathlib import Path
from typing import Optional

from ablate.record import RunRecord, WandbInfo
from ablate.vocab import TRAIN_LOSS, VAL_BPB, VAL_LOSS

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
    t.add_row("axes", " ".join(f"{k}={v}" for k, v in (record.axes or {}).items()))
    info, result = record.info, record.result
    if info.params is not None:
        t.add_row("params", f"{info.params or 0:,} ({info.non_embedding_params or 0:,} non-embedding)")
        t.add_row("FLOPs/token", f"{info.flops_per_token or 0:,}")
    if record.step is not None:
        t.add_row("steps", f"{record.step}/{record.steps} ({result.tokens or 0:,} tokens)")
    for metric in (TRAIN_LOSS, VAL_LOSS, VAL_BPB):
        t.add_row(metric, _fmt(getattr(result, metric)))
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


def _wandb_row(where: Optional[WandbInfo]) -> str:
    """Where the W&B run went: its URL, or the command that uploads its offline folder."""
    if where is None:
        return ""
    if where.mode == "offline" and where.dir:
        return f"offline; upload with: wandb sync {where.dir}"
    return where.url or ""


def table_console():
    """A TTY: its own width (cells fold to fit). Piped or redirected: wide enough that no
    table folds or cuts a cell, whatever COLUMNS says."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=1000, soft_wrap=False)


# ---- lines on a terminal: broken at field boundaries, never inside a word --------------------------
_BREAK = re.compile(r" \| | +")  # a field boundary ("a | b") or a space


def continuation(line: str) -> str:
    """The indent of a wrapped line's continuation: its own indent and two spaces."""
    return " " * (len(line) - len(line.lstrip(" ")) + 2)


def wrap_spans(line: str, width: int) -> list[tuple[int, int]]:
    """(start, end) of each terminal line that `line` breaks into to fit `width` columns (the
    continuation lines indented by continuation()): at the last field boundary (' | ') that fits,
    else at the last space. A word too long for any line (a path) is never cut, nor put on a
    line of its own: it stays where it is and the terminal folds it."""
    lead, indent = len(line) - len(line.lstrip(" ")), len(continuation(line))
    breaks = [(m.start(), m.end(), "|" in m.group()) for m in _BREAK.finditer(line) if m.start() > lead]
    spans, start, room = [], 0, width
    while len(line) - start > room:
        fitting = [b for b in breaks if start < b[0] <= start + room]
        word_start = max((b[1] for b in fitting), default=start)  # the word that crosses the edge
        word_end = next((b[0] for b in breaks if b[0] > start + room), len(line))
        if word_end - word_start > width - indent:  # too long for a line: cut after it
            cut = next((b for b in breaks if b[0] == word_end), None)
        else:
            cut = max((b for b in fitting if b[2]), default=None) or max(fitting)
        if cut is None:
            break
        spans.append((start, cut[0]))
        start, room = cut[1], width - indent
    return spans + [(start, len(line))]


def wrap_line(line: str, width: int) -> list[str]:
    """`line` as terminal lines of at most `width` columns (wrap_spans)."""
    pad = continuation(line)
    return [line[a:b] if i == 0 else pad + line[a:b] for i, (a, b) in enumerate(wrap_spans(line, width))]


def print_wrapped(line: str) -> None:
    """Print `line` to a terminal, broken to its width at field boundaries (not mid-number)."""
    import shutil

    print("\n".join(wrap_line(line, shutil.get_terminal_size().columns)))


def print_text(console, markup: str) -> None:
    """A line of rich markup: whole off a terminal (a file or pipe gets full lines), broken at
    field boundaries or spaces to the width of a terminal, continuation lines indented."""
    from rich.text import Text

    text = console.render_str(markup)
    if not console.is_terminal:
        console.print(text, soft_wrap=True)
        return
    pad = continuation(text.plain)
    for i, (a, b) in enumerate(wrap_spans(text.plain, console.width)):
        console.print(text[a:b] if i == 0 else Text(pad) + text[a:b], soft_wrap=True)


def render(table, width: int = 1000) -> str:
    """Plain text at the table's natural width (up to `width`): for files and pipes."""
    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, soft_wrap=False).print(table)
    return "".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines())


def print_table(table, text: Optional[str] = None) -> None:
    """A table on stdout: on a terminal at its width (cells fold to fit); off one at its natural
    width with no trailing spaces (`text`: render(table) when already made)."""
    if sys.stdout.isatty():
        from rich.console import Console

        Console().print(table)
    else:
        sys.stdout.write(text if text is not None else render(table))
        sys.stdout.flush()


def print_summary(record: RunRecord, run_dir: Path, console: bool = True) -> None:
    """The table on stdout (unless `console` is off: a sweep job) and in ablate.log. Off a
    terminal it is printed at its natural width: a log file is not 80 columns wide."""
    table = summary_table(record, run_dir)
    text = render(table)
    log.info("\n" + text.rstrip("\n"))
    if console:
        print_table(table, text)
