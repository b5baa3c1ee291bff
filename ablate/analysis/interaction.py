"""Does the gain survive? The interaction of two crossed axes A x B (ablate/analysis/crossing.py),
paired over seeds: for each of A's other levels a and each level b of B, the Δ of a against A's
baseline a0 at b, and how it differs from its Δ at B's first level b0.

Per seed s (the same seed and data seed in every cell: the same init and batches), the Δ is
y(a, b, s) - y(a0, b, s) and the interaction y(a, b, s) - y(a0, b, s) - y(a, b0, s) + y(a0, b0, s):
each is a contrast within one seed, so the noise the seeds share cancels. Each is averaged over
the seeds its cells share, with a t interval and a one-sample t-test against 0 (stats.contrast_test,
df = seeds - 1); the interactions' p-values are Holm-corrected over every interaction in the table.
With every cell on the same seeds, the mean of the per-seed interactions is the least-squares
interaction of the model cell means + seed effects (tests/test_compare_interaction.py holds it).
A cell's values are its final metric, or (an --lr-grid sweep) its loss at its own best LR.

InteractionCell.as_dict() is the public `interaction` key of compare --json (each cell's row).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Mapping, Optional, Sequence

from ablate.analysis.crossing import Crossing, Factor
from ablate.analysis.load import CompareError
from ablate.analysis.stats import ALPHA, MIN_SEEDS, NO_TEST, SeedTest, contrast_test, holm
from ablate.tables.table import ONLY_TEXT, Align, Column, Field, JsonRow, Table, lines, num
from ablate.names import higher_is_better

Values = Mapping[Any, float]  # seed -> final value of one cell (completed runs only)


@dataclass
class InteractionCell(JsonRow):
    """A level a of A (not its baseline) under a level b of B."""

    a: Factor
    b: Factor
    level_a: str
    level_b: str
    delta: Optional[float]  # mean over the seeds (a0, b) and (a, b) share of y(a, b) - y(a0, b)
    delta_test: SeedTest  # its t interval (no test with fewer than 2 seeds)
    n_delta: int
    difference: Optional[float]  # the mean per-seed interaction; None at b0 (the reference)
    difference_test: SeedTest
    n_difference: int  # the seeds all four cells share
    p_holm: Optional[float] = None
    differs: Optional[bool] = None  # p_holm < alpha; None without a test
    delta_p_holm: Optional[float] = None  # the Δ's p, Holm over every Δ of the table (the main table's family)

    @property
    def reference(self) -> bool:
        return self.level_b == self.b.first

    @property
    def n_seeds(self) -> int:
        return self.n_delta if self.reference else self.n_difference

    def as_dict(self) -> dict:
        return {"a": self.a.name(self.level_a), "b": self.b.name(self.level_b),
                "baseline": f"{self.a.name(self.a.first)},{self.b.name(self.level_b)}",
                "reference": None if self.reference else self.b.name(self.b.first),
                "delta": self.delta, "delta_ci": _interval(self.delta_test),
                "difference": self.difference, "difference_ci": _interval(self.difference_test),
                "p": self.difference_test.p_value, "p_holm": self.p_holm, "n_seeds": self.n_seeds,
                "differs": self.differs, "delta_p_holm": self.delta_p_holm}


def _interval(test: SeedTest) -> Optional[list]:
    return None if test.ci_low is None else [test.ci_low, test.ci_high]


def _mean(values: Sequence[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def _shared(*cells: Values) -> list:
    return sorted(set.intersection(*(set(c) for c in cells)), key=str)


def interaction_cells(values: Mapping[tuple[str, str], Values], a: Factor, b: Factor,
                      alpha: float = ALPHA) -> list[InteractionCell]:
    """values[(a level, b level)]: seed -> value. One cell per level of A but its first (a0) and
    per level of B, in that order; the interactions Holm-corrected together."""
    a0, b0 = a.first, b.first
    out = []
    for ai in a.levels[1:]:
        for bj in b.levels:
            base, mine = values[a0, bj], values[ai, bj]
            seeds = _shared(base, mine)
            diffs = {s: mine[s] - base[s] for s in seeds}
            contrast: dict = {}
            if bj != b0:
                ref_base, ref_mine = values[a0, b0], values[ai, b0]
                contrast = {s: (mine[s] - base[s]) - (ref_mine[s] - ref_base[s])
                            for s in _shared(base, mine, ref_base, ref_mine)}
            out.append(InteractionCell(a, b, ai, bj, _mean(list(diffs.values())), contrast_test(diffs, alpha),
                                       len(diffs), _mean(list(contrast.values())),
                                       contrast_test(contrast, alpha) if bj != b0 else NO_TEST, len(contrast)))
    family = [c for c in out if not c.reference]
    for c, p in zip(family, holm([c.difference_test.p_value for c in family])):
        c.p_holm = p
        c.differs = None if p is None else p < alpha
    for c, p in zip(out, holm([c.delta_test.p_value for c in out])):
        c.delta_p_holm = p
    return out


# ---- what it says ---------------------------------------------------------------------------------
def _beyond(c: InteractionCell, alpha: float) -> Optional[int]:
    """The sign of a Δ beyond seed noise (its Holm p over the table's Δs below alpha, as the
    comparison's verdict); 0: within it; None: no test."""
    if c.delta_p_holm is None or c.delta is None:
        return None
    return 0 if c.delta_p_holm >= alpha or c.delta == 0 else 1 if c.delta > 0 else -1


def verdict(cells: Sequence[InteractionCell], metric: str, alpha: float) -> str:
    """One line for one level of A: under which levels of B its Δ differs (Holm), or that it holds."""
    first = cells[0]
    a, across = first.a.name(first.level_a), first.b.key
    differs = [c for c in cells if c.differs]
    if differs:
        said = "; ".join(f"{c.b.name(c.level_b)} ({c.difference:+.4f} {_whole(_ci(c.difference_test))}, "
                         f"{_whole(f'Holm p={c.p_holm:.3g}')})" for c in differs)
        return f"{a}: its Δ differs under {said} from its Δ at {first.b.name(first.b.first)}"
    tested = [c for c in cells if c.difference_test.ci_low is not None]
    if not tested:
        return f"{a}: no interaction test (fewer than 2 seeds shared by the four cells of every one)"
    lo, hi = min(c.difference_test.ci_low for c in tested), max(c.difference_test.ci_high for c in tested)
    alike = (f"no interaction beyond seed noise (Holm p ≥ {alpha:g}; each difference's {_pct(alpha)} within "
             f"{_whole(f'[{lo:+.4f}, {hi:+.4f}]')})")
    signs = {_beyond(c, alpha) for c in cells}
    better = 1 if higher_is_better(metric) else -1
    if signs == {better}:
        return (f"{a}: the gain holds under every level of {across}: Δ beyond seed noise at each (Holm p<{alpha:g}), "
                f"and {alike}")
    if signs == {-better}:
        return (f"{a}: it is worse under every level of {across}: Δ beyond seed noise at each (Holm p<{alpha:g}), "
                f"and {alike}")
    beyond = [c.b.name(c.level_b) for c in cells if _beyond(c, alpha)]
    where = (f"beyond seed noise (Holm p<{alpha:g}) under {', '.join(beyond)} only" if beyond
             else f"within seed noise at every level of {across}")
    return f"{a}: {alike}; its Δ is {where}"


def _whole(text: str) -> str:
    """Kept on one line where a terminal breaks the line (no-break spaces), as the table shows it."""
    return text.replace(" ", "\u00a0")


def _pct(alpha: float) -> str:
    return f"{100 * (1 - alpha):g}% CI"


def _ci(test: SeedTest) -> str:
    return "-" if test.ci_low is None else f"[{test.ci_low:+.4f}, {test.ci_high:+.4f}]"


def untestable(cells: Sequence[InteractionCell], crossing: Crossing, fill: str = "") -> Optional[str]:
    """Why no interaction of the table has an interval (none has the 2 seeds it needs); None: some have."""
    family = [c for c in cells if not c.reference]
    if any(c.difference_test.ci_low is not None for c in family):
        return None
    most = max((c.n_difference for c in family), default=0)
    return (f"the interaction of {crossing.title} needs at least 2 seeds shared by the four cells it compares "
            f"(the same seed and data seed in each); these runs have {most} at most: run the grid with --seeds 3 "
            f"or more" + (f" ({fill})" if fill else ""))


def notes(cells: Sequence[InteractionCell], crossing: Crossing) -> list[str]:
    a0, b0 = crossing.a.name(crossing.a.first), crossing.b.name(crossing.b.first)
    family = [c for c in cells if not c.reference]
    out = [f"Δ: per seed, the cell minus {a0} at the same level of {crossing.b.key}; the interaction, its "
           f"difference from the Δ at {b0}: per seed, (a, b) − ({a0}, b) − (a, {b0}) + ({a0}, {b0}); "
           f"each the mean over the seeds its cells share, with a t interval; p: one-sample t-test of the per-seed "
           f"interactions, Holm over the {len(family)} interaction{'s' if len(family) != 1 else ''} of this table"]
    untested = [f"{c.a.name(c.level_a)},{c.b.name(c.level_b)} ({c.n_seeds})" for c in cells
                if (c.difference_test if not c.reference else c.delta_test).ci_low is None]
    if untested:
        out.append("no interval (fewer than 2 seeds shared by the cells it compares): " + ", ".join(untested))
    few = [f"{c.a.name(c.level_a)},{c.b.name(c.level_b)} ({c.n_seeds})" for c in family
           if c.difference_test.ci_low is not None and c.n_difference < MIN_SEEDS]
    if few:
        out.append(f"fewer than {MIN_SEEDS} seeds in the interaction: " + ", ".join(few) + "; with one or two "
                   "degrees of freedom the noise estimate is rough, so read the interval, not the verdict")
    return out


# ---- the table ------------------------------------------------------------------------------------
def _delta(c: InteractionCell) -> str:
    return num(c.delta, "+.4f")


def _difference(c: InteractionCell) -> str:
    return "reference" if c.reference else num(c.difference, "+.4f")


def _rich_delta(c: InteractionCell) -> str:
    return lines(_delta(c), f"[dim]{_ci(c.delta_test)}[/dim]" if c.delta_test.ci_low is not None else None)


def _rich_difference(c: InteractionCell) -> str:
    if c.reference:
        return "[dim]reference[/dim]"
    ci = c.difference_test.ci_low is not None
    return lines(_difference(c), f"[dim]{_ci(c.difference_test)}[/dim]" if ci else None)


def _p(c: InteractionCell) -> str:
    if c.reference:
        return ""
    return "-" if c.difference_test.p_value is None else f"{c.difference_test.p_value:.3g} ({c.p_holm:.3g})"


def _word(c: InteractionCell) -> str:
    return "" if c.reference else "-" if c.differs is None else "yes" if c.differs else "no"


def _rich_test(c: InteractionCell, compact: bool = False) -> str:
    if c.reference:
        return ""
    if c.differs is None:
        return "[dim]no test[/dim]"
    said = "[yellow]yes[/yellow]" if c.differs else "no"
    details = [f"p={c.difference_test.p_value:.3g}", f"Holm p={c.p_holm:.3g}"]
    few = f"[yellow]only {c.n_difference} seeds[/yellow]" if c.n_difference < MIN_SEEDS else None
    if compact:
        return lines(said, *details, few)
    return f"{said} ({', '.join(details)})" + (f" {few}" if few else "")


def interaction_columns(crossing: Crossing, alpha: float = ALPHA) -> list[Column]:
    a, b, pct = crossing.a, crossing.b, _pct(alpha)
    a0, b0 = a.name(a.first), b.name(b.first)
    return [
        Column(a.key, lambda c: c.level_a, ("a",), align=Align.LEFT),
        Column(b.key, lambda c: c.level_b, ("b",), align=Align.LEFT),
        Column("seeds", lambda c: str(c.n_seeds), ("n_seeds",), priority=2),
        Column(f"Δ vs {a0}", _delta, ("delta",), term_head=f"Δ vs {a0} [{pct}]", short=f"Δ vs\n{a0}\n[{pct}]",
               markup=_rich_delta),
        Column(f"{pct} of Δ", lambda c: _ci(c.delta_test), ("delta_ci",), targets=ONLY_TEXT),
        Column(f"Δ − Δ at {b0}", _difference, ("difference",), term_head=f"Δ − Δ at {b0} [{pct}]",
               short=f"Δ − Δ at\n{b0}\n[{pct}]", markup=_rich_difference),
        Column(f"{pct} of Δ − Δ", lambda c: "" if c.reference else _ci(c.difference_test), ("difference_ci",),
               targets=ONLY_TEXT),
        Column("p (Holm)", _p, ("p", "p_holm"), targets=ONLY_TEXT),
        Column("differs?", _word, ("differs",), term_head=f"differs? (Holm p<{alpha:g})",
               short=f"differs?\nHolm p<{alpha:g}", markup=_rich_test, compact=partial(_rich_test, compact=True),
               align=Align.LEFT),
    ]


@dataclass
class Interaction:
    """The interaction table of a crossed comparison, and what its figure draws."""

    crossing: Crossing
    cells: list[InteractionCell]
    table: Table
    metric: str
    alpha: float

    @property
    def tables(self) -> list[Table]:
        return [self.table]

    def of(self, label: str) -> Optional[InteractionCell]:
        """The cell named `qk_norm=on,norm=rmsnorm` (None: a baseline cell)."""
        return next((c for c in self.cells if self.crossing.label(c.level_a, c.level_b) == label), None)


def interaction(values: Mapping[tuple[str, str], Values], crossing: Crossing, metric: str, alpha: float = ALPHA,
                what: str = "", said: Optional[list] = None) -> Optional[Interaction]:
    """The interaction report of a crossed comparison; `what`: how each cell's values were taken
    (an LR grid: at its own best LR), said in the title. Where no interaction has the 2 seeds its
    interval needs: refused (CompareError) when --cross asked for it; for a grid sweep, None, and
    why in `said` (its comparison stands without it)."""
    cells = interaction_cells(values, crossing.a, crossing.b, alpha)
    fill = crossing.grid.command(seeds=max(3, crossing.grid.seeds or 0)) if crossing.grid else ""
    why = untestable(cells, crossing, fill)
    if why is not None:
        if crossing.how == "--cross" or said is None:
            raise CompareError(why)
        said.append(f"no interaction table: {why}")
        return None
    a, b = crossing.a, crossing.b
    title = (f"ablate compare: {crossing.title} ({crossing.how}): the Δ {metric} of {a.key} at each level of "
             f"{b.key}, and its difference from the Δ at {b.name(b.first)} (paired over seeds{what})")
    by_a = [[c for c in cells if c.level_a == x] for x in a.levels[1:]]
    head = [f"verdict: {verdict(cs, metric, alpha)}" for cs in by_a]
    return Interaction(crossing, cells, Table(title, interaction_columns(crossing, alpha), cells, head,
                                              notes=notes(cells, crossing)), metric, alpha)


def csv_column() -> Column:
    """The interaction's fields on the main table's rows (csv stays one table)."""
    keys = ("delta", "delta_ci", "difference", "difference_ci", "p", "p_holm", "n_seeds")

    def get(key: str):
        return lambda row: (row.interaction.as_dict()[key] if row.interaction is not None else None)

    return Column("", lambda r: "", tuple(Field(f"interaction_{k}", get(k)) for k in keys), targets=frozenset())


def add_interaction(report: Any) -> Any:
    """A crossed comparison's report (table.Report) with the interaction table under its main one,
    each cell's row given its `interaction` (--json) and csv's fields."""
    cmp = report.comparison
    crossing = cmp.crossing
    values = {crossing.cell(g.runs[0]): g.values for g in cmp.groups}
    report.interaction = interaction(values, crossing, cmp.metric, cmp.alpha, said=report.table.notes)
    for row in cmp:
        row.crossed = report.interaction is not None
        row.interaction = report.interaction.of(row.variant) if report.interaction is not None else None
    if report.interaction is not None:
        report.table.columns.append(csv_column())
    return report
