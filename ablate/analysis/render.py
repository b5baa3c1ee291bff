"""A comparison in every format, all from the one column list (ablate/analysis/columns.py): the
rich table (or one block per variant on a terminal too narrow for it), markdown, LaTeX, csv and
JSON; the baseline line and the mixed-settings warning above, the notes below."""

from __future__ import annotations

import json
import math
from typing import Any, Sequence

from ablate.analysis.columns import COLUMNS, PER_SEED, PLAIN, RICH, Column, Ctx, shown
from ablate.analysis.compare import Comparison, per_seed_rows
from ablate.analysis.load import CompareError
from ablate.analysis.checks import describe_mixed

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
    """Rows (compare's, or per_seed_rows' dicts) as JSON; non-finite numbers as null."""
    return json.dumps([_clean(r.as_dict() if hasattr(r, "as_dict") else dict(r)) for r in rows], indent=2)


def header_lines(cmp: Comparison) -> list[str]:
    """What to read before the table: the baseline and why; the settings the runs do not share."""
    lines = []
    if cmp.mixed:
        lines.append(f"MIXED (--allow-mixed): the runs also differ in {describe_mixed(cmp.mixed)}; "
                     "a delta here is not the effect of the variant alone")
    if cmp.baseline:
        lines.append(f"baseline: {cmp.baseline} ({cmp.baseline_reason})")
    return lines


def _table(cmp: Comparison, per_seed: bool, fmt: str) -> tuple[list[Column], list, Ctx]:
    """The columns shown in `fmt` and the rows they read."""
    rows = per_seed_rows(cmp) if per_seed else list(cmp)
    return shown(PER_SEED if per_seed else COLUMNS, fmt, cmp.study), rows, Ctx(cmp.metric, cmp.alpha)


def plain_table(cmp: Comparison, per_seed: bool = False) -> tuple[list[str], list[list[str]]]:
    """Headers and cells as plain text (markdown, LaTeX and the blocks are this table)."""
    columns, rows, ctx = _table(cmp, per_seed, PLAIN)
    return [c.head(ctx) for c in columns], [[c.cell(r) for c in columns] for r in rows]


def _csv_value(key: str, v: Any) -> Any:
    if key == "status" and isinstance(v, dict):
        return ";".join(f"{n} {st}" for st, n in v.items())
    return "" if v is None else repr(v) if isinstance(v, float) else v


def to_csv(cmp: Comparison, per_seed: bool = False) -> str:
    """Machine-readable: raw numbers, one line per variant (or per run)."""
    import csv
    import io

    columns, rows, _ = _table(cmp, per_seed, PLAIN)
    # a study's columns after the others: its csv reads as the plain comparison plus the steps
    cols = PER_SEED if per_seed else COLUMNS
    fields = [f for c in cols if not c.study for f in c.fields] + \
             [f for c in cols if c.study and cmp.study for f in c.fields]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    for r in rows:
        d = r if isinstance(r, dict) else r.as_dict()
        w.writerow({k: _csv_value(k, d.get(k)) for k in fields})
    return buf.getvalue()


def to_markdown(cmp: Comparison, per_seed: bool = False) -> str:
    columns, _, ctx = _table(cmp, per_seed, PLAIN)
    heads, cells = plain_table(cmp, per_seed)
    esc = (lambda c: c.replace("|", "\\|"))
    lines = [f"{line}  " for line in header_lines(cmp)] + ([""] if header_lines(cmp) else [])
    lines += ["| " + " | ".join(map(esc, heads)) + " |",
              "|" + "|".join("---" if c.text else "--:" for c in columns) + "|"]
    lines += ["| " + " | ".join(map(esc, row)) + " |" for row in cells]
    return "\n".join(lines + ([""] + [f"- note: {n}" for n in cmp.notes] if cmp.notes else [])) + "\n"


_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
        "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
        "Δ": r"$\Delta$", "±": r"$\pm$", "σ": r"$\sigma$", "∞": r"$\infty$"}


def _tex(text: str) -> str:
    return "".join(_TEX.get(c, c) for c in text)


def to_latex(cmp: Comparison, per_seed: bool = False) -> str:
    """A booktabs tabular (\\usepackage{booktabs}); the baseline line and notes as comments."""
    columns, _, _ = _table(cmp, per_seed, PLAIN)
    heads, cells = plain_table(cmp, per_seed)
    lines = [f"% {line}" for line in header_lines(cmp)]
    lines += [r"\begin{tabular}{" + "".join("l" if c.text else "r" for c in columns) + "}", r"\toprule",
              " & ".join(map(_tex, heads)) + r" \\", r"\midrule"]
    lines += [" & ".join(map(_tex, row)) + r" \\" for row in cells]
    lines += [r"\bottomrule", r"\end{tabular}"] + [f"% note: {n}" for n in cmp.notes]
    return "\n".join(lines) + "\n"


def _rich_table(cmp: Comparison, per_seed: bool) -> Any:
    from rich.markup import escape
    from rich.table import Table

    columns, rows, ctx = _table(cmp, per_seed, RICH)
    if per_seed:
        title = f"ablate compare: final {cmp.metric}, one row per run"
    else:
        title = f"ablate compare: final {cmp.metric} (mean ± std over seeds)" + (
            "; study: rungs in ladder order, each step vs the previous rung" if cmp.study else "")
    t = Table(title=title, title_justify="left")
    for i, c in enumerate(columns):
        opts = dict(c.rich)
        if i == 0 and not per_seed:  # the variant is never cut: it keeps its full width
            opts["min_width"] = max([len(r.variant) for r in rows] + [7])
        t.add_column((c.rich_head or c.head)(ctx), **opts)
    for r in rows:
        t.add_row(*[c.rich_cell(r) if c.rich_cell else escape(c.cell(r)) for c in columns])
    return t


def _blocks(cmp: Comparison, console: Any, per_seed: bool) -> None:
    """The table as one block per row, for a terminal too narrow for its columns: every number
    is kept and nothing is cut (lines wrap at spaces)."""
    from rich.markup import escape

    heads, cells = plain_table(cmp, per_seed)
    console.print(f"ablate compare: final {escape(cmp.metric)}"
                  + (", one block per run" if per_seed else ", one block per variant"),
                  style="italic", highlight=False)
    for row in cells:
        console.print(f"[bold]{escape(row[0])}[/bold]", soft_wrap=True, highlight=False)
        fields = [f"{h}: {c}" for h, c in zip(heads[1:], row[1:]) if c not in ("", "-")]
        console.print(escape("  " + " · ".join(fields)), highlight=False)


def print_comparison(cmp: Comparison, console: Any = None, per_seed: bool = False) -> None:
    """The rich table: one line per variant, the baseline first (a study: its rungs in ladder
    order, with each rung's step against the one before it); the baseline and why above it,
    notes below it. `per_seed`: one line per run. A terminal narrower than the table gets one
    block per variant instead (a squeezed table would fold every number)."""
    from rich.markup import escape
    from rich.measure import Measurement

    from ablate.report import table_console

    console = console or table_console()  # on a TTY the variant column is never shrunk
    for line in header_lines(cmp):
        console.print(escape(line), soft_wrap=True, highlight=False,
                      style="bold yellow" if line.startswith("MIXED") else None)
    table = _rich_table(cmp, per_seed)
    if Measurement.get(console, console.options.update(max_width=100_000), table).maximum > console.width:
        _blocks(cmp, console, per_seed)
    else:
        console.print(table)
    for note in cmp.notes:
        console.print(f"note: {escape(note)}", soft_wrap=True, highlight=False)


def render(cmp: Comparison, fmt: str = "table", per_seed: bool = False) -> str:
    """csv / markdown / latex as text (the table format prints through rich instead)."""
    if fmt not in FORMATS or fmt == "table":
        raise CompareError(f"--format {fmt}: choose one of {', '.join(FORMATS)}")
    return {"csv": to_csv, "markdown": to_markdown, "latex": to_latex}[fmt](cmp, per_seed)
