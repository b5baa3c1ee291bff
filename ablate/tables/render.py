"""The one renderer of every Table (ablate/tables/table.py): the terminal's rich table,
markdown, LaTeX, csv and JSON. The lines to read first (the baseline, a MIXED warning) go
above the table, its foot (the setting it was measured in) and the notes below it.

The terminal: piped (or on a terminal wide enough) the full table, every column, whatever
COLUMNS says. A terminal too narrow for it gets the compact table: short headers, each cell one
whole phrase a line (a CI on its own line), and the columns of the highest `priority` left out,
the rightmost first, until every line fits (a note names them and how to see them: `hint`;
`wide` keeps them all); when even that does not fit, one block per row with one field a line.
The title is a line of its own, broken between words on a terminal and whole in a pipe.
Nothing is cut or wrapped inside a name or a label, and no line ends in spaces.
"""

from __future__ import annotations

import json
import math
from typing import Any, Sequence

from ablate.errors import AblateError
from ablate.tables.table import Align, Column, Table, Target, column_names

FORMATS = ("table", "csv", "markdown", "latex")


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_clean(x) for x in v]
    return v


def to_json(rows: Sequence[Any]) -> str:
    """The rows' --json objects; non-finite numbers as null."""
    return json.dumps([_clean(r.as_dict()) for r in rows], indent=2)


def to_csv(table: Table) -> str:
    """Machine-readable: raw numbers, one line per row."""
    import csv
    import io

    names, values = table.raw()
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(names)
    for row in values:
        w.writerow(["" if v is None else v for v in row])
    return buf.getvalue()


def to_markdown(table: Table) -> str:
    heads, cells = table.text_cells()
    esc = (lambda c: c.replace("|", "\\|"))
    head = table.head_lines()
    lines = [f"{line}  " for line in head] + ([""] if head else [])
    lines += ["| " + " | ".join(map(esc, heads)) + " |",
              "|" + "|".join("---" if c.align is Align.LEFT else "--:" for c in table.shown(Target.TEXT)) + "|"]
    lines += ["| " + " | ".join(map(esc, row)) + " |" for row in cells]
    lines += [""] + [f"{line}  " for line in table.foot] if table.foot else []
    return "\n".join(lines + ([""] + [f"- note: {n}" for n in table.notes] if table.notes else [])) + "\n"


_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
        "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
        "Δ": r"$\Delta$", "±": r"$\pm$", "σ": r"$\sigma$", "∞": r"$\infty$"}


def _tex(text: str) -> str:
    return "".join(_TEX.get(c, c) for c in text)


def to_latex(table: Table) -> str:
    """A booktabs tabular (\\usepackage{booktabs}); the lines above and the notes as comments."""
    heads, cells = table.text_cells()
    lines = [f"% {line}" for line in table.head_lines()]
    lines += [r"\begin{tabular}{" + "".join("l" if c.align is Align.LEFT else "r" for c in table.shown(Target.TEXT))
              + "}", r"\toprule", " & ".join(map(_tex, heads)) + r" \\", r"\midrule"]
    lines += [" & ".join(map(_tex, row)) + r" \\" for row in cells]
    lines += [r"\bottomrule", r"\end{tabular}"] + [f"% {line}" for line in table.foot]
    lines += [f"% note: {n}" for n in table.notes]
    return "\n".join(lines) + "\n"


def render(table: Table, fmt: str) -> str:
    """csv / markdown / latex as text (the table format prints through rich: print_table)."""
    if fmt not in FORMATS or fmt == "table":
        raise AblateError(f"--format {fmt}: choose one of {', '.join(FORMATS)}")
    return {"csv": to_csv, "markdown": to_markdown, "latex": to_latex}[fmt](table)


# ---- the terminal ---------------------------------------------------------------------------------
def print_table(table: Table, console: Any = None, wide: bool = False, hint: str = "") -> None:
    """The table on a terminal (or piped: full width), the lines to read first above it and the
    foot and notes below, each broken between words to a terminal's width. `hint`: how to see
    the columns a narrow terminal leaves out ("ablate compare --wide shows every column")."""
    from rich.markup import escape

    from ablate.terminal import print_text, table_console

    console = console or table_console()
    for line in table.head_lines():
        print_text(console, f"[bold yellow]{escape(line)}[/bold yellow]" if line == table.warning else escape(line))
    # a line of its own, whole in a pipe: a title wider than its table is not folded to its width
    print_text(console, escape(table.title))
    full = _rich(table, table.shown(Target.TERMINAL), compact=False)
    notes = list(table.notes)
    if _fits(console, full):
        _emit(console, full)
    else:
        hidden = _print_narrow(table, console, wide)
        if hidden:
            notes.insert(0, f"hidden to fit {console.width} columns: {column_names(hidden)}"
                            + (f" ({hint})" if hint else ""))
    for line in table.foot:
        print_text(console, escape(line))
    for note in notes:
        print_text(console, "note: " + escape(note))


def _print_narrow(table: Table, console: Any, wide: bool) -> list[Column]:
    """The compact table with the fewest columns left out (none with `wide`), else one block
    per row; returns the columns left out."""
    columns, hidden = table.shown(Target.TERMINAL), []
    while True:
        compact = _rich(table, columns, compact=True)
        if _fits(console, compact):
            _emit(console, compact)
            return [c for c in table.shown(Target.TERMINAL) if c in hidden]
        droppable = [] if wide else [c for c in columns if c.priority > 0]
        if not droppable:
            _blocks(table, console)
            return []
        drop = max(reversed(droppable), key=lambda c: c.priority)  # the rightmost of the highest
        columns = [c for c in columns if c is not drop]
        hidden.append(drop)


def _rich(table: Table, columns: list[Column], compact: bool) -> Any:
    from rich import box
    from rich.table import Table as RichTable

    cells = [[c.narrow(r) if compact else c.rich(r) for c in columns] for r in table.rows]
    opts: dict = dict(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True,
                      show_lines=any("\n" in x for row in cells for x in row)) if compact else {}
    t = RichTable(**opts)
    for i, c in enumerate(columns):
        if i == 0:  # the row's name: never cut
            t.add_column(c.header(compact), style="bold", no_wrap=True,
                         min_width=None if compact else max([len(c.cell(r)) for r in table.rows] + [7]))
        else:
            t.add_column(c.header(compact), justify=c.align.value, overflow="fold", no_wrap=compact)
    for row in cells:
        t.add_row(*row)
    return t


def _fits(console: Any, renderable: Any) -> bool:
    from rich.measure import Measurement

    return Measurement.get(console, console.options.update(max_width=100_000), renderable).maximum <= console.width


def _emit(console: Any, renderable: Any) -> None:
    """Line by line, without the spaces that pad a line's end (on a terminal and in a file)."""
    from rich.text import Text

    for line in console.render_lines(renderable, pad=False, new_lines=False):
        text = Text.assemble(*[(s.text, s.style) for s in line if not s.control])
        text.rstrip()
        console.print(text, soft_wrap=True)


def _blocks(table: Table, console: Any) -> None:
    """One block per row: its name, then one field a line (empty fields left out), values
    broken between words to the terminal's width, a long word (a path) folded."""
    import textwrap

    from rich.text import Text

    heads, cells = table.text_cells()
    label = max(len(h) for h in heads[1:]) if heads[1:] else 0
    for row in cells:
        console.print(Text(row[0], style="bold"), soft_wrap=True)
        for head, cell in zip(heads[1:], row[1:]):
            if cell in ("", "-"):
                continue
            lead = f"  {head.ljust(label)}  "
            if console.width - len(lead) < 16:  # too narrow beside the label: the value below it
                lead = f"  {head}\n    "
            room = console.width - len(lead.rsplit("\n", 1)[-1])
            pad = "\n" + " " * (console.width - room)
            value = pad.join(textwrap.wrap(cell, room, break_on_hyphens=False)) or cell
            console.print(Text(lead + value), soft_wrap=True)

