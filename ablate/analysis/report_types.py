"""What `ablate compare` gives: a Report, one Table (ablate/tables/table.py) and what its figure
draws; its kind says which (ablate/analysis/report.py chooses it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ablate.tables.table import Table


class ReportKind(str, Enum):
    COMPARISON = "comparison"  # one row per variant
    PER_SEED = "per_seed"  # one row per run
    LR_GRID = "lr_grid"
    LADDER = "ladder"

    __str__ = str.__str__
    __format__ = str.__format__


@dataclass
class Report:
    kind: ReportKind
    table: Table
    comparison: Any = None  # compare.Comparison of an ordinary report: its plots read it
    points: list = field(default_factory=list)  # transfer_report.Point: every run of a grid or ladder
    ladder: Any = None  # transfer_report.LadderFit: the ladder's fitted curves, for its figure
    lengths: Any = None  # length_eval.LengthEval: the loss at other context lengths, tables under the main one
    interaction: Any = None  # interaction.Interaction: two crossed axes, its table under the main one

    @property
    def tables(self) -> list[Table]:
        """The main table, then the tables printed under it (the interaction of two crossed axes,
        one per evaluation protocol)."""
        return ([self.table] + (list(self.interaction.tables) if self.interaction is not None else [])
                + (list(self.lengths.tables) if self.lengths is not None else []))

    @property
    def rows(self) -> list:
        return self.table.rows

    @property
    def notes(self) -> list[str]:
        return self.table.notes
