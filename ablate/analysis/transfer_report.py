"""`ablate compare` of an --lr-grid or a --ladder sweep (its sweep directory holds transfer.json,
ablate/sweep/transfer_plan.py): one typed row per variant (GridRow, LadderRow: their as_dict() is the
public `compare --json` object) and the columns of the one table model (ablate/tables/table.py).

LR grid: best_lr (and best_lr_on_edge), the loss at the best LR with its CI, tuned_delta vs
the baseline at *its* best LR (paired t over seeds, Holm over variants), shared_delta at the
config's LR, verdict_differs, lr_sensitivity (Wortsman et al. 2023), max_attn_logit at the
highest LR (runs with train.diagnostics_every).
Ladder: per rung the loss, the delta vs the baseline and the compute multiplier; fitted
L(C) = L_inf + A * C^-alpha with one shared L_inf; compute_multiplier and
compute_multiplier_ci at a projected compute, each interval its delta's (transfer.multiplier_ci);
wins_every_rung and on how many rungs beyond noise (wins_beyond_noise); rank_agreement between
the smallest and the largest rung. Compute is FLOPs/token (as `inspect` counts) x tokens trained.
A ladder with an LR grid: each variant on each rung at its own best LR there (best_lr per rung)
and how many grid steps that LR moves from the smallest rung to the largest (lr_steps_moved);
on an lr_rule mup ladder, one scan at the smallest rung and its pick on every rung.
The statistics are ablate/analysis/transfer_stats.py's.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from ablate.analysis.load import CompareError, Run, number
from ablate.analysis.stats import ALPHA, mean_std, seed_test
from ablate.analysis.report_types import Report, ReportKind
from ablate.tables.table import ONLY_TERMINAL, ONLY_TEXT, Align, Column, Field, JsonRow, Table, lines, num
from ablate.names import LADDER_TOKENS_KEY, LR, TOKENS, VAL_LOSS, Status
from ablate.sweep.transfer_record import RungPlan, TransferKind, TransferRecord

MIN_RUNGS = 3  # fewer: the rung table, no fit and no projection


@dataclass
class Point:
    """One run of the sweep."""

    variant: str
    seed: Any
    lr: float
    rung: Optional[str]
    loss: Optional[float]  # final val_loss of a completed run; None: diverged, failed, stopped
    loss_init: Optional[float]  # val_loss at step 0
    compute: Optional[float]  # FLOPs/token x tokens trained
    max_attn_logit: Optional[float]
    dir: str


def _first_val(run: Run) -> Optional[float]:
    for row in run.rows:
        if row.get("step") == 0 and VAL_LOSS in row:
            return number(row[VAL_LOSS])
    return None


def _max_logit(run: Run) -> Optional[float]:
    vals = [number(v) for row in run.rows for k, v in row.items() if k.startswith("diag/max_attn_logit")]
    vals = [v for v in vals if v is not None and math.isfinite(v)]
    return max(vals) if vals else None


def _rung_of(run: Run, rungs: Sequence[RungPlan]) -> Optional[str]:
    for r in rungs:
        if (run.config.get("model.d_model"), run.config.get("model.n_layers")) == (r.d_model, r.n_layers):
            return r.name
    return None


def to_points(runs: Sequence[Run], record: TransferRecord) -> list[Point]:
    out = []
    for r in runs:
        loss = r.value(VAL_LOSS) if r.status == Status.COMPLETED else None
        fpt, tokens = number(r.record.info.flops_per_token), r.record.metric(TOKENS)
        out.append(Point(str(r.record.variant or r.dir.name), r.record.seed,
                         float(r.config.get("train.lr") or 0.0),
                         _rung_of(r, record.rungs),
                         loss if loss is not None and math.isfinite(loss) else None, _first_val(r),
                         fpt * tokens if fpt and tokens else None, _max_logit(r), str(r.dir)))
    return out


def find_transfer(paths: Sequence[Path | str]) -> bool:
    """Whether a given path is, holds or lies in an --lr-grid or --ladder sweep (transfer.json)."""
    from ablate.run.directory import TRANSFER

    for p in map(Path, paths):
        p = p.resolve()
        if any((d / TRANSFER).is_file() for d in (p, *p.parents)) or (p.is_dir() and any(p.rglob(TRANSFER))):
            return True
    return False


def transfer_record(runs: Sequence[Run]) -> Optional[TransferRecord]:
    """The transfer.json of the runs' sweep, None for ordinary runs; runs of several grids or
    ladders, or such runs mixed with others, are refused."""
    from ablate.sweep.transfer_record import read_transfer

    records = {d: read_transfer(d) for d in dict.fromkeys(r.dir.parent for r in runs)}
    kinds = set(records.values())
    if kinds == {None}:
        return None
    if len(kinds) > 1:
        what = ", ".join(sorted({str(d) for d, v in records.items() if v is not None}))
        raise CompareError(f"these runs mix sweeps of different LR grids or ladders (or such a sweep "
                           f"with other runs): {what}; compare one such sweep at a time")
    return next(iter(records.values()))


@dataclass
class LadderFit:
    """What the ladder's figure draws beside the rows: each variant's fitted curve, the projected
    compute and the baseline's compute at each rung."""

    fits: dict  # variant -> transfer.PowerLaw
    target: Optional[float]
    computes: list
    rungs: list


def _lr(v: Optional[float]) -> str:
    return num(v, "g")


def _ci(v: Optional[Sequence[float]]) -> str:
    return "-" if v is None else f"[{v[0]:+.4f}, {v[1]:+.4f}]"


def _nearest(grid: Sequence[float], lr: float) -> float:
    return min(grid, key=lambda x: abs(math.log(x / lr)))


def _by_variant(points: Sequence[Point], baseline: Optional[str]) -> tuple[list[str], str]:
    names = list(dict.fromkeys(p.variant for p in points))
    base = baseline or ("baseline" if "baseline" in names else names[0])
    if base not in names:
        raise CompareError(f"--baseline {base}: no such variant; variants: {', '.join(names)}")
    return [base] + [n for n in names if n != base], base


def _mean(values: Sequence[Optional[float]]) -> Optional[float]:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


# ---- the LR grid --------------------------------------------------------------------------------
@dataclass
class GridRow(JsonRow):
    """One variant of an LR grid, each field a public --json key (docs/transfer.md)."""

    variant: str
    baseline: bool
    best_lr: Optional[float]
    best_lr_on_edge: bool
    n: int
    loss: Optional[float]
    loss_ci: Optional[list]
    tuned_delta: Optional[float]
    tuned_delta_ci: Optional[list]
    tuned_p: Optional[float]
    tuned_t: Optional[float]
    seeds_needed: Optional[int]
    seeds_needed_alpha: Optional[float]
    tuned_p_holm: Optional[float]
    tuned_verdict: Optional[str]
    shared_lr: float
    shared_delta: Optional[float]
    verdict_differs: bool
    lr_sensitivity: Optional[float]
    loss_init: Optional[float]
    max_attn_logit: Optional[float]
    max_attn_logit_lr: float
    curve: dict  # "lr" -> the grid's final loss there (None: diverged)
    crossed: bool = False  # two crossed axes: the row has the `interaction` key
    interaction: Any = None  # interaction.InteractionCell of a cell of A's other levels; None: a baseline

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("crossed")
        if self.crossed:
            d["interaction"] = self.interaction.as_dict() if self.interaction is not None else None
        else:
            del d["interaction"]
        return d


def _crossed_variants(points: Sequence[Point], crossing: Any) -> tuple[list[str], dict, dict]:
    """The variants of a crossed LR grid, one per cell, A's baseline level first (each of A's
    levels in B's order), each one's reference (A's baseline at its level of B) and its cell."""
    cell_of = {p.variant: crossing.cells[Path(p.dir)] for p in points}
    by_cell = {cell: n for n, cell in cell_of.items()}
    names = [by_cell[a, b] for a in crossing.a.levels for b in crossing.b.levels]
    return names, {n: None if cell_of[n][0] == crossing.a.first else by_cell[crossing.a.first, cell_of[n][1]]
                   for n in names}, cell_of


def lr_grid_report(points: Sequence[Point], record: TransferRecord, baseline: Optional[str] = None,
                   alpha: float = ALPHA, crossing: Any = None) -> Report:
    """The LR grid's report; with two crossed axes (crossing.Crossing, its baseline already set),
    each cell against A's baseline at its level of B, both at their own best LR, and the
    interaction table of those tuned values."""
    import ablate.analysis.transfer_stats as T

    reference: Optional[dict] = None
    if crossing is not None:
        names, reference, cell_of = _crossed_variants(points, crossing)
        base = names[0]
    else:
        names, base = _by_variant(points, baseline)
    grid = list(record.grid)
    shared = _nearest(grid, record.shared_lr or grid[len(grid) // 2])
    runs: dict = {n: {lr: {} for lr in grid} for n in names}
    inits: dict = {n: [] for n in names}
    for p in points:
        runs[p.variant][_nearest(grid, p.lr)][p.seed] = p.loss
        if p.loss_init is not None:
            inits[p.variant].append(p.loss_init)
    loss_init = {n: _mean(v) for n, v in inits.items()}
    tuned = T.tuned_comparison(runs, base, loss_init, shared, alpha, reference)
    rows = []
    for n in names:
        t, test = tuned[n], tuned[n].tuned_delta
        top = max((p for p in points if p.variant == n), key=lambda p: p.lr)
        rows.append(GridRow(
            n, n == base if reference is None else reference[n] is None, t.best_lr, t.on_edge, t.n, t.loss,
            list(t.loss_ci) if t.loss_ci[0] is not None else None,
            test.test_delta if test else None,
            [test.ci_low, test.ci_high] if test and test.ci_low is not None else None,
            test.p_value if test else None, test.t if test else None, test.seeds_needed if test else None,
            test.seeds_needed_alpha if test else None, t.p_holm, t.verdict, shared, t.shared_delta,
            t.verdict_differs, t.lr_sensitivity, loss_init[n], top.max_attn_logit, top.lr,
            {f"{lr:g}": v for lr, v in T.grid_curve(runs[n]).items()}, crossing is not None))
    said = (f"baselines: {crossing.a.name(crossing.a.first)} at each level of {crossing.b.key}"
            if crossing is not None else f"baseline: {base}")
    title = (f"ablate compare: LR grid {', '.join(f'{x:g}' for x in grid)}; each variant at its "
             f"own best LR ({said})")
    notes = _grid_notes(rows, shared) + tied_note(record.tied_lrs)
    table = Table(title, grid_columns(shared, alpha), rows, notes=notes)
    report = Report(ReportKind.LR_GRID, table, points=list(points))
    if crossing is not None:
        from ablate.analysis.interaction import csv_column, interaction

        values = {cell_of[n]: tuned[n].values for n in names}
        report.interaction = interaction(values, crossing, VAL_LOSS, alpha, what=", each cell at its own best LR",
                                         said=table.notes)
        if report.interaction is not None:
            for row in rows:
                row.interaction = report.interaction.of(crossing.label(*cell_of[row.variant]))
            table.columns.append(csv_column())
        else:
            for row in rows:
                row.crossed = False
    return report


def tied_note(ratios: Mapping[str, Mapping[str, float]]) -> list[str]:
    """One line per variant whose other LRs moved with train.lr (transfer.json's `tied_lrs`,
    ablate/sweep/transfer_plan.py): the sweep's header and compare's notes say it."""
    return [f"{variant}: {', '.join(f'{k} = {r:.4g} x train.lr' for k, r in tied.items())} at every LR "
            "(optim.adjust=original: train.lr is Muon's, optim.adam_lr the AdamW part's)"
            for variant, tied in ratios.items()]


def _grid_notes(rows: list[GridRow], shared: float) -> list[str]:
    """What to read beside an LR grid's table: best LRs on the edge, a shared LR that tells
    another story, a tuned Δ that one seed cannot give, no loss at initialisation."""
    notes = []
    for row in rows:
        if row.best_lr_on_edge:
            notes.append(f"{row.variant}: the best LR {row.best_lr:g} is on the grid's edge; widen the grid")
        if row.verdict_differs:
            notes.append(f"{row.variant}: the verdict at the shared LR {shared:g} differs from the "
                         "tuned one (each variant at its own best LR)")
    untested = [r for r in rows if not r.baseline and r.tuned_delta is None and r.best_lr is not None]
    if untested and rows[0].best_lr is not None:
        counts = ", ".join(f"{r.variant} {r.n}" for r in untested + rows[:1])
        notes.append(f"tuned Δ - for {', '.join(r.variant for r in untested)}: the tuned test pairs each "
                     "variant's seeds at its own best LR with the baseline's at its own and needs at least "
                     f"2 seeds a side (here {counts}); the Δ at LR {shared:g} is the paired difference of "
                     "the seeds there, untested: run the grid with --seeds 2 or more")
    if any(r.lr_sensitivity is None for r in rows):
        notes.append("no evaluation at step 0 in some runs (train.eval_every=0): LR sensitivity needs "
                     "the loss at initialisation")
    notes.append(f"tuned Δ: each variant at its own best LR vs the baseline at its own; shared Δ: "
                 f"both at LR {shared:g} (seed 0 of the grid unless more seeds ran there)")
    return notes


def _loss_ci(r: GridRow, sep: str = " ") -> str:
    if r.loss is None:
        return "-"
    return f"{r.loss:.4f}" + (f"{sep}[{r.loss_ci[0]:.4f}, {r.loss_ci[1]:.4f}]" if r.loss_ci else "")


def _tuned(r: GridRow) -> str:
    """The tuned Δ, its CI on the line below."""
    return num(r.tuned_delta, "+.4f") + (f"\n{_ci(r.tuned_delta_ci)}" if r.tuned_delta_ci else "")


def grid_columns(shared: float, alpha: float = ALPHA) -> list[Column]:
    pct = f"{100 * (1 - alpha):g}% CI"
    return [
        Column("variant", lambda r: r.variant, ("variant",), align=Align.LEFT),
        Column("best LR", lambda r: _lr(r.best_lr), ("best_lr",)),
        Column(f"loss at best LR [{pct}]", _loss_ci, ("loss", "loss_ci"), short=f"loss at best LR\n[{pct}]",
               compact=lambda r: _loss_ci(r, "\n")),
        Column("tuned Δ", lambda r: num(r.tuned_delta, "+.4f"), ("tuned_delta",), targets=ONLY_TEXT),
        Column(pct, lambda r: _ci(r.tuned_delta_ci), ("tuned_delta_ci",), targets=ONLY_TEXT),
        Column(f"tuned Δ [{pct}]", _tuned, short=f"tuned Δ\n[{pct}]", targets=ONLY_TERMINAL),
        Column("Holm p", lambda r: num(r.tuned_p_holm, ".3g"), ("tuned_p_holm",), priority=1),
        Column("verdict", lambda r: r.tuned_verdict or "-", ("tuned_verdict",)),
        Column(f"Δ at LR {shared:g}", lambda r: num(r.shared_delta, "+.4f"), ("shared_delta",),
               short=f"Δ at LR\n{shared:g}", priority=2),
        Column("LR sensitivity", lambda r: num(r.lr_sensitivity, ".4f"), ("lr_sensitivity",),
               short="LR\nsensitivity", priority=1),
        Column("max attn logit (top LR)", lambda r: num(r.max_attn_logit, ".1f"), ("max_attn_logit",),
               short="max attn logit\n(top LR)", priority=3),
    ]


# ---- the ladder ---------------------------------------------------------------------------------
@dataclass
class RungResult(JsonRow):
    """A variant at one rung (its `rungs` entry in --json)."""

    rung: str
    compute: Optional[float]
    n: int
    mean: Optional[float]
    std: Optional[float]
    delta: Optional[float]
    delta_ci: Optional[list]
    beyond_noise: Optional[bool]  # the Δ's interval excludes 0
    compute_multiplier: Optional[float]
    compute_multiplier_ci: Optional[list]
    compute_multiplier_extrapolated: Optional[bool]
    best_lr: Optional[float] = None  # a ladder with an LR scan per rung (--lr-grid) only
    best_lr_on_edge: Optional[bool] = None

    def as_dict(self) -> dict:
        d = asdict(self)
        if self.best_lr_on_edge is None:  # no scan: no such keys
            del d["best_lr"], d["best_lr_on_edge"]
        return d


@dataclass
class LadderRow(JsonRow):
    """One variant of a ladder, each field a public --json key (docs/transfer.md)."""

    variant: str
    baseline: bool
    rungs: list[RungResult]
    compute_multiplier: Optional[float]
    compute_multiplier_ci: Optional[list]
    target_compute: Optional[float]
    delta_at_target: Optional[float]
    delta_at_target_ci: Optional[list]
    projection_seeds: Optional[int]
    wins_every_rung: Optional[bool]
    wins_beyond_noise: Optional[int]
    fit: Any  # transfer.PowerLaw (l_inf, a, alpha) of the variant's curve; None without a fit
    ranks: list = field(default_factory=list)  # by mean loss at each rung, 1: lowest
    rank_agreement: Optional[float] = None
    # grid steps from the smallest rung's best LR to the largest's (negative: smaller at the
    # largest); a ladder with an LR scan per rung only (None there without both best LRs)
    lr_steps_moved: Optional[int] = None
    scanned: bool = False  # the ladder ran an LR grid: lr_steps_moved is one of its keys

    def as_dict(self) -> dict:
        d = asdict(self)
        d["rungs"] = [r.as_dict() for r in self.rungs]
        if not d.pop("scanned"):
            del d["lr_steps_moved"]
        return d


def ladder_report(points: Sequence[Point], record: TransferRecord, baseline: Optional[str] = None,
                  alpha: float = ALPHA) -> Report:
    names, base = _by_variant(points, baseline)
    rungs = [r.name for r in record.rungs]
    best = _best_per_rung(points, record.grid, names, rungs) if record.grid else {}
    one_scan = record.one_scan
    if one_scan:  # every rung ran at its variant's pick of the smallest rung's scan
        best = {(n, r): best[n, rungs[0]] for n in names for r in rungs}
    if best:  # each variant on each rung at its own best LR there
        at = {cell: b.lr for cell, b in best.items() if b.lr is not None}
        points = [p for p in points if (p.variant, p.rung) in at
                  and math.isclose(p.lr, at[p.variant, p.rung], rel_tol=1e-6)]
    # per variant and rung: the losses by seed, and the baseline's compute at each rung
    losses = {n: [{p.seed: p.loss for p in points if p.variant == n and p.rung == r and p.loss is not None}
                  for r in rungs] for n in names}
    computes = [_mean([p.compute for p in points if p.variant == base and p.rung == r]) for r in rungs]
    notes: list[str] = []
    seeds = max((len(v) for n in names for v in losses[n]), default=0)
    fits, target = _fit(names, base, losses, computes, notes, seeds)
    rows = [_ladder_row(n, base, rungs, losses, computes, fits, target, alpha) for n in names]
    if best:
        _add_best_lrs(rows, best, notes, list(record.grid), one_scan, record.seeds)
    else:  # no LR scan: every variant judged at the LR it was given
        lrs = ", ".join(f"{lr:g}" for lr in sorted({p.lr for p in points if p.lr is not None}))
        notes.append(f"no LR grid: every variant ran at the same learning rate on a rung ({lrs}), so a variant "
                     "whose own best LR differs is judged untuned there; --lr-grid LO:HI:N tunes each "
                     "(docs/transfer.md)")
    for row in rows:
        beyond = [r.rung for r in row.rungs if r.compute_multiplier_extrapolated]
        if beyond:
            notes.append(f"{row.variant}: x at {', '.join(beyond)} lies beyond the baseline's measured "
                         "losses, so it is read off the baseline's fitted curve (an extrapolation)")
    notes += [n for row in rows if (n := _tokens_check(row, record.ladder.tokens_per_param))]
    _rank(rows, losses, names, rungs, notes)
    notes += tied_note(record.tied_lrs)
    title = (f"ablate compare: ladder {record.ladder.name} ({', '.join(rungs)}); "
             f"x = compute multiplier vs the baseline (baseline: {base})")
    table = Table(title, ladder_columns(rungs, bool(best), alpha, moved=bool(best) and not one_scan), rows,
                  notes=notes)
    return Report(ReportKind.LADDER, table, points=list(points), ladder=LadderFit(fits, target, computes, rungs))


def _fit(names: list, base: str, losses: dict, computes: list, notes: list,
         seeds: int = 2) -> tuple[dict, Optional[float]]:
    """Each variant's L(C) with one shared L_inf, and the projected compute (10x the largest
    rung's); none with fewer than MIN_RUNGS rungs finished by every variant."""
    import ablate.analysis.transfer_stats as T

    rungs = len(computes)
    if not (rungs >= MIN_RUNGS and all(c is not None for c in computes)
            and all(all(len(v) for v in losses[n]) for n in names)):
        notes.append(f"fewer than {MIN_RUNGS} rungs with a finished run of every variant: the rung table "
                     "only, no fit and no projection")
        return {}, None
    target = 10 * computes[-1]
    fits = T.fit_power_laws({n: (computes, [_mean(list(v.values())) for v in losses[n]]) for n in names})
    notes.append(f"L(C) = L_inf + A*C^-alpha fitted per variant with one L_inf shared by all "
                 f"(L_inf={fits[base].l_inf:.3f}): {rungs} rungs cannot pin a free L_inf each; "
                 f"projection at {target:.3g} FLOPs (10x the largest rung); " +
                 ("CIs: each rung's Δ t-interval mapped through the baseline's curve, the projection's a "
                  "t-interval over the seeds' own fits (df = seeds - 1)" if seeds >= 2 else
                  "no CIs: one seed a rung (--seeds 2 or more for intervals)"))
    return fits, target


def _ladder_row(n: str, base: str, rungs: list, losses: dict, computes: list, fits: dict,
                target: Optional[float], alpha: float) -> LadderRow:
    """One variant's ladder row: per rung its loss, its delta and multiplier vs the baseline,
    each multiplier's interval its delta's (transfer.multiplier_ci)."""
    import ablate.analysis.transfer_stats as T

    mult = None
    if fits and n != base:
        mult = T.multiplier_ci({k: losses[k] for k in (base, n)}, computes, base, n, target=target, alpha=alpha)
    base_means = [_mean(list(v.values())) for v in losses[base]]
    per_rung = []
    for i, r in enumerate(rungs):
        vals = losses[n][i]
        mean, std = mean_std(list(vals.values()))
        test = seed_test(losses[base][i], vals, alpha) if n != base else None
        ci = [test.ci_low, test.ci_high] if test and test.ci_low is not None else None
        delta = (mean - base_means[i]) if n != base and mean is not None and losses[base][i] else None
        per_rung.append(RungResult(
            r, computes[i], len(vals), mean, std, delta, ci, None if ci is None else not ci[0] <= 0 <= ci[1],
            mult.per_rung[i] if mult else None, _interval(mult.per_rung_ci[i]) if mult else None,
            _outside(mean, base_means) if mult else None))
    means = [x.mean for x in per_rung]
    return LadderRow(
        n, n == base, per_rung, mult.at_target if mult else None, _interval(mult.ci) if mult else None, target,
        mult.delta_at_target if mult else None, _interval(mult.delta_at_target_ci) if mult else None,
        mult.seeds if mult else None,
        T.wins_every_rung(base_means, means) if n != base and None not in means + base_means else None,
        _wins_beyond_noise(per_rung) if n != base else None, fits.get(n), [None] * len(rungs))


def _wins_beyond_noise(per_rung: list[RungResult]) -> Optional[int]:
    """The rungs where the variant's Δ interval lies below 0 (None: no rung has an interval)."""
    cis = [r.delta_ci for r in per_rung if r.delta_ci is not None]
    return sum(hi < 0 for _, hi in cis) if cis else None


def _tokens_check(row: LadderRow, base_tokens: float) -> Optional[str]:
    """A variant that is only the baseline on k times its tokens per parameter: on a
    compute-optimal ladder its multiplier is k on every rung. Where each rung's is, and what that
    says of the ladder's tokens per parameter there."""
    key, _, value = row.variant.lstrip("+").partition("=")
    try:
        k = float(value) / float(base_tokens) if key == LADDER_TOKENS_KEY and "," not in value else None
    except (TypeError, ValueError, ZeroDivisionError):
        k = None
    if not k or k == 1 or all(r.compute_multiplier is None for r in row.rungs):
        return None
    cells = []
    for r in row.rungs:
        x, ci = r.compute_multiplier, r.compute_multiplier_ci
        if x is None:
            cells.append(f"{r.rung} -")
            continue
        lo, hi = ci or (x, x)
        cells.append(f"{r.rung} {_mult(x)}" + (f" {_mult_ci(ci)}" if ci else "")
                     + (f" holds {k:g}" if lo <= k <= hi else " above" if lo > k else " below"))
    return (f"{row.variant} is the baseline on {k:g}x its tokens: on a compute-optimal ladder x is {k:g} "
            f"on every rung; here {', '.join(cells)}" + ("" if any(r.compute_multiplier_ci for r in row.rungs)
                                                      else " (one seed: no interval)")
            + f". Above {k:g}: {base_tokens:g} tokens per parameter are too few at that rung; below: too many")


def _interval(ci: tuple) -> Optional[list]:
    return None if ci[0] is None else list(ci)


def _outside(loss: Optional[float], base_means: Sequence[Optional[float]]) -> Optional[bool]:
    """Whether `loss` lies outside the baseline's measured losses, so that the baseline's compute
    for it is read off its fitted curve beyond its rungs (a variant that wins at the largest rung
    always is)."""
    known = [m for m in base_means if m is not None]
    return None if loss is None or not known else not min(known) <= loss <= max(known)


def _best_per_rung(points: Sequence[Point], grid: Sequence[float], names: list, rungs: list) -> dict:
    """(variant, rung) -> T.BestLR of its LR scan (the seeds present at every grid LR)."""
    import ablate.analysis.transfer_stats as T

    grid = [float(x) for x in grid]
    cells: dict = {(n, r): {lr: {} for lr in grid} for n in names for r in rungs}
    for p in points:
        if (p.variant, p.rung) in cells:
            cells[p.variant, p.rung][_nearest(grid, p.lr)][p.seed] = p.loss
    return {cell: T.best_lr(T.grid_curve(runs)) for cell, runs in cells.items()}


def _add_best_lrs(rows: list[LadderRow], best: dict, notes: list, grid: list, one_scan: bool,
                  seeds: int) -> None:
    """Each row's best LR on each rung and how many grid steps it moves from the smallest rung to
    the largest, a note where it is on the grid's edge (once a variant under one scan)."""
    for row in rows:
        for r in row.rungs:
            b = best[row.variant, r.rung]
            r.best_lr, r.best_lr_on_edge = b.lr, b.on_edge
            if b.on_edge and not (one_scan and r is not row.rungs[0]):
                notes.append(f"{row.variant} at {r.rung}: the best LR {b.lr:g} is on the grid's "
                             "edge; widen the grid")
        row.scanned = True
        row.lr_steps_moved = None if one_scan else lr_steps_moved(grid, row.rungs[0].best_lr, row.rungs[-1].best_lr)
    first, last = rows[0].rungs[0].rung, rows[0].rungs[-1].rung
    if one_scan:
        notes.append(f"lr_rule mup: one LR scan, at {first}; every rung ran at each variant's best LR "
                     f"there, so the LR shown on every rung is that one pick (the parametrization "
                     "scales the rest), not a best LR of the rung")
        return
    notes.append("each variant on each rung at its own best LR of the grid" +
                 (" (seeds 1.. ran there)" if seeds > 1 else ", seed 0 only"))
    notes.append(f"LR moved: grid steps (x{grid[1] / grid[0]:.3g} each) from the best LR at {first} to "
                 f"the best at {last}; negative: a smaller LR at {last}")


def lr_steps_moved(grid: Sequence[float], small: Optional[float], large: Optional[float]) -> Optional[int]:
    """Grid steps from `small` (the smallest rung's best LR) to `large` (the largest's); None
    without both."""
    if small is None or large is None:
        return None
    step = {lr: i for i, lr in enumerate(sorted(grid))}
    return step[_nearest(grid, large)] - step[_nearest(grid, small)]


def _rank(rows: list[LadderRow], losses: dict, names: list[str], rungs: list, notes: list) -> None:
    """Each row's rank by mean loss at each rung (1: the lowest) and the rank agreement between
    the smallest and the largest rung (3 or more variants), with its note."""
    from ablate.analysis.transfer_stats import rank_agreement

    agreement = None
    if len(names) >= 3:  # two variants: one ordering, said by wins_every_rung
        first = {n: _mean(list(losses[n][0].values())) for n in names}
        last = {n: _mean(list(losses[n][-1].values())) for n in names}
        agreement = rank_agreement({k: v for k, v in first.items() if v is not None},
                                   {k: v for k, v in last.items() if v is not None})
    if agreement is not None:
        notes.append(f"rank agreement: {agreement:.0%} of the pairwise orderings at {rungs[0]} hold at {rungs[-1]}")
    for i in range(len(rungs)):
        order = sorted((r for r in rows if r.rungs[i].mean is not None), key=lambda r: r.rungs[i].mean)
        for k, r in enumerate(order, 1):
            r.ranks[i] = k
    for r in rows:
        r.rank_agreement = agreement


# ---- the ladder's columns -----------------------------------------------------------------------
def _mult(v: Optional[float]) -> str:
    """A compute multiplier: two decimals, or two significant digits where two decimals would
    lose the value (0.0011 as 0.00) or run to many digits (3.5e+07: the ends of a wide interval)."""
    if v is None:
        return "-"
    return f"{v:.2g}" if v >= 1000 or 0 < v < 0.1 else f"{v:.2f}"


def _mult_ci(v: Optional[Sequence[float]]) -> str:
    """A multiplier interval; an upper end the baseline's curve never reaches: ∞."""
    if v is None:
        return "-"
    return f"[{_mult(v[0])}, " + ("∞]" if math.isinf(v[1]) else f"{_mult(v[1])}]")


@dataclass(frozen=True)
class Quantity:
    """One figure of a variant at a rung: its label, its csv name (`{key}_{rung}`), its raw value
    and how it reads."""

    label: str
    key: str
    raw: Callable[[RungResult], Any]
    show: Callable[[Any], str]

    def cell(self, rung: RungResult) -> str:
        return self.show(self.raw(rung))


LR_AT = Quantity("LR", LR, lambda x: x.best_lr, _lr)
LOSS_AT = Quantity("loss", "loss", lambda x: x.mean, lambda v: num(v, ".4f"))
DELTA_AT = Quantity("Δ", "delta", lambda x: x.delta, lambda v: num(v, "+.4f"))
X_AT = Quantity("x", "mult", lambda x: x.compute_multiplier, _mult)


def _signed(steps: Optional[int]) -> str:
    return "-" if steps is None else f"{steps:+d}" if steps else "0"


def _wins(r: LadderRow, rungs: int, compact: bool = False) -> str:
    """yes/no, and on how many rungs the win is beyond seed noise."""
    if r.wins_every_rung is None:
        return "-"
    if not r.wins_every_rung:
        return "no"
    why = ("no interval:", "one seed") if r.wins_beyond_noise is None else \
        ("beyond noise", f"on {r.wins_beyond_noise} of {rungs}")
    return lines("yes", *why) if compact else f"yes ({' '.join(why)})"


def ladder_columns(rungs: list[str], scan: bool, alpha: float = ALPHA, moved: bool = False) -> list[Column]:
    """Markdown, LaTeX and csv: a column per figure and rung (LR r0, loss r0, ..., x r2). The
    terminal: a column per rung whose lines are the row's figures there, labelled on the left.
    moved: the LR steps moved column (a scan per rung)."""
    pct = f"{100 * (1 - alpha):g}% CI"
    figures = ([LR_AT] if scan else []) + [LOSS_AT, DELTA_AT, X_AT]
    x_ci = Quantity(f"x {pct}", "", lambda x: x.compute_multiplier_ci, _mult_ci)

    def plan(row: LadderRow) -> list[Quantity]:  # the row's lines on the terminal
        said = [LR_AT] if scan else []
        if row.baseline:
            return said + [LOSS_AT]
        with_ci = any(x.compute_multiplier_ci for x in row.rungs) or row.compute_multiplier_ci
        return said + [LOSS_AT, DELTA_AT, X_AT] + ([x_ci] if with_ci else [])

    def projected(row: LadderRow) -> str:
        at = {X_AT: _mult(row.compute_multiplier), x_ci: _mult_ci(row.compute_multiplier_ci)}
        return "" if row.baseline else lines(*[at.get(q, "") for q in plan(row)])

    cols = [Column("variant", lambda r: r.variant, ("variant",), align=Align.LEFT),
            Column("", lambda r: lines(*[q.label for q in plan(r)]), align=Align.LEFT, targets=ONLY_TERMINAL)]
    cols += [Column(f"{q.label} {name}", (lambda r, i=i, q=q: q.cell(r.rungs[i])),
                    (Field(f"{q.key}_{name}", lambda r, i=i, q=q: q.raw(r.rungs[i])),), targets=ONLY_TEXT)
             for q in figures for i, name in enumerate(rungs)]
    cols += [Column(name, (lambda r, i=i: lines(*[q.cell(r.rungs[i]) for q in plan(r)])), targets=ONLY_TERMINAL)
             for i, name in enumerate(rungs)]
    if moved:
        cols.append(Column(f"LR moved {rungs[0]}→{rungs[-1]}", lambda r: _signed(r.lr_steps_moved),
                           ("lr_steps_moved",), short=f"LR moved\n{rungs[0]}→{rungs[-1]}"))
    return cols + [
        Column("x projected", lambda r: _mult(r.compute_multiplier), ("compute_multiplier",), targets=ONLY_TEXT),
        Column(pct, lambda r: _mult_ci(r.compute_multiplier_ci), ("compute_multiplier_ci",), targets=ONLY_TEXT),
        Column("x projected", projected, targets=ONLY_TERMINAL, short="x\nprojected", priority=1),
        Column("wins every rung", lambda r: _wins(r, len(rungs)), ("wins_every_rung", "wins_beyond_noise"),
               compact=lambda r: _wins(r, len(rungs), compact=True), short="wins\nevery rung", priority=2)]


def transfer_compare(runs: Sequence[Run], record: TransferRecord, baseline: Optional[str] = None,
                     alpha: float = ALPHA, crossing: Any = None) -> Report:
    """The report of an LR grid (two crossed axes: crossing.Crossing) or a ladder sweep."""
    points = to_points(runs, record)
    if record.kind is TransferKind.LR_GRID:
        if crossing is not None and baseline:
            crossing.rebase_to(baseline, runs)
        return lr_grid_report(points, record, baseline, alpha, crossing)
    return ladder_report(points, record, baseline, alpha)
