"""What a terminal shows, and what a file or a pipe gets instead: tables at the terminal's width
or at their natural one, lines broken at field boundaries (never inside a word or a number)."""

from __future__ import annotations

import io
import re
import sys
from typing import Optional


def human_bytes(n: float) -> str:
    """1234567 -> '1.18 MiB' (binary units, as memory is counted)."""
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


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


_FIELD = re.compile(r"\S(?:\S| (?! ))*")  # a field: words one space apart (fields are 2+ apart)


def hang_line(line: str, width: int) -> list[str]:
    """`line` as terminal lines of at most `width` columns, broken at spaces only: the
    continuation lines start under the field (words two or more spaces from the next) that
    crosses the edge, so a table's last column wraps within itself; under the line's own
    indent plus two where that field is the line's first or starts too far right. A word too
    long for a line is kept whole (the terminal folds it)."""
    import textwrap

    if len(line) <= width:
        return [line]
    lead = len(line) - len(line.lstrip(" "))
    field = max((m.start() for m in _FIELD.finditer(line) if m.start() < width), default=lead)
    indent = field if field > lead and width - field >= 24 else lead + 2
    return textwrap.TextWrapper(width, initial_indent=" " * lead, subsequent_indent=" " * indent,
                                break_long_words=False, break_on_hyphens=False,
                                replace_whitespace=False).wrap(line.lstrip(" "))


def print_lines(lines: list[str], err: bool = False) -> None:
    """Plain lines on stdout (stderr with `err`): on a terminal broken at spaces to its width
    (hang_line), whole in a file or a pipe."""
    import shutil

    stream = sys.stderr if err else sys.stdout
    if stream.isatty():
        width = shutil.get_terminal_size().columns
        lines = [part for line in lines for part in hang_line(line, width)]
    stream.write("".join(line + "\n" for line in lines))
    stream.flush()


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
