"""`ablate compare` of runs with a loss at other context lengths (length_eval.json, written by
`ablate eval` and train.eval_lengths; ablate/evaluation/length_record.py): one table per evaluation
protocol (windows, stride S, RoPE scaling) under the main comparison, one row per variant and
per length its mean loss over seeds, its Δ vs the baseline with the CI and the Holm-corrected p.

The statistics are the main table's (compare.paired_or_welch: a paired t-test over the seeds both have,
else Welch; compare.holm_correct: Holm over the variants, here at each length). A variant's seeds
at a length are its completed runs with a result there: a run that was not evaluated at a length
another run has is named in a note (its variant's mean there is over the others), never silently
left out. A length where the baseline has no loss (a learned table past its rows: n/a) shows
each variant's loss without Δ, with a note. Every length beyond the training length is marked.

The rows: LengthRow per variant and protocol, a LengthCell per length (its as_dict() is an
entry of the main row's `length_eval` list in --json); csv carries them as more columns of the
main table's rows (one row per variant either way), so csv stays one table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Optional

from ablate.analysis.columns import VERDICT_COLORS, ci, delta, p_holm, rich_variant, variant_name
from ablate.analysis.groups import Group
from ablate.analysis.load import print_warning
from ablate.analysis.stats import MIN_SEEDS
from ablate.analysis.report_types import Report
from ablate.tables.table import ONLY_TERMINAL, ONLY_TEXT, Align, Column, Field, JsonRow, Table, lines, num
from ablate.evaluation.length_record import LENGTH_EVAL, EvalKey, EvalStatus, LengthRecord, read_lengths
from ablate.names import VAL_LOSS, Status

NOT_EVALUATED = "not evaluated"  # a cell's status: no run of the variant has a result at this key
BEYOND = "*"  # marks a length beyond the training length


@dataclass
class LengthCell(JsonRow):
    """A variant at one evaluation length and protocol (an entry of `length_eval` in --json)."""

    key: EvalKey
    baseline: bool
    beyond_train: bool  # longer than the length its runs trained at
    status: str  # ok | n/a | not evaluated
    reason: Optional[str]  # why n/a
    n: int  # seeds in the mean
    runs: int  # the variant's completed runs
    seeds: list
    missing_seeds: list  # completed runs without a result at this key
    mean: Optional[float]
    std: Optional[float]
    ci: Optional[list]  # the mean's (1 - alpha) t interval over seeds
    vs: Any  # compare.Versus: the Δ vs the baseline, its test and Holm p (the main table's)
    missing_dirs: list = field(default_factory=list)  # those runs' directories (for the note's command)

    def as_dict(self) -> dict:
        d = {"length": self.key.length, "stride": self.key.stride, "rope_scaling": self.key.rope_scaling,
             "protocol": self.key.protocol, "beyond_train": self.beyond_train, "status": self.status,
             "reason": self.reason, "n": self.n, "runs": self.runs, "seeds": self.seeds,
             "missing_seeds": self.missing_seeds, "mean": self.mean, "std": self.std, "ci": self.ci}
        d.update(self.vs.as_dict())
        d["delta_ci"] = None if self.vs.test.ci_low is None else [self.vs.test.ci_low, self.vs.test.ci_high]
        return d


@dataclass
class LengthRow(JsonRow):
    """One variant in one protocol's table: a cell per length."""

    variant: str
    baseline: bool
    cells: list[LengthCell]

    def as_dict(self) -> dict:
        return {"variant": self.variant, "baseline": self.baseline,
                "length_eval": [c.as_dict() for c in self.cells]}


@dataclass
class Protocol:
    """One protocol's results: its keys in length order, the training lengths, the rows."""

    name: str  # EvalKey.protocol
    keys: list[EvalKey]
    train_lengths: list[int]
    rows: list[LengthRow]
    notes: list[str] = field(default_factory=list)

    @property
    def shortest_train(self) -> int:
        return min(self.train_lengths)

    def label(self, key: EvalKey) -> str:
        """A length as a header shows it: `512*` beyond the training length."""
        return f"{key.length}" + (BEYOND if key.length > self.shortest_train else "")


@dataclass
class LengthEval:
    """Every protocol present in the compared runs, and their tables (under the main one)."""

    protocols: list[Protocol]
    tables: list[Table]


# ---- the statistics -------------------------------------------------------------------------------
def read_records(groups: list[Group], warn: Callable[[str], None] = print_warning) -> dict:
    """run dir -> LengthRecord of every compared run that has one (an unreadable one: a warning)."""
    out = {}
    for run in (r for g in groups for r in g.runs):
        try:
            record = read_lengths(run.dir)
        except (OSError, ValueError, KeyError, TypeError) as e:
            warn(f"{run.dir / LENGTH_EVAL}: unreadable ({e}); its lengths are left out")
            continue
        if record is not None:
            out[run.dir] = record
    return out


def _at(g: Group, key: EvalKey, records: dict) -> tuple[Group, set, list]:
    """The variant at `key`: a Group of its completed runs' losses by seed, the n/a reasons,
    and the completed runs without a result there."""
    values, reasons, missing = {}, set(), []
    for run in g.runs:
        if run.status != Status.COMPLETED:
            continue
        record = records.get(run.dir)
        result = record.get(key) if record else None
        if result is None and key.rope_scaling and run.config.get("pos.name") not in (None, "rope"):
            reasons.add(f"pos={run.config['pos.name']}: RoPE scaling applies to pos=rope runs only")
        elif result is None:
            missing.append(run)
        elif result.status == EvalStatus.NOT_AVAILABLE:
            reasons.add(result.reason or "not available")
        elif result.loss is None or not math.isfinite(result.loss):
            reasons.add("no finite loss")  # said as n/a: never averaged in
        elif run.seed not in values:
            values[run.seed] = result.loss
    return Group(g.runs, g.label, values), reasons, sorted(missing, key=lambda r: str(r.seed))


def _cells(groups: list[Group], key: EvalKey, records: dict, alpha: float) -> list[LengthCell]:
    """Every variant's cell at `key`: Δ vs its baseline (the main table's: Group.ref) with the main
    table's test, Holm over the variants at this length."""
    from ablate.analysis.compare import Versus, holm_correct, paired_or_welch
    from ablate.analysis.stats import mean_std
    from ablate.analysis.transfer_stats import mean_ci

    at = {id(g): _at(g, key, records) for g in groups}
    cells = []
    for g in groups:
        ref = at[id(g.ref)][0] if g.ref is not None else None
        mine, reasons, missing = at[id(g)]
        vals = list(mine.values.values())
        mean, std = mean_std(vals)
        low, high = mean_ci(vals, alpha)
        status = EvalStatus.OK.value if vals else EvalStatus.NOT_AVAILABLE.value if reasons else NOT_EVALUATED
        trains = [records[r.dir].train_seq_len for r in g.runs if r.dir in records]
        vs = paired_or_welch(ref, mine, alpha) if ref is not None and ref.values else Versus()
        cells.append(LengthCell(key, g.baseline, bool(trains) and key.length > min(trains), status,
                                "; ".join(sorted(reasons)) or None, len(vals),
                                sum(r.status == Status.COMPLETED for r in g.runs), sorted((s[0] for s in mine.values), key=str),
                                [r.seed[0] for r in missing], mean, std, None if low is None else [low, high], vs,
                                [str(r.dir) for r in missing]))
    holm_correct([c.vs for c in cells], VAL_LOSS, alpha)
    return cells


def _protocols(records: dict) -> list[list[EvalKey]]:
    """The keys of each protocol present, windows first, each in length order."""
    keys = {r.key for record in records.values() for r in record.results}
    by: dict[tuple, list[EvalKey]] = {}
    for k in sorted(keys, key=lambda k: (k.stride or 0, k.rope_scaling or "", k.length)):
        by.setdefault((k.stride, k.rope_scaling), []).append(k)
    return list(by.values())


def length_eval(cmp: Any, warn: Callable[[str], None] = print_warning) -> Optional[LengthEval]:
    """The loss at other lengths of a Comparison's variants; None when no run has length_eval.json."""
    records = read_records(cmp.groups, warn)
    if not records:
        return None
    protocols = []
    for keys in _protocols(records):
        per_key = [_cells(cmp.groups, k, records, cmp.alpha) for k in keys]
        rows = [LengthRow(g.label, g.baseline, [cells[i] for cells in per_key]) for i, g in enumerate(cmp.groups)]
        trains = sorted({r.train_seq_len for r in records.values()})
        p = Protocol(keys[0].protocol, keys, trains, rows)
        p.notes = protocol_notes(p, records) + window_notes(cmp.groups)
        protocols.append(p)
    return LengthEval(protocols, [protocol_table(p, cmp.baseline, cmp.alpha) for p in protocols])


# ---- the notes ------------------------------------------------------------------------------------
def _eval_command(key: EvalKey, lengths: list[int], dirs: list[str]) -> str:
    """The command that fills the gaps: the one run, or the folder (a sweep) that holds them."""
    import os

    where = dirs[0] if len(set(dirs)) == 1 else os.path.commonpath(dirs)
    return (f"ablate eval {where} --lengths {','.join(map(str, lengths))}"
            + (f" --stride {key.stride}" if key.stride else "")
            + (f" --rope-scaling {key.rope_scaling}" if key.rope_scaling else ""))


def _per_train(p: Protocol, records: dict) -> str:
    if len(p.train_lengths) == 1:
        return f"{p.train_lengths[0]} tokens"
    counts = {t: sum(r.train_seq_len == t for r in records.values()) for t in p.train_lengths}
    return ", ".join(f"{t} in {n} run(s)" for t, n in counts.items()) + f"; marked beyond {p.shortest_train}"


def protocol_notes(p: Protocol, records: dict) -> list[str]:
    """What to read beside a protocol's table: the mark, a baseline without a loss, n/a lengths,
    and the runs that were not evaluated where others were."""
    notes = []
    if any(k.length > p.shortest_train for k in p.keys):
        notes.append(f"{BEYOND} beyond the training length ({_per_train(p, records)}): positions the model "
                     "never saw in training")
    base = next((r for r in p.rows if r.baseline), None)
    gone = [c for c in base.cells if c.status != EvalStatus.OK] if base is not None else []
    for why in dict.fromkeys(f"n/a ({c.reason})" if c.reason else c.status for c in gone):
        at = [p.label(c.key) for c in gone if (f"n/a ({c.reason})" if c.reason else c.status) == why]
        notes.append(f"at {', '.join(at)} the baseline ({base.variant}) is {why}: each variant's loss there "
                     "is shown without Δ (--baseline picks another)")
    for row in p.rows:
        na = [c for c in row.cells if c.status == EvalStatus.NOT_AVAILABLE and not row.baseline]
        for reason in dict.fromkeys(c.reason for c in na):
            notes.append(f"{row.variant}: n/a at {', '.join(p.label(c.key) for c in na if c.reason == reason)} "
                         f"({reason})")
    few = [row.variant for row in p.rows if any(c.vs.few_seeds for c in row.cells)]
    if few:  # as the main table says it
        notes.append(f"fewer than {MIN_SEEDS} seeds in a test: {', '.join(few)}; read the interval, not the p "
                     f"(run --seeds {MIN_SEEDS} or more)")
    notes += _missing_notes(p)
    return notes


def window_notes(groups: list[Group]) -> list[str]:
    """The variants with sliding windows (attn.window in their runs' config) and what their layers
    see, in one note (none without such a variant)."""
    from ablate.model.sliding import LOCAL_LAYERS

    named = []
    for g in groups:
        window = g.first(lambda r: (r.config or {}).get("attn.window"))
        if window is not None:
            every = g.first(lambda r: (r.config or {}).get("attn.global_every"))
            pattern = f"attn.window={window}" + (f", attn.global_every={every}" if every else "")
            named.append(g.label if g.label == pattern else f"{g.label} ({pattern})")
    return [f"sliding windows in {'; '.join(named)}: {LOCAL_LAYERS}"] if named else []


def _missing_notes(p: Protocol) -> list[str]:
    """The runs that lack a length another run has: their variant's mean there is over the others."""
    notes, lengths, dirs = [], set(), []
    for row in p.rows:
        for c in row.cells:
            if not c.missing_seeds or c.status == EvalStatus.NOT_AVAILABLE:
                continue
            lengths.add(c.key.length)
            dirs += c.missing_dirs
            seeds = ", ".join(map(str, c.missing_seeds))
            if c.n:
                notes.append(f"{row.variant}: seed {seeds} not evaluated at {p.label(c.key)}; its mean there is "
                             f"over {c.n} of {c.runs} seeds")
            else:
                notes.append(f"{row.variant}: not evaluated at {p.label(c.key)} (seed {seeds})")
    if lengths:
        notes.append(f"to evaluate the runs that lack a length: {_eval_command(p.keys[0], sorted(lengths), dirs)}")
    return notes


# ---- the columns ----------------------------------------------------------------------------------
def _loss(c: LengthCell) -> str:
    return "n/a" if c.status == EvalStatus.NOT_AVAILABLE else num(c.mean, ".4f")


def _delta(c: LengthCell) -> str:
    return "" if c.baseline else num(c.vs.delta, "+.4f")


def _holm(c: LengthCell) -> str:
    return "" if c.baseline else num(c.vs.p_holm, ".3g")


def _plan(row: LengthRow) -> list[Callable[[LengthCell], str]]:
    """The lines of a row's terminal cells: the loss; a variant's Δ and Holm p below it."""
    return [_loss] if row.baseline else [_loss, _delta, _holm]


def _rich_cell(row: LengthRow, i: int) -> str:
    from rich.markup import escape

    c = row.cells[i]
    color = VERDICT_COLORS.get(c.vs.verdict or "")
    said = [escape(show(c)) for show in _plan(row)]
    if color and len(said) > 1:
        said[1] = f"[{color}]{said[1]}[/{color}]"
    return "\n".join(said)


def _ci_cell(row: LengthRow, i: int) -> str:
    """A variant's CI on its Δ's line (the line below its loss)."""
    return "" if row.baseline else "\n" + ci(row.cells[i])


def suffix(key: EvalKey) -> str:
    """A length's name in csv: `512`, `512_stride128`, `512_pi:2.0`."""
    return f"{key.length}" + (f"_stride{key.stride}" if key.stride else "") + (f"_{key.rope_scaling}" if key.rope_scaling else "")


def protocol_columns(p: Protocol, alpha: float) -> list[Column]:
    """Markdown and LaTeX: a column per figure and length (loss 256, loss 512*, Δ 256, ...). The
    terminal: a column per length whose lines are the row's loss, Δ and Holm p, labelled on the
    left, and beside each its Δ's CI where one has a CI (a narrow terminal drops the CIs of the
    shortest lengths first)."""
    pct = f"{100 * (1 - alpha):g}% CI"
    figures = [("loss", _loss), ("Δ", delta), (pct, ci), ("p (Holm)", p_holm)]
    cols = [Column("variant", variant_name, markup=rich_variant, compact=partial(rich_variant, sep="\n"),
                   align=Align.LEFT),
            Column("", lambda r: lines(*[{_loss: "loss", _delta: "Δ", _holm: "Holm p"}[f] for f in _plan(r)]),
                   align=Align.LEFT, targets=ONLY_TERMINAL)]
    cols += [Column(f"{name} {p.label(k)}", (lambda r, i=i, show=show: show(r.cells[i])), targets=ONLY_TEXT)
             for name, show in figures for i, k in enumerate(p.keys)]
    for i, k in enumerate(p.keys):
        label = p.label(k)
        cols.append(Column(label, lambda r, i=i: lines(*[show(r.cells[i]) for show in _plan(r)]),
                           markup=partial(_rich_cell, i=i), targets=ONLY_TERMINAL))
        if any(r.cells[i].vs.test.ci_low is not None for r in p.rows):
            cols.append(Column(f"{pct} {label}", partial(_ci_cell, i=i), term_head=f"{label} {pct}",
                               short=f"{label}\n{pct}", targets=ONLY_TERMINAL, priority=len(p.keys) - i))
    return cols


def protocol_table(p: Protocol, baseline: Optional[str], alpha: float) -> Table:
    title = "ablate compare: loss by evaluation length (mean over seeds" + ("; Holm per length)" if baseline else ")")
    # too wide for a terminal, the lengths go into parts, each with the variant and the row labels
    return Table(title, protocol_columns(p, alpha), p.rows, [describe(p.keys[0])], notes=p.notes, lead=2)


def describe(key: EvalKey) -> str:
    """A protocol in words, the line above its table."""
    how = ("non-overlapping windows of each length, every token scored" if key.stride is None else
           f"sliding windows of each length, the last {key.stride} tokens of each scored, the first window whole")
    return f"protocol: {key.protocol} ({how}" + (f"; RoPE scaled {key.rope_scaling})" if key.rope_scaling else ")")


def csv_column(p: Protocol) -> Column:
    """csv only: a protocol's figures per length as more fields of the main table's rows (one row
    per variant in both), read from each main row's length_eval cells."""
    def cell(row, key: EvalKey) -> Optional[LengthCell]:
        return next((c for c in row.length_eval or [] if c.key == key), None)

    def get(read: Callable[[LengthCell], Any], key: EvalKey) -> Callable:
        return lambda row: None if cell(row, key) is None else read(cell(row, key))

    figures = [("status", lambda c: c.status), ("n", lambda c: c.n), ("loss", lambda c: c.mean),
               ("delta", lambda c: c.vs.delta), ("ci_low", lambda c: c.vs.test.ci_low),
               ("ci_high", lambda c: c.vs.test.ci_high), ("p_holm", lambda c: c.vs.p_holm)]
    fields = tuple(Field(f"{name}_{suffix(k)}", get(read, k)) for name, read in figures for k in p.keys)
    return Column("", lambda r: "", fields, targets=frozenset(), csv_rank=9)


def add_lengths(report: Report, warn: Callable[[str], None] = print_warning) -> Report:
    """A comparison report with the loss at other lengths where any compared run has it: its
    tables (report.lengths), each row's `length_eval` cells (--json) and csv's fields."""
    lengths = length_eval(report.comparison, warn)
    if lengths is None:
        return report
    for i, row in enumerate(report.comparison):
        row.length_eval = [c for p in lengths.protocols for c in p.rows[i].cells]
    report.table.columns += [csv_column(p) for p in lengths.protocols]
    report.lengths = lengths
    return report
