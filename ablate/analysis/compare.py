"""`ablate compare`: group runs by variant and say which differences from the baseline are bigger
than seed noise, without claiming more than the seeds support.

A variant is a config minus its seeds (and minus keys that never name a variant); its runs are
the seeds. Runs that differ in anything but variant keys and keys a sweep among them swept are
refused (checks.mixed_settings), since their deltas would mix effects. The baseline is the
variant with no axis change, a study's first rung, or `baseline=`, with the reason kept.

A variant is tested against the baseline with a paired t-test over the seeds both completed when
there are at least two (same seed => same init and batches, so pairing removes shared noise; a
diverged seed leaves the pairing, and the row says how many seeds its mean covers), else Welch's
t-test; fewer than two seeds on either side gives no test (stats.seed_test). The p-values of all
variants are Holm-corrected, and the corrected p gives the verdict. A study sweep (`ablate sweep
study=...`) is a cumulative ladder: its rungs are shown in ladder order, each also against the
rung before it (Row.vs_prev; Holm over the rungs' steps), so each step's own gain is visible.
Two crossed axes (a --mode grid sweep, or --cross; ablate/analysis/crossing.py) stratify: each
cell is compared with A's baseline level at its own level of B, one baseline per level, and Holm
runs over every cell compared; the interaction of the two is ablate/analysis/interaction.py's.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ablate.analysis.comparable import describe_mixed, filter_runs, mixed_settings, resolve_metric
from ablate.analysis.crossing import Crossing, crossed_mixed
from ablate.analysis.groups import Group, label_groups, pick_baseline, study_ladder
from ablate.analysis.load import CompareError, Run, find_runs, number, print_warning
from ablate.analysis.stats import (ALPHA, MIN_SEEDS, NO_TEST, SeedTest, for_family, holm, mean_std, seed_test,
                                   verdict)
from ablate.tables.table import JsonRow
from ablate.measure.inspect import DTYPE_BYTES
from ablate.run.directory import CONFIG
from ablate.names import TOKENS_PER_S, VAL_LOSS, Status

SIZE_NOTE_PCT = 0.5  # a variant whose parameter count differs by more than this (%) is noted
SPEED_SPREAD = 1.5  # seeds' tokens/s whose max/min exceeds this are marked: they measured the machine


@dataclass
class Versus:
    """A variant against a reference (the baseline, or a study's previous rung): the difference
    of the means and the seed test; p_holm and the verdict come after Holm's correction over
    every variant compared with the same reference."""

    delta: Optional[float] = None
    delta_pct: Optional[float] = None
    test: SeedTest = NO_TEST
    few_seeds: bool = False
    p_holm: Optional[float] = None
    verdict: Optional[str] = None

    def as_dict(self, suffix: str = "") -> dict:
        """JSON keys; a study's step against the previous rung has them with `_prev` (p_prev)."""
        d = {"delta": self.delta, "delta_pct": self.delta_pct, **asdict(self.test),
             "few_seeds": self.few_seeds, "p_holm": self.p_holm, "verdict": self.verdict}
        if not suffix:
            return d
        return {("p" if k == "p_value" else k) + suffix: v for k, v in d.items()}


@dataclass
class Row(JsonRow):
    """One variant of a comparison (read by its --json key too: row["p_holm"])."""

    variant: str
    baseline: bool
    metric: str
    n: int  # seeds in the mean
    runs: int
    coverage: Optional[str]  # "2 of 3 seeds; 1 diverged" when some seeds are not in the mean
    seeds: list
    mean: Optional[float]
    std: Optional[float]
    values: list
    vs: Versus
    status: dict  # status -> runs
    params: Optional[int]
    params_delta: Optional[int]
    params_delta_pct: Optional[float]
    size_differs: bool
    flops_per_token: Optional[float]
    kv_cache_bytes_per_token: Optional[int]  # at the run's compute dtype (inspect's formula)
    tokens_per_s: Optional[float]  # the median of the completed seeds' figures
    tokens_per_s_unsteady: bool  # they differ by more than SPEED_SPREAD x: they measured the machine
    axes: Optional[dict]
    dirs: list
    rung: bool = False  # a study rung: vs_prev holds its step against the rung before it
    prev: Optional[str] = None
    vs_prev: Versus = field(default_factory=Versus)
    mixed: list = field(default_factory=list)  # --allow-mixed: the settings the rows do not share
    baseline_reason: Optional[str] = None
    length_eval: Optional[list] = None  # length_eval.LengthCell per protocol and length, when runs have them
    crossed: bool = False  # two crossed axes: the row has the `interaction` key
    interaction: Any = None  # interaction.InteractionCell of a cell of A's other levels; None: a baseline

    def as_dict(self) -> dict:
        """The row as `compare --json` writes it (the public keys)."""
        d = {k: getattr(self, k) for k in ("variant", "baseline", "metric", "n", "runs", "coverage",
                                           "seeds", "mean", "std", "values")}
        d.update(self.vs.as_dict())
        d.update({k: getattr(self, k) for k in ("status", "params", "params_delta", "params_delta_pct",
                                                "size_differs", "flops_per_token", "kv_cache_bytes_per_token", TOKENS_PER_S,
                                                "tokens_per_s_unsteady", "axes", "dirs")})
        if self.rung:
            d["prev"] = self.prev
            d.update(self.vs_prev.as_dict("_prev"))
        d.update(mixed=self.mixed, baseline_reason=self.baseline_reason)
        if self.length_eval is not None:
            d["length_eval"] = [c.as_dict() for c in self.length_eval]
        if self.crossed:
            d["interaction"] = self.interaction.as_dict() if self.interaction is not None else None
        return d


@dataclass
class SeedRow(JsonRow):
    """One run of a comparison (--per-seed): its final value and its difference from the
    baseline's run with the same seed (what the paired test averages)."""

    variant: str
    baseline: bool
    seed: Any
    status: str
    metric: str
    value: Optional[float]
    delta: Optional[float]
    params: Optional[float]
    tokens_per_s: Optional[float]
    dir: str


class Comparison(list):
    """The rows (baseline first) plus what the table needs around them."""

    def __init__(self, rows: Sequence[Row], metric: str, baseline: Optional[str], notes: list[str],
                 groups: list[Group], alpha: float):
        super().__init__(rows)
        self.metric, self.baseline, self.notes, self.groups, self.alpha = metric, baseline, notes, groups, alpha
        self.baseline_reason: Optional[str] = None  # why `baseline` was chosen
        self.mixed: dict[str, dict[str, int]] = {}  # settings the runs do not share (--allow-mixed)
        self.crossing: Optional[Crossing] = None  # two crossed axes: one baseline per level of B

    @property
    def study(self) -> bool:
        return any(r.rung for r in self)


def load_runs(paths: Sequence[Path | str], where: Sequence[str] = (),
              warn: Callable[[str], None] = print_warning) -> list[Run]:
    """The runs under `paths` that match every --where filter (checks.filter_runs)."""
    runs = find_runs(paths, warn)
    return filter_runs(runs, where) if where else runs


def compare_dirs(paths: Sequence[Path | str], metric: str = VAL_LOSS,
                 baseline: Optional[str] = None, alpha: float = ALPHA,
                 warn: Callable[[str], None] = print_warning, where: Sequence[str] = (),
                 allow_mixed: bool = False) -> Comparison:
    """Compare every run under `paths` (compare_runs); `where` keeps only the runs that match."""
    return compare_runs(load_runs(paths, where, warn), metric, baseline, alpha, allow_mixed)


def compare_runs(runs: list[Run], metric: str = VAL_LOSS, baseline: Optional[str] = None,
                 alpha: float = ALPHA, allow_mixed: bool = False,
                 crossing: Optional[Crossing] = None) -> Comparison:
    """One Row per variant, the baseline first (a study's rungs in ladder order). Runs that
    differ in more than variant keys and seed are refused (CompareError naming the keys) unless
    `allow_mixed`. With a `crossing`, one row per cell, A's baseline level first, each cell
    compared with A's baseline at its level of B; the runs may differ only in what the two axes
    set (crossing.crossed_mixed)."""
    mixed = mixed_settings(runs) if crossing is None else crossed_mixed(runs, crossing)
    if mixed and not allow_mixed:
        raise mixed_error(mixed, crossing)
    metric = resolve_metric(metric, runs)
    notes: list[str] = []
    if crossing is None:
        groups, base, reason, rungs = _arrange(runs, baseline, notes)
        for g in groups:
            g.baseline, g.ref = g is base, base if g is not base else None
    else:
        groups, rungs = _arrange_crossed(runs, crossing, baseline), set()
        base, reason = groups[0], "--baseline" if baseline else crossing.why
    _collect(groups, metric, notes)
    rows = [_row(g, metric, alpha, notes, id(g) in rungs) for g in groups]
    holm_correct([r.vs for r in rows], metric, alpha)
    holm_correct([r.vs_prev for r in rows if r.rung], metric, alpha)
    _summary_notes(rows, notes)
    for row in rows:
        row.mixed = sorted(mixed)
        row.baseline_reason = reason if row.baseline else None
        row.crossed = crossing is not None
    label = crossing.a.name(crossing.a.first) + f" at each level of {crossing.b.key}" if crossing else None
    cmp = Comparison(rows, metric, label or (base.label if base else None), notes, groups, alpha)
    cmp.baseline_reason, cmp.mixed, cmp.crossing = reason, mixed, crossing
    return cmp


def mixed_error(mixed: dict[str, dict[str, int]], crossing: Optional[Crossing] = None,
                allow: bool = True) -> CompareError:
    """The refusal of runs whose deltas would mix effects (`allow`: it says --allow-mixed)."""
    what = ("axis options and seed" if crossing is None
            else f"the crossed axes ({crossing.a.key}, {crossing.b.key}) and seed")
    return CompareError(f"these runs differ in more than {what}, so their deltas would mix effects: "
                        f"{describe_mixed(mixed)}; compare like with like (e.g. --where {next(iter(mixed))}=VALUE)"
                        + (" or pass --allow-mixed" if allow else ""))


def _arrange_crossed(runs: list[Run], crossing: Crossing, baseline: Optional[str]) -> list[Group]:
    """One group per cell of the grid, A's baseline level first, each of A's levels in B's order;
    each cell's reference is A's baseline at its level of B."""
    if baseline:
        crossing.rebase_to(baseline, runs)
    by_cell: dict[tuple, Group] = {}
    for r in runs:
        by_cell.setdefault(crossing.cell(r), Group([])).runs.append(r)
    groups = []
    for a in crossing.a.levels:
        for b in crossing.b.levels:
            g = by_cell[a, b]
            g.label, g.baseline = crossing.label(a, b), a == crossing.a.first
            groups.append(g)
    first = {crossing.cell(g.runs[0])[1]: g for g in groups if g.baseline}
    for g in groups:
        g.ref = None if g.baseline else first[crossing.cell(g.runs[0])[1]]
    return groups


def _arrange(runs: list[Run], baseline: Optional[str], notes: list[str]):
    """(groups in table order, the baseline group, why, ids of the study's rungs)."""
    by_key: dict[tuple, Group] = {}
    for r in runs:
        by_key.setdefault(r.variant_key(), Group([])).runs.append(r)
    groups = list(by_key.values())
    label_groups(groups)
    unchecked = sum(1 for r in runs if not r.config)
    if unchecked and len(runs) > 1:
        notes.append(f"{unchecked} run(s) have no {CONFIG}: not checked for settings that differ")
    ladder = study_ladder(groups, notes)
    if ladder and baseline is None and not any(g.label == "baseline" for g in groups):
        base, reason = ladder[0], "the study's first rung"  # a study's starting point
    else:
        base, reason = pick_baseline(groups, baseline, notes)
    rungs = {id(g) for g in ladder}
    head = [] if base is None or id(base) in rungs else [base]
    return head + ladder + [g for g in groups if id(g) not in rungs and g is not base], base, reason, rungs


def _collect(groups: list[Group], metric: str, notes: list[str]) -> None:
    """Each group's final values by seed: completed runs only, one run per seed."""
    missing = 0
    for g in groups:
        for r in g.runs:
            v = r.value(metric) if r.status == Status.COMPLETED else None
            if r.status == Status.COMPLETED and (v is None or not math.isfinite(v)):
                missing += 1
                continue
            if v is not None:
                if r.seed in g.values:
                    notes.append(f"{g.label}: two runs with seed {r.seed[0]}; {r.dir} is left out")
                    continue
                g.values[r.seed] = v
    if missing:
        notes.append(f"{missing} completed run(s) have no final {metric}; shown as 'no {metric}'")


def paired_or_welch(ref: Optional[Group], g: Group, alpha: float) -> Versus:
    mean = mean_std(list(g.values.values()))[0]
    ref_mean = mean_std(list(ref.values.values()))[0] if ref is not None and ref is not g else None
    if mean is None or ref_mean is None:
        return Versus()
    delta = mean - ref_mean
    test = seed_test(ref.values, g.values, alpha)
    return Versus(delta, (100 * delta / ref_mean) if ref_mean else None, test,
                  test.test is not None and len(test.test_seeds) < MIN_SEEDS)


def _status_counts(g: Group, metric: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in g.runs:
        st = r.status if not (r.status == Status.COMPLETED and r.seed not in g.values) else f"no {metric}"
        counts[st] = counts.get(st, 0) + 1
    return counts


def _row(g: Group, metric: str, alpha: float, notes: list[str], rung: bool) -> Row:
    mean, std = mean_std(list(g.values.values()))
    counts = _status_counts(g, metric)
    coverage = None  # the mean reflects the survivors only: say so when some seeds did not enter it
    if len(g.values) != len(g.runs):
        left = [f"{c} {st}" for st, c in counts.items() if st != Status.COMPLETED]
        coverage = f"{len(g.values)} of {len(g.runs)} seeds" + ("; " + ", ".join(left) if left else "")
        notes.append(f"{g.label}: {coverage}; its mean is over the completed seeds only")
    params, base_params = g.first(_params), g.ref.first(_params) if g.ref else None
    p_delta = (params - base_params) if (params is not None and base_params) else None
    p_pct = (100 * p_delta / base_params) if p_delta is not None else None
    tps, unsteady = _speed(g)
    order = sorted(g.values, key=str)
    return Row(variant=g.label, baseline=g.baseline, metric=metric, n=len(g.values), runs=len(g.runs),
               coverage=coverage, seeds=[s[0] for s in order], mean=mean, std=std,
               values=[g.values[s] for s in order], vs=paired_or_welch(g.ref, g, alpha), status=counts,
               params=params, params_delta=p_delta, params_delta_pct=p_pct,
               size_differs=p_pct is not None and abs(p_pct) > SIZE_NOTE_PCT,
               flops_per_token=g.first(lambda r: r.record.info.flops_per_token),
               kv_cache_bytes_per_token=g.first(kv_cache_bytes_per_token), tokens_per_s=tps,
               tokens_per_s_unsteady=unsteady, axes=g.runs[0].record.axes, dirs=[str(r.dir) for r in g.runs], rung=rung,
               prev=g.prev.label if rung and g.prev else None,
               vs_prev=paired_or_welch(g.prev, g, alpha) if rung else Versus())


def _params(r: Run) -> Optional[int]:
    return r.record.info.params


def compute_dtype(r: Run) -> Optional[str]:
    """The run's compute dtype: its record's (resolved by the trainer), else its config's
    train.precision, `auto` being fp32 on a CPU; None when it cannot be told."""
    precision = r.record.info.precision or r.config.get("train.precision")
    if precision == "auto":
        device = r.record.info.device or r.config.get("train.device")
        precision = "fp32" if str(device).startswith("cpu") else None
    return precision if precision in DTYPE_BYTES else None


def kv_cache_bytes_per_token(r: Run) -> Optional[int]:
    """`ablate inspect`'s KV-cache bytes per token of the run's model (its config.yaml) at its
    compute dtype. Keys its config lacks (saved before they existed) take today's defaults;
    None without a config, or for one this version cannot build (a plugin's option not loaded)."""
    from omegaconf import OmegaConf

    from ablate.config.schema import AblateConfig
    from ablate.errors import AblateError
    from ablate.measure.inspect import run_kv_cache_bytes_per_token

    dtype = compute_dtype(r)
    if not r.config or dtype is None:
        return None
    cfg = OmegaConf.structured(AblateConfig)
    OmegaConf.set_struct(cfg, False)  # an option's own settings are keys beyond the schema
    try:
        for key, value in r.config.items():
            OmegaConf.update(cfg, key, value, force_add=True)
        return run_kv_cache_bytes_per_token(cfg, dtype)
    except (AblateError, ValueError, KeyError, TypeError):
        return None


def _speed(g: Group) -> tuple[Optional[float], bool]:
    """The median of the completed seeds' tokens/s (a seed timed on a busy host drags a mean, not
    a median), and whether the seeds' figures differ by more than SPEED_SPREAD x (max/min)."""
    tps = [t for t in (r.record.metric(TOKENS_PER_S) for r in g.runs if r.status == Status.COMPLETED) if t]
    if not tps:
        return None, False
    return statistics.median(tps), max(tps) > SPEED_SPREAD * min(tps)


def holm_correct(family: list[Versus], metric: str, alpha: float) -> None:
    """Holm over one family of tests (every variant vs the baseline; or every rung vs the rung
    before it); the corrected p decides the verdict, and seeds_needed is the count that passes it."""
    tested = sum(v.test.p_value is not None for v in family)
    for v, p in zip(family, holm([v.test.p_value for v in family])):
        v.test = for_family(v.test, alpha, tested)
        v.p_holm = p
        v.verdict = verdict(v.test.t, p, metric, alpha)


def _summary_notes(rows: list[Row], notes: list[str]) -> None:
    few = [f"{r.variant} ({len(r.vs.test.test_seeds)})" for r in rows if r.vs.few_seeds]
    if few:
        notes.append(f"fewer than {MIN_SEEDS} seeds in the test: " + ", ".join(few) + "; with one or "
                     "two degrees of freedom the noise estimate is rough, so read the interval, "
                     "not the verdict (run --seeds 3 or more)")
    sized = [f"{r.variant} ({r.params_delta:+,} params, {r.params_delta_pct:+.2f}%)" for r in rows if r.size_differs]
    if sized:
        notes.append(f"differs in size from the baseline by more than {SIZE_NOTE_PCT:g}%, so part of "
                     "its delta may be capacity: " + "; ".join(sized))
    unsteady = [r.variant for r in rows if r.tokens_per_s_unsteady]
    if unsteady:
        notes.append(f"~ tokens/s: the seeds' figures differ by more than {SPEED_SPREAD:g}x (max/min) in "
                     + ", ".join(unsteady) + ", so they measured the machine (its load, device or "
                     "settings) as much as the variant. Each figure is the median of the seeds; compare "
                     "speed with `ablate bench --vs OVERRIDE` (alternating rounds), not here")


def per_seed_rows(cmp: Comparison) -> list[SeedRow]:
    """One row per run (--per-seed), each variant's runs in seed order; each run's Δ is from its
    baseline's run of the same seed (its level's, when crossed)."""
    out = []
    for g, row in zip(cmp.groups, cmp):
        for r in sorted(g.runs, key=lambda r: str(r.seed)):
            v = g.values.get(r.seed) if r.status == Status.COMPLETED else None
            ref = g.ref.values.get(r.seed) if g.ref is not None else None
            out.append(SeedRow(row.variant, row.baseline, r.seed[0],
                               str(r.status) if r.status != Status.COMPLETED or v is not None else f"no {cmp.metric}",
                               cmp.metric, v, (v - ref) if v is not None and ref is not None else None,
                               number(_params(r)), r.record.metric(TOKENS_PER_S), str(r.dir)))
    return out
