"""Which report `ablate compare` gives, from its options: an ordinary comparison (one row per
variant, or per run), an --lr-grid sweep's or a --ladder sweep's report, or one LR or rung of
such a sweep (--where) as an ordinary comparison. Each is a Report: one Table
(ablate/tables/render.py prints it in every format) and what its figure draws."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from ablate.analysis.load import CompareError, Run, print_warning
from ablate.analysis.stats import ALPHA
from ablate.analysis.report_types import Report, ReportKind  # noqa: F401 (the report's types, re-exported)
from ablate.names import VAL_LOSS
from ablate.tables.render import FORMATS

LR_KEY = "train.lr"  # an LR grid's own axis (ablate/sweep/transfer_plan.py)


@dataclass(frozen=True)
class CompareOptions:
    """`ablate compare`'s options, as the command line gives them."""

    metric: str = VAL_LOSS
    baseline: Optional[str] = None  # a run directory or a variant name
    where: tuple[str, ...] = ()  # KEY=VALUE filters
    allow_mixed: bool = False
    fmt: str = "table"  # one of FORMATS
    per_seed: bool = False
    wide: bool = False  # a narrow terminal keeps every column (one field per line if they do not fit)
    json: bool = False
    plot: Optional[Path] = None
    plot_keys: tuple[str, ...] = ()
    alpha: float = ALPHA
    cross: Optional[str] = None  # A,B: the two axes whose interaction is reported (a grid sweep's own by default)

    def check(self) -> None:
        if not 0 < self.alpha < 1:
            raise CompareError(f"--alpha must be between 0 and 1, got {self.alpha}")
        if self.fmt not in FORMATS:
            raise CompareError(f"--format {self.fmt}: choose one of {', '.join(FORMATS)}")

    @property
    def machine_readable(self) -> bool:
        """stdout is for a program (--json, csv, ...): every other message goes to stderr."""
        return self.json or self.fmt != "table"


def build_report(paths: Sequence[Path | str], options: CompareOptions,
                 warn: Callable[[str], None] = print_warning) -> Report:
    """The report on the runs under `paths` that match options.where."""
    from ablate.analysis.columns import comparison_table
    from ablate.analysis.compare import compare_runs, load_runs
    from ablate.analysis.crossing import find_crossing
    from ablate.analysis.interaction import add_interaction
    from ablate.analysis.length_eval import add_lengths

    options.check()
    runs = load_runs(paths, options.where, warn)
    transfer = _transfer_report(paths, runs, options)
    if transfer is not None:
        return transfer
    notes: list[str] = []
    crossing = find_crossing(runs, options.cross, notes)
    cmp = compare_runs(runs, options.metric, options.baseline, options.alpha, options.allow_mixed, crossing)
    cmp.notes += notes
    if options.per_seed:
        return Report(ReportKind.PER_SEED, comparison_table(cmp, per_seed=True), comparison=cmp)
    report = add_lengths(Report(ReportKind.COMPARISON, comparison_table(cmp), comparison=cmp), warn)
    return add_interaction(report) if crossing is not None else report


def _transfer_report(paths: Sequence[Path | str], runs: list[Run], options: CompareOptions) -> Optional[Report]:
    """An --lr-grid or --ladder sweep's report; None for other runs, and for one LR and one
    model size of such a sweep (--where): an ordinary comparison."""
    from ablate.analysis.compare import mixed_error
    from ablate.analysis.crossing import crossed_mixed, find_crossing
    from ablate.analysis.transfer_report import find_transfer, transfer_compare, transfer_record
    from ablate.sweep.transfer_record import TransferKind

    if not find_transfer(paths):
        return None
    record = transfer_record(runs)
    if record is None or (options.where and _one_point(runs)):
        return None
    crossing, notes = None, []
    if record.kind is TransferKind.LR_GRID:  # each cell at its own best LR
        crossing = find_crossing(runs, options.cross, notes, exclude=(LR_KEY,))
        mixed = crossed_mixed(runs, crossing) if crossing is not None else {}
        if mixed:  # the grid's report has no mixed cells: one variant per cell
            raise mixed_error(mixed, crossing, allow=False)
    elif options.cross:
        raise CompareError("--cross: not available for a --ladder sweep (cross two axes in an ordinary or "
                           "an --lr-grid sweep, or compare one rung with --where model.d_model=X)")
    given = [flag for flag, on in (("--metric", options.metric != VAL_LOSS), ("--per-seed", options.per_seed),
                                   ("--plot-key", bool(options.plot_keys))) if on]
    if given:
        raise CompareError(f"{', '.join(given)}: not available for an --lr-grid or --ladder sweep, whose "
                           "report is on the final val_loss (compare one of its LRs or rungs with "
                           "--where train.lr=X or --where model.d_model=X instead)")
    report = transfer_compare(runs, record, options.baseline, options.alpha, crossing)
    report.table.notes += notes
    return report


def _one_point(runs: list[Run]) -> bool:
    """The runs (after --where) share one learning rate and one model size."""
    keys = ("train.lr", "model.d_model", "model.n_layers")
    return len({tuple(r.config.get(k) for k in keys) for r in runs}) == 1
