"""`ablate compare` of an --lr-grid or a --ladder sweep (its sweep directory holds transfer.json,
ablate/sweep/transfer.py): one row per variant with the public keys of `compare --json`.

LR grid: best_lr (and best_lr_on_edge), the loss at the best LR with its CI, tuned_delta vs
the baseline at *its* best LR (paired t over seeds, Holm over variants), shared_delta at the
config's LR, verdict_differs, lr_sensitivity (Wortsman et al. 2023), max_attn_logit at the
highest LR (runs with train.diagnostics_every).
Ladder: per rung the loss, the delta vs the baseline and the compute multiplier; fitted
L(C) = L_inf + A * C^-alpha with one shared L_inf; compute_multiplier and
compute_multiplier_ci at a projected compute, each interval its delta's (transfer.multiplier_ci);
wins_every_rung and on how many rungs beyond noise (wins_beyond_noise); rank_agreement between
the smallest and the largest rung. Compute is FLOPs/token (as `inspect` counts) x tokens trained.
A ladder with an LR grid: each variant on each rung at its own best LR there (best_lr per rung).
The statistics are ablate/analysis/transfer.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from ablate.analysis.load import CompareError, Run, number
from ablate.analysis.stats import ALPHA, mean_std, seed_test
from ablate.vocab import LADDER_TOKENS_KEY

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
        if row.get("step") == 0 and "val_loss" in row:
            return number(row["val_loss"])
    return None


def _max_logit(run: Run) -> Optional[float]:
    vals = [number(v) for row in run.rows for k, v in row.items() if k.startswith("diag/max_attn_logit")]
    vals = [v for v in vals if v is not None and math.isfinite(v)]
    return max(vals) if vals else None


def _rung_of(run: Run, rungs: Sequence[dict]) -> Optional[str]:
    for r in rungs:
        if (run.config.get("model.d_model"), run.config.get("model.n_layers")) == (r["d_model"], r["n_layers"]):
            return r["name"]
    return None


def to_points(runs: Sequence[Run], record: dict) -> list[Point]:
    out = []
    for r in runs:
        loss = r.value("val_loss") if r.status == "completed" else None
        fpt, tokens = number(r.summary.get("flops_per_token")), number(r.summary.get("tokens"))
        out.append(Point(str(r.summary.get("variant") or r.dir.name), r.summary.get("seed"),
                         float(r.config.get("train.lr") or number(r.summary.get("lr")) or 0.0),
                         _rung_of(r, record.get("rungs") or []),
                         loss if loss is not None and math.isfinite(loss) else None, _first_val(r),
                         fpt * tokens if fpt and tokens else None, _max_logit(r), str(r.dir)))
    return out


def find_transfer(paths: Sequence[Path | str]) -> bool:
    """Whether a given path is, holds or lies in an --lr-grid or --ladder sweep (transfer.json)."""
    from ablate.rundir import TRANSFER

    for p in map(Path, paths):
        p = p.resolve()
        if any((d / TRANSFER).is_file() for d in (p, *p.parents)) or (p.is_dir() and any(p.rglob(TRANSFER))):
            return True
    return False


def transfer_record(runs: Sequence[Run]) -> Optional[dict]:
    """The transfer.json of the runs' sweep, None for ordinary runs; runs of several grids or
    ladders, or such runs mixed with others, are refused."""
    from ablate.rundir import read_transfer

    records = {r.dir.parent: read_transfer(r.dir.parent) for r in runs}
    kinds = {json_key(v) for v in records.values()}
    if kinds == {json_key(None)}:
        return None
    if len(kinds) > 1:
        what = ", ".join(sorted({str(d) for d, v in records.items() if v is not None}))
        raise CompareError(f"these runs mix sweeps of different LR grids or ladders (or such a sweep "
                           f"with other runs): {what}; compare one such sweep at a time")
    return next(iter(records.values()))


def json_key(v: Any) -> str:
    import json

    return json.dumps(v, sort_keys=True)


@dataclass
class Report:
    """What compare prints for such a sweep: `rows` are the --json objects; `columns` (header,
    row key, cell formatter) feed the table, markdown, LaTeX and csv alike."""

    kind: str
    title: str
    rows: list[dict]
    columns: list[tuple]
    notes: list[str] = field(default_factory=list)
    points: list[Point] = field(default_factory=list)
    extra: dict = field(default_factory=dict)  # the ladder's fits and target, for the plot


def _keys(key) -> tuple:
    return key if isinstance(key, tuple) else (key,)


def cell(row: dict, key, fmt) -> str:
    """A cell: the row's value at `key` (a tuple of keys: their values, for one cell that shows
    several, e.g. a mean and its CI) through `fmt` (a format spec or a function)."""
    v = tuple(row.get(k) for k in key) if isinstance(key, tuple) else row.get(key)
    if v is None or (isinstance(v, tuple) and v[0] is None):
        return "-"
    return fmt(v) if callable(fmt) else format(v, fmt)


def plain_table(report: Report) -> tuple[list[str], list[list[str]]]:
    return ([c[0] for c in report.columns],
            [[cell(r, c[1], c[2]) for c in report.columns] for r in report.rows])


def render(report: Report, fmt: str) -> str:
    """table (aligned plain text), markdown, latex or csv of the report's columns."""
    import csv
    import io

    from ablate.analysis.render import _tex

    heads, cells = plain_table(report)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        keys = [k for c in report.columns for k in _keys(c[1])]
        w.writerow(keys)
        for r in report.rows:
            w.writerow(["" if r.get(k) is None else r.get(k) for k in keys])
        return buf.getvalue()
    if fmt == "markdown":
        lines = ["| " + " | ".join(heads) + " |", "|" + "|".join(["---"] + ["--:"] * (len(heads) - 1)) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in cells]
        return "\n".join(lines + [f"- note: {n}" for n in report.notes]) + "\n"
    if fmt == "latex":
        lines = [r"\begin{tabular}{l" + "r" * (len(heads) - 1) + "}", r"\toprule",
                 " & ".join(map(_tex, heads)) + r" \\", r"\midrule"]
        lines += [" & ".join(map(_tex, row)) + r" \\" for row in cells]
        return "\n".join(lines + [r"\bottomrule", r"\end{tabular}"] + [f"% note: {n}" for n in report.notes]) + "\n"
    widths = [max(len(x) for x in col) for col in zip(heads, *cells)]
    line = lambda row: "  ".join(x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in enumerate(zip(row, widths)))
    out = [report.title, line(heads)] + [line(row) for row in cells]
    return "\n".join(out + [f"note: {n}" for n in report.notes]) + "\n"


# ---- the LR grid --------------------------------------------------------------------------------
def _by_variant(points: Sequence[Point], baseline: Optional[str]) -> tuple[list[str], str]:
    names = list(dict.fromkeys(p.variant for p in points))
    base = baseline or ("baseline" if "baseline" in names else names[0])
    if base not in names:
        raise CompareError(f"--baseline {base}: no such variant; variants: {', '.join(names)}")
    return [base] + [n for n in names if n != base], base


def lr_grid_report(points: Sequence[Point], record: dict, baseline: Optional[str] = None,
                   alpha: float = ALPHA) -> Report:
    from ablate.analysis import transfer as T

    names, base = _by_variant(points, baseline)
    grid = [float(x) for x in record["grid"]]
    shared = _nearest(grid, float(record.get("shared_lr") or grid[len(grid) // 2]))
    runs: dict = {n: {lr: {} for lr in grid} for n in names}
    inits: dict = {n: [] for n in names}
    for p in points:
        lr = _nearest(grid, p.lr)
        runs[p.variant][lr][p.seed] = p.loss
        if p.loss_init is not None:
            inits[p.variant].append(p.loss_init)
    loss_init = {n: sum(v) / len(v) if v else None for n, v in inits.items()}
    tuned = T.tuned_comparison(runs, base, loss_init, shared, alpha)
    rows = []
    for n in names:
        t, test = tuned[n], tuned[n].tuned_delta
        top = max((p for p in points if p.variant == n), key=lambda p: p.lr)
        rows.append({
            "variant": n, "baseline": n == base, "best_lr": t.best_lr, "best_lr_on_edge": t.on_edge,
            "n": t.n, "loss": t.loss, "loss_ci": list(t.loss_ci) if t.loss_ci[0] is not None else None,
            "tuned_delta": test.test_delta if test else None,
            "tuned_delta_ci": [test.ci_low, test.ci_high] if test and test.ci_low is not None else None,
            "tuned_p": test.p_value if test else None, "tuned_t": test.t if test else None,
            "seeds_needed": test.seeds_needed if test else None,
            "seeds_needed_alpha": test.seeds_needed_alpha if test else None,
            "tuned_p_holm": t.p_holm, "tuned_verdict": t.verdict,
            "shared_lr": shared, "shared_delta": t.shared_delta, "verdict_differs": t.verdict_differs,
            "lr_sensitivity": t.lr_sensitivity, "loss_init": loss_init[n],
            "max_attn_logit": top.max_attn_logit, "max_attn_logit_lr": top.lr,
            "curve": {f"{lr:g}": v for lr, v in T.grid_curve(runs[n]).items()},
        })
    notes = _grid_notes(rows, shared)
    pct = f"{100 * (1 - alpha):g}% CI"
    columns = [("variant", "variant", str), ("best LR", "best_lr", _lr_cell),
               (f"loss at best LR [{pct}]", ("loss", "loss_ci"), _mean_ci_cell), ("tuned Δ", "tuned_delta", "+.4f"),
               (pct, "tuned_delta_ci", _ci), ("Holm p", "tuned_p_holm", ".3g"),
               ("verdict", "tuned_verdict", str), (f"Δ at LR {shared:g}", "shared_delta", "+.4f"),
               ("LR sensitivity", "lr_sensitivity", ".4f"),
               ("max attn logit (top LR)", "max_attn_logit", ".1f")]
    title = (f"ablate compare: LR grid {', '.join(f'{x:g}' for x in grid)}; each variant at its "
             f"own best LR (baseline: {base})")
    return Report("lr_grid", title, rows, columns, notes, list(points))


def _grid_notes(rows: list[dict], shared: float) -> list[str]:
    """What to read beside an LR grid's table: best LRs on the edge, a shared LR that tells
    another story, a tuned Δ that one seed cannot give, no loss at initialisation."""
    notes = []
    for row in rows:
        if row["best_lr_on_edge"]:
            notes.append(f"{row['variant']}: the best LR {row['best_lr']:g} is on the grid's edge; "
                         "widen the grid")
        if row["verdict_differs"]:
            notes.append(f"{row['variant']}: the verdict at the shared LR {shared:g} differs from the "
                         "tuned one (each variant at its own best LR)")
    untested = [r for r in rows[1:] if r["tuned_delta"] is None and r["best_lr"] is not None]
    if untested and rows[0]["best_lr"] is not None:
        counts = ", ".join(f"{r['variant']} {r['n']}" for r in untested + rows[:1])
        notes.append(f"tuned Δ - for {', '.join(r['variant'] for r in untested)}: the tuned test pairs each "
                     "variant's seeds at its own best LR with the baseline's at its own and needs at least "
                     f"2 seeds a side (here {counts}); the Δ at LR {shared:g} is the paired difference of "
                     "the seeds there, untested: run the grid with --seeds 2 or more")
    if any(r["lr_sensitivity"] is None for r in rows):
        notes.append("no evaluation at step 0 in some runs (train.eval_every=0): LR sensitivity needs "
                     "the loss at initialisation")
    notes.append(f"tuned Δ: each variant at its own best LR vs the baseline at its own; shared Δ: "
                 f"both at LR {shared:g} (seed 0 of the grid unless more seeds ran there)")
    return notes


def _mean_ci_cell(v: tuple) -> str:
    mean, ci = v
    return f"{mean:.4f}" + (f" [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "")


def _lr_cell(v: float) -> str:
    return f"{v:g}"


def _ci(v: Sequence[float]) -> str:
    return f"[{v[0]:+.4f}, {v[1]:+.4f}]"


def _nearest(grid: Sequence[float], lr: float) -> float:
    return min(grid, key=lambda x: abs(math.log(x / lr)))


# ---- the ladder ---------------------------------------------------------------------------------
def ladder_report(points: Sequence[Point], record: dict, baseline: Optional[str] = None,
                  alpha: float = ALPHA) -> Report:
    from ablate.analysis import transfer as T

    names, base = _by_variant(points, baseline)
    rungs = [r["name"] for r in record["rungs"]]
    best = _best_per_rung(points, record["grid"], names, rungs) if record.get("grid") else {}
    if best:  # a scan per rung: each variant on each rung at its own best LR there
        at = {cell: b.lr for cell, b in best.items() if b.lr is not None}
        points = [p for p in points if (p.variant, p.rung) in at
                  and math.isclose(p.lr, at[p.variant, p.rung], rel_tol=1e-6)]
    # per variant and rung: the losses by seed, and the baseline's compute at each rung
    losses = {n: [{p.seed: p.loss for p in points if p.variant == n and p.rung == r and p.loss is not None}
                  for r in rungs] for n in names}
    computes = [_mean([p.compute for p in points if p.variant == base and p.rung == r]) for r in rungs]
    notes: list[str] = []
    fits, target = {}, None
    fit_ok = len(rungs) >= MIN_RUNGS and all(c is not None for c in computes) and \
        all(all(len(v) for v in losses[n]) for n in names)
    if fit_ok:
        target = 10 * computes[-1]
        fits = T.fit_power_laws({n: (computes, [_mean(list(v.values())) for v in losses[n]]) for n in names})
        notes.append(f"L(C) = L_inf + A*C^-alpha fitted per variant with one L_inf shared by all "
                     f"(L_inf={fits[base].l_inf:.3f}): {len(rungs)} rungs cannot pin a free L_inf each; "
                     f"projection at {target:.3g} FLOPs (10x the largest rung); CIs: each rung's Δ t-interval "
                     f"mapped through the baseline's curve, the projection's a t-interval over the "
                     f"seeds' own fits (df = seeds - 1)")
    else:
        notes.append(f"fewer than {MIN_RUNGS} rungs with a finished run of every variant: the rung table "
                     "only, no fit and no projection")
    rows = [_ladder_row(n, base, rungs, losses, computes, fits, target, alpha) for n in names]
    lr_columns = _add_best_lrs(rows, best, rungs, notes) if best else []
    for row in rows:
        beyond = [r["rung"] for r in row["rungs"] if r["compute_multiplier_extrapolated"]]
        if beyond:
            notes.append(f"{row['variant']}: x at {', '.join(beyond)} lies beyond the baseline's measured "
                         "losses, so it is read off the baseline's fitted curve (an extrapolation)")
    notes += [n for row in rows if (n := _tokens_check(row, record["ladder"]["tokens_per_param"]))]
    agreement = _rank_agreement(losses, names)
    if agreement is not None:
        notes.append(f"rank agreement: {agreement:.0%} of the pairwise orderings at {rungs[0]} hold at {rungs[-1]}")
    for i, rung in enumerate(rungs):  # 1 = the lowest mean loss at that rung
        order = sorted((r for r in rows if r[f"loss_{rung}"] is not None), key=lambda r: r[f"loss_{rung}"])
        for k, r in enumerate(order, 1):
            r.setdefault("ranks", [None] * len(rungs))[i] = k
    for r in rows:
        r.setdefault("ranks", [None] * len(rungs))
        r["rank_agreement"] = agreement
    columns = ([("variant", "variant", str)] + lr_columns + [(f"loss {r}", f"loss_{r}", ".4f") for r in rungs]
               + [(f"Δ {r}", f"delta_{r}", "+.4f") for r in rungs]
               + [(f"x {r}", f"mult_{r}", ".2f") for r in rungs]
               + [("x projected", "compute_multiplier", ".2f"), ("95% CI", "compute_multiplier_ci", _mult_ci),
                  ("wins every rung", ("wins_every_rung", "wins_beyond_noise"), _wins(len(rungs)))])
    title = (f"ablate compare: ladder {record['ladder']['name']} ({', '.join(rungs)}); "
             f"x = compute multiplier vs the baseline (baseline: {base})")
    return Report("ladder", title, rows, columns, notes, list(points),
                  {"fits": fits, "target": target, "computes": computes, "rungs": rungs})


def _ladder_row(n: str, base: str, rungs: list, losses: dict, computes: list, fits: dict, target: Optional[float], alpha: float) -> dict:
    """One variant's ladder row: per rung its loss, its delta and multiplier vs the baseline,
    each multiplier's interval its delta's (transfer.multiplier_ci)."""
    from ablate.analysis import transfer as T

    per_rung, mult = [], None
    if fits and n != base:
        mult = T.multiplier_ci({k: losses[k] for k in (base, n)}, computes, base, n, target=target, alpha=alpha)
    base_means = [_mean(list(v.values())) for v in losses[base]]
    for i, r in enumerate(rungs):
        vals = losses[n][i]
        mean, std = mean_std(list(vals.values()))
        test = seed_test(losses[base][i], vals, alpha) if n != base else None
        ci = [test.ci_low, test.ci_high] if test and test.ci_low is not None else None
        per_rung.append({
            "rung": r, "compute": computes[i], "n": len(vals), "mean": mean, "std": std,
            "delta": (mean - _mean(list(losses[base][i].values()))) if n != base and mean is not None
            and losses[base][i] else None,
            "delta_ci": ci, "beyond_noise": None if ci is None else not ci[0] <= 0 <= ci[1],
            "compute_multiplier": mult.per_rung[i] if mult else None,
            "compute_multiplier_ci": _interval(mult.per_rung_ci[i]) if mult else None,
            "compute_multiplier_extrapolated": _outside(mean, base_means) if mult else None})
    means = [x["mean"] for x in per_rung]
    row = {"variant": n, "baseline": n == base, "rungs": per_rung,
           "compute_multiplier": mult.at_target if mult else None,
           "compute_multiplier_ci": _interval(mult.ci) if mult else None, "target_compute": target,
           "delta_at_target": mult.delta_at_target if mult else None,
           "delta_at_target_ci": _interval(mult.delta_at_target_ci) if mult else None,
           "projection_seeds": mult.seeds if mult else None,
           "wins_every_rung": (T.wins_every_rung(base_means, means)
                               if n != base and None not in means + base_means else None),
           "wins_beyond_noise": _wins_beyond_noise(per_rung) if n != base else None,
           "fit": ({"l_inf": fits[n].l_inf, "a": fits[n].a, "alpha": fits[n].alpha} if n in fits else None)}
    for r in per_rung:
        row[f"loss_{r['rung']}"], row[f"delta_{r['rung']}"] = r["mean"], r["delta"]
        row[f"mult_{r['rung']}"] = r["compute_multiplier"]
    return row


def _wins_beyond_noise(per_rung: list) -> Optional[int]:
    """The rungs where the variant's Δ interval lies below 0 (None: no rung has an interval)."""
    cis = [r["delta_ci"] for r in per_rung if r["delta_ci"] is not None]
    return sum(hi < 0 for _, hi in cis) if cis else None


def _tokens_check(row: dict, base_tokens: float) -> Optional[str]:
    """A variant that is only the baseline on k times its tokens per parameter: on a
    compute-optimal ladder its multiplier is k on every rung. Where each rung's is, and what that
    says of the ladder's tokens per parameter there."""
    key, _, value = row["variant"].lstrip("+").partition("=")
    try:
        k = float(value) / float(base_tokens) if key == LADDER_TOKENS_KEY and "," not in value else None
    except (TypeError, ValueError, ZeroDivisionError):
        k = None
    if not k or k == 1 or all(r["compute_multiplier"] is None for r in row["rungs"]):
        return None
    cells = []
    for r in row["rungs"]:
        x, ci = r["compute_multiplier"], r["compute_multiplier_ci"]
        if x is None:
            cells.append(f"{r['rung']} -")
            continue
        lo, hi = ci or (x, x)
        cells.append(f"{r['rung']} {x:.2f}" + (f" {_mult_ci(ci)}" if ci else "")
                     + (f" holds {k:g}" if lo <= k <= hi else " above" if lo > k else " below"))
    return (f"{row['variant']} is the baseline on {k:g}x its tokens: on a compute-optimal ladder x is {k:g} "
            f"on every rung; here {', '.join(cells)}" + ("" if any(r["compute_multiplier_ci"] for r in row["rungs"])
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
    from ablate.analysis import transfer as T

    grid = [float(x) for x in grid]
    cells: dict = {(n, r): {lr: {} for lr in grid} for n in names for r in rungs}
    for p in points:
        if (p.variant, p.rung) in cells:
            cells[p.variant, p.rung][_nearest(grid, p.lr)][p.seed] = p.loss
    return {cell: T.best_lr(T.grid_curve(runs)) for cell, runs in cells.items()}


def _add_best_lrs(rows: list[dict], best: dict, rungs: list, notes: list) -> list[tuple]:
    """Each row's best LR per rung (in `rungs` and as lr_<rung>); its columns."""
    for row in rows:
        for r in row["rungs"]:
            b = best[row["variant"], r["rung"]]
            r["best_lr"], r["best_lr_on_edge"] = b.lr, b.on_edge
            row[f"lr_{r['rung']}"] = b.lr
            if b.on_edge:
                notes.append(f"{row['variant']} at {r['rung']}: the best LR {b.lr:g} is on the grid's "
                             "edge; widen the grid")
    notes.append("each variant on each rung at its own best LR of the grid (seeds 1.. ran there)")
    return [(f"LR {r}", f"lr_{r}", _lr_cell) for r in rungs]


def _mean(values: Sequence[Optional[float]]) -> Optional[float]:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _mult_ci(v: Sequence[float]) -> str:
    """A multiplier interval; an upper end the baseline's curve never reaches: ∞."""
    return f"[{v[0]:.2f}, " + ("∞]" if math.isinf(v[1]) else f"{v[1]:.2f}]")


def _wins(rungs: int):
    """The wins-every-rung cell: yes/no, and on how many rungs the win is beyond seed noise."""
    def cell(v: tuple) -> str:
        wins, beyond = v
        if not wins:
            return "no"
        return "yes (no interval: one seed)" if beyond is None else f"yes (beyond noise on {beyond} of {rungs})"
    return cell


def _rank_agreement(losses: dict, names: list[str]) -> Optional[float]:
    from ablate.analysis.transfer import rank_agreement

    if len(names) < 3:
        return None  # two variants: one ordering, said by wins_every_rung
    first = {n: _mean(list(losses[n][0].values())) for n in names}
    last = {n: _mean(list(losses[n][-1].values())) for n in names}
    return rank_agreement({k: v for k, v in first.items() if v is not None},
                          {k: v for k, v in last.items() if v is not None})


def transfer_compare(runs: Sequence[Run], record: dict, baseline: Optional[str] = None,
                     alpha: float = ALPHA) -> Report:
    points = to_points(runs, record)
    if record.get("kind") == "lr_grid":
        return lr_grid_report(points, record, baseline, alpha)
    return ladder_report(points, record, baseline, alpha)
