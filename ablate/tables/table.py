"""The one table model of every table ablate prints: a `Table` of typed `Column`s over typed rows,
rendered by ablate/tables/render.py in every format (the terminal's rich table, markdown, LaTeX,
csv, JSON). `ablate compare`'s reports, `bench`, `bench --decode`, `inspect` and `coord-check`
all build one.

A column says, once: its header (and the short one a narrow terminal shows), how its cell
reads as plain text (markdown, LaTeX, one field per line) and as rich markup (the terminal
table; `compact`: the narrow terminal's cell, one whole phrase per line), which raw fields csv
carries, where it shows (`targets`), its alignment and how early a narrow terminal drops it
(`priority`). A row is a dataclass whose `as_dict()` is its `--json` object (JsonRow).

Adding a column to a report: one `Column(...)` in the list its builder returns
(ablate/analysis/columns.py for compare, transfer_report.py for the LR grid and the ladder,
ablate/measure/bench_report.py, inspect_report.py and coord_report.py for the measurements).
A new table (say, the loss at several evaluation lengths) is typed rows plus its columns, those
per item of a list generated from it as the ladder's per rung are (ladder_columns); the
renderer needs nothing new.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Callable, Generic, Optional, Sequence, TypeVar


class Align(str, Enum):
    LEFT = "left"  # words
    RIGHT = "right"  # numbers


class Target(str, Enum):
    TEXT = "text"  # markdown, LaTeX and the one-field-per-line blocks: plain text
    TERMINAL = "terminal"  # the rich table


BOTH = frozenset({Target.TEXT, Target.TERMINAL})
ONLY_TEXT, ONLY_TERMINAL = frozenset({Target.TEXT}), frozenset({Target.TERMINAL})

class JsonRow:
    """A typed row that reads as its `--json` object too (`row["best_lr"]`), as a script reading
    --json would. Dataclasses: `as_dict()` is their fields in order unless they say otherwise."""

    def as_dict(self) -> dict:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def of(cls, x: dict) -> Any:
        """The row of a `--json` object, field by field (a key the object lacks: None)."""
        return cls(*(x.get(f) for f in cls.__dataclass_fields__))  # type: ignore[attr-defined]

    def __getitem__(self, key: str) -> Any:
        return self.as_dict()[key]

    def __contains__(self, key: str) -> bool:
        return key in self.as_dict()


R = TypeVar("R", bound=JsonRow)


@dataclass(frozen=True)
class Field(Generic[R]):
    """One raw csv value of a column: `get` reads it from a row (None: the row's --json value
    under `name`)."""

    name: str
    get: Optional[Callable[[R], Any]] = None

    def of(self, row: R, as_json: dict) -> Any:
        return self.get(row) if self.get is not None else as_json.get(self.name)


@dataclass(frozen=True)
class Column(Generic[R]):
    head: str  # markdown, LaTeX, the blocks; the terminal table's too unless `term_head`
    cell: Callable[[R], str]  # plain text of a row's cell
    fields: tuple = ()  # Field or a name (its --json value): what csv writes for this column
    targets: frozenset = BOTH
    term_head: Optional[str] = None  # the full terminal table's header
    short: Optional[str] = None  # a narrow terminal's header ('\n' between words, never inside one)
    markup: Optional[Callable[[R], str]] = None  # rich markup of the cell, if more than its text
    compact: Optional[Callable[[R], str]] = None  # a narrow terminal's cell: one whole phrase a line
    align: Align = Align.RIGHT
    priority: int = 0  # a narrow terminal drops the highest first (0: never)
    csv_rank: int = 0  # csv writes the fields of lower ranks first

    def raw_fields(self) -> list[Field]:
        return [f if isinstance(f, Field) else Field(f) for f in self.fields]

    def rich(self, row: R) -> str:
        """The full terminal table's cell (rich markup)."""
        if self.markup is not None:
            return self.markup(row)
        from rich.markup import escape

        return escape(self.cell(row))

    def narrow(self, row: R) -> str:
        return self.compact(row) if self.compact is not None else self.rich(row)

    def header(self, compact: bool) -> str:
        full = self.term_head if self.term_head is not None else self.head
        return (self.short or full) if compact else full


@dataclass
class Table(Generic[R]):
    """A report's table: the first column names each row (never cut, bold on a terminal); `head`
    is read before it (`warning` first, in yellow), `foot` after it (the setting it was measured
    in, figures read beside it), then the `notes`."""

    title: str
    columns: list[Column[R]]
    rows: list[R]
    head: list[str] = field(default_factory=list)
    warning: Optional[str] = None
    notes: list[str] = field(default_factory=list)
    foot: list[str] = field(default_factory=list)
    lead: int = 0  # terminal columns that name a row, repeated when a narrow terminal splits it (0: never)

    def shown(self, target: Target) -> list[Column[R]]:
        return [c for c in self.columns if target in c.targets]

    def text_cells(self) -> tuple[list[str], list[list[str]]]:
        """Headers and cells as plain text (markdown, LaTeX and the blocks are this table)."""
        columns = self.shown(Target.TEXT)
        return [c.head for c in columns], [[c.cell(r) for c in columns] for r in self.rows]

    def head_lines(self) -> list[str]:
        return ([self.warning] if self.warning else []) + self.head

    def raw(self) -> tuple[list[str], list[list[Any]]]:
        """csv's (and W&B's) names and raw values: each column's fields, by csv_rank."""
        fields = [f for c in sorted(self.columns, key=lambda c: c.csv_rank) for f in c.raw_fields()]
        values = []
        for r in self.rows:
            as_json = r.as_dict()
            values.append([f.of(r, as_json) for f in fields])
        return [f.name for f in fields], values


def num(v: Optional[float], spec: str, default: str = "-") -> str:
    return default if v is None else format(v, spec)


def lines(*parts: Optional[str]) -> str:
    """A multi-line cell: the parts that are not None, one a line."""
    return "\n".join(p for p in parts if p is not None)


def column_names(columns: Sequence[Column]) -> str:
    """The columns' headers for a line of prose, each kept on one line when it wraps (no-break spaces)."""
    return ", ".join(c.head.replace(" ", "\u00a0") for c in columns if c.head)
