"""`ablate compare`: read run directories, group runs by variant, and say which differences are
bigger than seed noise.

Local files are the source of truth (summary.json, metrics.jsonl, config.yaml); nothing here
touches the trainer or W&B. Used by the CLI and at the end of `ablate sweep`:

    rows = compare_dirs([sweep_dir], metric="val_loss")   # a list of dicts, one per variant
    print_comparison(rows)

A variant is a config minus its seeds (and minus keys that do not change what is trained);
its runs are the seeds. The baseline is the variant with no axis change (or `baseline=`).
A variant is tested against the baseline with a paired t-test over the seeds both completed
when there are at least two (same seed => same init and batches, so pairing removes shared
noise; a diverged seed leaves the pairing, and the row says how many seeds its mean covers),
else Welch's t-test; fewer than two seeds on either side gives no test.

A study sweep (`ablate sweep study=gpt2_to_llama`: its multirun.yaml holds the job list) is a
cumulative ladder: its rungs are shown in ladder order, each also against the rung before it
(delta_prev, p_prev, test_prev, verdict_prev), so each step's own gain is visible.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

from ablate.errors import AblateError
from ablate.overrides import NON_VARIANT_PREFIXES, SEED_KEYS

SUMMARY, METRICS, CONFIG = "summary.json", "metrics.jsonl", "config.yaml"
MULTIRUN = "multirun.yaml"  # a sweep dir's composed config; a study's job list is in it
# Config keys that never change what is trained (besides overrides.NON_VARIANT_PREFIXES).
EXTRA_NON_VARIANT = ("data.cache_dir", "data.num_proc")
# W&B names -> metrics.jsonl / summary names, so `--metric val/loss` works too.
ALIASES = {"val/loss": "val_loss", "val/bpb": "val_bpb", "train/loss": "train_loss",
           "train/grad_norm": "grad_norm", "train/lr": "lr", "train/tokens_per_s": "tokens_per_s"}
HIGHER_IS_BETTER = {"tokens_per_s", "mfu"}
ALPHA = 0.05


class CompareError(AblateError):
    """Nothing to compare, or a request the runs cannot answer."""


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


# ---- reading runs ----------------------------------------------------------------------------
def _number(v: Any) -> Optional[float]:
    """A metric value as a float; JSON NaN/inf are written as strings ("nan", "inf")."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def read_metrics(path: Path, warn: Callable[[str], None] = _warn) -> list[dict]:
    """metrics.jsonl rows. A torn last line (the run was killed mid-write) is skipped with one
    warning; unreadable lines elsewhere are skipped and counted in one warning too."""
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    rows, bad = [], []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            bad.append(i)
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad.append(i)
    if bad == [len(lines) - 1]:
        warn(f"{path}: skipped a truncated last line (the run was stopped while writing it)")
    elif bad:
        warn(f"{path}: skipped {len(bad)} unreadable line(s) (first at line {bad[0] + 1})")
    return rows


def _flatten(d: Any, prefix: str = "") -> dict:
    if not isinstance(d, dict):
        return {prefix.rstrip("."): d}
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _non_variant(key: str) -> bool:
    return key in SEED_KEYS or key.startswith(NON_VARIANT_PREFIXES + EXTRA_NON_VARIANT)


@dataclass
class Run:
    dir: Path
    summary: dict
    config: dict  # flattened config.yaml; {} when missing
    rows: list[dict]
    status: str

    @property
    def seed(self) -> tuple:
        return (self.summary.get("seed"), self.summary.get("data_seed"))

    def variant_key(self) -> tuple:
        if self.config:
            return tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in self.config.items()
                                if not _non_variant(k)))
        return (("variant", self.summary.get("variant", str(self.dir))),)

    def value(self, metric: str) -> Optional[float]:
        """The run's final value of `metric`: summary.json's, else the last logged one."""
        v = _number(self.summary.get(metric))
        if v is not None:
            return v
        for row in reversed(self.rows):
            if metric in row:
                return _number(row[metric])
        return None

    def metric_names(self) -> set[str]:
        names = {k for k, v in self.summary.items() if _number(v) is not None}
        for row in self.rows:
            names.update(row)
        return names - {"step", "steps", "seed", "data_seed", "pid", "vocab_size", "tokenizer_vocab",
                        "world_size", "skipped_steps"}


def find_runs(paths: Sequence[Path | str], warn: Callable[[str], None] = _warn) -> list[Run]:
    """Every run directory (a directory holding summary.json) under the given paths."""
    import yaml

    from ablate.rundir import live_status

    if not paths:
        raise CompareError("give at least one run or sweep directory")
    dirs: dict[Path, None] = {}
    for p in map(Path, paths):
        if not p.exists():
            raise CompareError(f"{p}: no such file or directory")
        if p.is_file():
            p = p.parent if p.name in (SUMMARY, METRICS, CONFIG) else p
            if p.is_file():
                raise CompareError(f"{p}: not a directory (give a run or sweep directory)")
        found = [s.parent for s in p.rglob(SUMMARY)] if not (p / SUMMARY).is_file() else [p]
        if not found:
            raise CompareError(f"{p}: no runs found (a run directory holds {SUMMARY})")
        for d in sorted(found, key=_natural):
            dirs.setdefault(d.resolve(), None)
    runs = []
    for d in dirs:
        try:
            summary = json.loads((d / SUMMARY).read_text(encoding="utf-8"))
            if not isinstance(summary, dict):
                raise ValueError("not an object")
        except (OSError, ValueError) as e:
            warn(f"{d / SUMMARY}: unreadable ({e}); run skipped")
            continue
        config = {}
        if (d / CONFIG).is_file():
            try:
                config = _flatten(yaml.safe_load((d / CONFIG).read_text(encoding="utf-8")) or {})
            except (OSError, yaml.YAMLError):
                warn(f"{d / CONFIG}: unreadable; the run is grouped by its variant name")
        status = live_status(d) or str(summary.get("status", "unknown"))
        runs.append(Run(d, summary, config, read_metrics(d / METRICS, warn), status))
    if not runs:
        raise CompareError(f"no readable runs under {', '.join(map(str, paths))}")
    return runs


def _natural(p: Path) -> list:
    """Sort 2_x before 10_x (sweep job numbers)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(p))]


# ---- statistics --------------------------------------------------------------------------------
def _mean_std(values: Sequence[float]) -> tuple[Optional[float], Optional[float]]:
    if not values:
        return None, None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _seeds(keys: Iterable) -> list:
    """Seeds as shown: a run's key is (seed, data_seed); the data seed is shared in a sweep."""
    return [k[0] if isinstance(k, tuple) else k for k in keys]


NO_TEST = {"test": None, "t": None, "p_value": None, "df": None, "test_seeds": None}


def seed_test(base: dict, other: dict) -> dict:
    """Is mean(other) - mean(base) bigger than seed noise? `base`/`other` map seed -> value.

    Paired t-test on per-seed differences over the seeds both have (when >= 2: a diverged seed
    on one side drops out of the pairing instead of turning the test into Welch), else Welch's
    t-test when both have >= 2 values, else no test. Returns {test, t, p_value, df, test_seeds}
    (test_seeds: the seeds of `other` that entered the test)."""
    from scipy import stats

    if len(base) < 2 or len(other) < 2:
        return dict(NO_TEST)
    common = sorted(set(base) & set(other), key=str)
    if len(common) >= 2:
        a, b = [other[s] for s in common], [base[s] for s in common]
        diffs = [x - y for x, y in zip(a, b)]
        mean, sd = _mean_std(diffs)
        out = {"test": "paired t", "df": len(diffs) - 1, "test_seeds": _seeds(common)}
        if sd == 0:  # identical differences on every seed: no noise to compare against
            return {**out, "t": 0.0 if mean == 0 else math.copysign(math.inf, mean),
                    "p_value": 1.0 if mean == 0 else 0.0}
        r = stats.ttest_rel(a, b)
        return {**out, "t": float(r.statistic), "p_value": float(r.pvalue)}
    a, b = list(other.values()), list(base.values())
    (ma, sa), (mb, sb) = _mean_std(a), _mean_std(b)
    seeds = _seeds(sorted(other, key=str))
    if sa == 0 and sb == 0:
        return {"test": "Welch t", "t": 0.0 if ma == mb else math.copysign(math.inf, ma - mb),
                "p_value": 1.0 if ma == mb else 0.0, "df": None, "test_seeds": seeds}
    r = stats.ttest_ind(a, b, equal_var=False)
    va, vb = sa ** 2 / len(a), sb ** 2 / len(b)  # Welch-Satterthwaite degrees of freedom
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return {"test": "Welch t", "t": float(r.statistic), "p_value": float(r.pvalue), "df": df,
            "test_seeds": seeds}


def verdict(direction: Optional[float], p_value: Optional[float], metric: str,
            alpha: float = ALPHA) -> Optional[str]:
    """better / worse (p < alpha, in the metric's direction) or noise; None without a test.
    `direction`: the sign of the difference the test saw (its t), which can differ from the
    all-seeds delta when the pairing leaves seeds out."""
    if direction is None or p_value is None:
        return None
    if p_value >= alpha or direction == 0:
        return "noise"
    higher = metric in HIGHER_IS_BETTER
    return "better" if (direction > 0) == higher else "worse"


# ---- grouping and the comparison ---------------------------------------------------------------
@dataclass
class Group:
    runs: list[Run]
    label: str = ""
    values: dict = field(default_factory=dict)  # seed -> metric value (completed runs only)
    prev: Optional["Group"] = None  # a study rung: the rung before it in the same sweep

    def first(self, key: str) -> Any:
        for r in self.runs:
            if r.summary.get(key) is not None:
                return r.summary[key]
        return None


class Comparison(list):
    """The rows (one dict per variant, baseline first) plus what the table needs around them."""

    def __init__(self, rows: Iterable[dict], metric: str, baseline: Optional[str],
                 notes: list[str], groups: list[Group], alpha: float):
        super().__init__(rows)
        self.metric, self.baseline, self.notes, self.groups, self.alpha = metric, baseline, notes, groups, alpha


def _labels(groups: list[Group]) -> None:
    """Readable names: a sweep's own variant names; for single runs, the overrides that are
    not shared by every run compared ("baseline" when none are left)."""
    loose = [g for g in groups if not g.runs[0].summary.get("sweep")]
    common: Optional[set] = None
    if len(loose) > 1:
        for g in loose:
            o = set(g.runs[0].summary.get("overrides") or [])
            common = o if common is None else common & o
    for g in groups:
        s = g.runs[0].summary
        if s.get("sweep") or common is None:
            g.label = str(s.get("variant") or g.runs[0].dir.name)
        else:
            g.label = ",".join(o for o in (s.get("overrides") or []) if o not in common) or "baseline"
    seen: dict[str, int] = {}
    for g in groups:  # same name, different config (two sweeps' baselines): keep them apart
        n = seen[g.label] = seen.get(g.label, 0) + 1
        if n > 1:
            sweep = g.runs[0].summary.get("sweep")
            g.label = f"{g.label} [{sweep}]" if sweep else f"{g.label} ({n})"


def _pick_baseline(groups: list[Group], baseline: Optional[str], notes: list[str]) -> Optional[Group]:
    if baseline:
        path = Path(baseline)
        if path.exists():
            target = path.resolve()
            hits = [g for g in groups if any(r.dir == target or target in r.dir.parents for r in g.runs)]
            if len(hits) != 1:
                what = "no compared run" if not hits else f"runs of {len(hits)} variants"
                raise CompareError(f"--baseline {baseline}: that directory holds {what}; "
                                   "give one run directory or a variant name")
            return hits[0]
        hits = [g for g in groups if g.label == baseline] or \
               [g for g in groups if any(r.summary.get("variant") == baseline for r in g.runs)]
        if len(hits) != 1:
            names = ", ".join(g.label for g in groups)
            why = "matches no variant" if not hits else "matches several variants"
            raise CompareError(f"--baseline {baseline}: {why}; variants: {names}")
        return hits[0]
    named = [g for g in groups if g.label == "baseline"]
    if len(named) == 1:
        return named[0]
    from ablate.axes import default_axes

    base_axes = default_axes()
    cands = named or [g for g in groups if g.runs[0].summary.get("axes") == base_axes]
    if len(cands) > 1:  # the one with the fewest extra overrides, if that is unique
        fewest = min(len(g.runs[0].summary.get("overrides") or []) for g in cands)
        cands = [g for g in cands if len(g.runs[0].summary.get("overrides") or []) == fewest]
    if len(cands) == 1:
        return cands[0]
    if len(groups) > 1:
        notes.append("no baseline: " + ("several variants have no axis change" if cands else
                     "every variant changes an axis") + "; pick one with --baseline DIR_OR_VARIANT")
    return None


def _resolve_metric(metric: str, runs: list[Run]) -> str:
    metric = ALIASES.get(metric, metric)
    if not any(r.value(metric) is not None for r in runs):
        names = sorted(set().union(*(r.metric_names() for r in runs)))
        raise CompareError(f"no run has the metric '{metric}'; available: {', '.join(names)}")
    return metric


def _ladder(sweep_dir: Path, cache: dict) -> Optional[list[str]]:
    """A study's rung names in order: the explicit job list (hydra.sweeper.jobs) that the
    sweeper saved in the sweep's multirun.yaml; None for any other directory."""
    if sweep_dir not in cache:
        import yaml

        names = None
        try:
            multirun = yaml.safe_load((sweep_dir / MULTIRUN).read_text(encoding="utf-8"))
            jobs = multirun["hydra"]["sweeper"]["jobs"]
            if jobs:  # unnamed entries are named as ablate.sweep.expand_explicit names them
                names = [str(j.get("name") or f"job{i}") for i, j in enumerate(jobs)]
        except (OSError, ValueError, yaml.YAMLError, TypeError, KeyError, AttributeError):
            pass
        cache[sweep_dir] = names
    return cache[sweep_dir]


def _study(groups: list[Group], notes: list[str]) -> list[Group]:
    """The groups that are rungs of a study sweep, in ladder order; each gets `prev`, the rung
    before it in the same sweep (a missing rung is skipped, with a note)."""
    cache: dict = {}
    rungs: dict[tuple, Group] = {}
    sweeps: list[Path] = []
    for g in groups:
        r = g.runs[0]
        names, name = _ladder(r.dir.parent, cache), r.summary.get("variant")
        if names and name in names:
            rungs.setdefault((r.dir.parent, names.index(name)), g)
            if r.dir.parent not in sweeps:
                sweeps.append(r.dir.parent)
    order = sorted(rungs, key=lambda k: (sweeps.index(k[0]), k[1]))
    for before, key in zip([None] + order, order):
        if before and before[0] == key[0]:
            g = rungs[key]
            g.prev = rungs[before]
            if before[1] != key[1] - 1:
                notes.append(f"{g.label}: the rung before it has no runs; its step is measured "
                             f"from {g.prev.label}")
    return [rungs[k] for k in order]


def _versus(ref: Optional[Group], g: Group, metric: str, alpha: float) -> dict:
    """`g` against `ref`: delta of the means, the seed test and its verdict."""
    mean = _mean_std(list(g.values.values()))[0]
    ref_mean = _mean_std(list(ref.values.values()))[0] if ref is not None and ref is not g else None
    delta = None if mean is None or ref_mean is None else mean - ref_mean
    test = seed_test(ref.values, g.values) if delta is not None else dict(NO_TEST)
    return {"delta": delta, "delta_pct": (100 * delta / ref_mean) if delta is not None and ref_mean else None,
            **test, "verdict": verdict(test["t"], test["p_value"], metric, alpha)}


def compare_dirs(paths: Sequence[Path | str], metric: str = "val_loss",
                 baseline: Optional[str] = None, alpha: float = ALPHA,
                 warn: Callable[[str], None] = _warn) -> Comparison:
    """Compare every run under `paths`; one dict per variant, the baseline first (a study's
    rungs in ladder order, each also against the rung before it: delta_prev, p_prev, ...)."""
    runs = find_runs(paths, warn)
    metric = _resolve_metric(metric, runs)
    by_key: dict[tuple, Group] = {}
    for r in runs:
        by_key.setdefault(r.variant_key(), Group([])).runs.append(r)
    groups = list(by_key.values())
    _labels(groups)
    notes: list[str] = []
    ladder = _study(groups, notes)
    if ladder and baseline is None and not any(g.label == "baseline" for g in groups):
        base = ladder[0]  # a study's first rung is its starting point
    else:
        base = _pick_baseline(groups, baseline, notes)
    in_ladder = {id(g) for g in ladder}
    head = [] if base is None or id(base) in in_ladder else [base]
    groups = head + ladder + [g for g in groups if id(g) not in in_ladder and g is not base]

    missing = 0
    for g in groups:
        for r in g.runs:
            v = r.value(metric) if r.status == "completed" else None
            if r.status == "completed" and (v is None or not math.isfinite(v)):
                missing += 1
                continue
            if v is not None:
                if r.seed in g.values:
                    notes.append(f"{g.label}: two runs with seed {r.seed[0]}; {r.dir} is left out")
                    continue
                g.values[r.seed] = v
    if missing:
        notes.append(f"{missing} completed run(s) have no final {metric}; shown as 'no {metric}'")

    base_params = base.first("params") if base else None
    rows = []
    for g in groups:
        mean, std = _mean_std(list(g.values.values()))
        counts: dict[str, int] = {}
        for r in g.runs:
            st = r.status
            if st == "completed" and r.seed not in g.values:
                st = f"no {metric}"
            counts[st] = counts.get(st, 0) + 1
        # The mean reflects the survivors only: say so when some seeds did not enter it.
        coverage = None
        if len(g.values) != len(g.runs):
            left = [f"{c} {st}" for st, c in counts.items() if st != "completed"]
            coverage = f"{len(g.values)} of {len(g.runs)} seeds" + ("; " + ", ".join(left) if left else "")
            notes.append(f"{g.label}: {coverage}; its mean is over the completed seeds only")
        is_base = g is base
        params = g.first("params")
        p_delta = (params - base_params) if (params is not None and base_params and not is_base) else None
        tps = [_number(r.summary.get("tokens_per_s")) for r in g.runs if r.status == "completed"]
        tps = [t for t in tps if t]
        row = {
            "variant": g.label, "baseline": is_base, "metric": metric,
            "n": len(g.values), "runs": len(g.runs), "coverage": coverage,
            "seeds": [s[0] for s in sorted(g.values, key=str)],
            "mean": mean, "std": std,
            "values": [g.values[s] for s in sorted(g.values, key=str)],
            **_versus(base, g, metric, alpha),
            "status": counts,
            "params": params, "params_delta": p_delta,
            "params_delta_pct": (100 * p_delta / base_params) if p_delta is not None else None,
            "flops_per_token": g.first("flops_per_token"),
            "tokens_per_s": (sum(tps) / len(tps)) if tps else None,
            "axes": g.runs[0].summary.get("axes"),
            "dirs": [str(r.dir) for r in g.runs],
        }
        if id(g) in in_ladder:  # the step this rung adds: against the rung before it
            row["prev"] = g.prev.label if g.prev else None
            row.update({("p_prev" if k == "p_value" else f"{k}_prev"): v
                        for k, v in _versus(g.prev, g, metric, alpha).items()})
        rows.append(row)
    sized = [f"{r['variant']} ({r['params_delta']:+,} params, {r['params_delta_pct']:+.1f}%)"
             for r in rows if r["params_delta"]]
    if sized:
        notes.append("differs in size from the baseline, so part of its delta may be capacity: "
                      + "; ".join(sized))
    return Comparison(rows, metric, base.label if base else None, notes, groups, alpha)


# ---- output --------------------------------------------------------------------------------------
def to_json(rows: Sequence[dict]) -> str:
    def clean(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    return json.dumps([clean(dict(r)) for r in rows], indent=2)


STATUS_COLOR = {"completed": "green", "diverged": "yellow", "failed": "red", "killed": "red",
                "interrupted": "magenta", "preempted": "magenta", "running": "cyan"}


def _status_cell(counts: dict) -> str:
    from rich.markup import escape

    if list(counts) == ["completed"]:
        return "[green]ok[/green]"
    parts = []
    for st, n in counts.items():
        c = STATUS_COLOR.get(st, "yellow")
        parts.append(f"[{c}]{n} {escape(st)}[/{c}]")
    return ", ".join(parts)


def _key(name: str, prev: bool) -> str:
    """A row key, or its against-the-previous-rung twin (delta_prev, p_prev, test_prev, ...)."""
    return name if not prev else ("p_prev" if name == "p_value" else f"{name}_prev")


def _delta_cell(r: dict, prev: bool = False) -> str:
    if (r["prev"] is None) if prev else r["baseline"]:
        return ""
    delta, pct = r[_key("delta", prev)], r[_key("delta_pct", prev)]
    return "-" if delta is None else f"{delta:+.4f}" + (f" ({pct:+.2f}%)" if pct is not None else "")


def _test_cell(r: dict, prev: bool = False) -> str:
    if (r["prev"] is None) if prev else r["baseline"]:
        return ""
    test, seeds = r[_key("test", prev)], r[_key("test_seeds", prev)]
    if test is None:
        return "[dim]no test (needs ≥2 seeds each)[/dim]" if r[_key("delta", prev)] is not None else "-"
    v = r[_key("verdict", prev)]
    color = {"better": "green", "worse": "red"}.get(v, "dim")
    word = {"better": "yes, better", "worse": "yes, worse", "noise": "no"}[v]
    if test == "paired t" and len(seeds) < r["n"]:  # a seed missing on the other side
        test += " on seeds " + ",".join(map(str, seeds))
    return f"[{color}]{word}[/{color}] ({test}, p={r[_key('p_value', prev)]:.3g})"


def print_comparison(rows: Sequence[dict], console: Any = None) -> None:
    """The rich table: one line per variant, the baseline first (a study: its rungs in ladder
    order, with each rung's step against the one before it); notes below it."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    if console is None:
        import os

        console = Console()
        if not console.is_terminal and "COLUMNS" not in os.environ:
            console = Console(width=200)  # piped to a file: don't squeeze the table into 80
    metric = getattr(rows, "metric", rows[0]["metric"] if rows else "metric")
    alpha = getattr(rows, "alpha", ALPHA)
    study = any("prev" in r for r in rows)
    t = Table(title=f"ablate compare: final {metric} (mean ± std over seeds)"
              + ("; study: rungs in ladder order, each step vs the previous rung" if study else ""),
              title_justify="left")
    columns = [("variant", {"style": "bold"}), ("seeds", {"justify": "right"}),
               ("params", {"justify": "right"}), (metric, {"justify": "right"}),
               ("Δ vs baseline", {"justify": "right"}), (f"beyond seed noise? (p<{alpha:g})", {})]
    if study:
        columns += [("Δ vs previous rung", {"justify": "right"}), ("step beyond seed noise?", {})]
    for name, kw in columns + [("tokens/s", {"justify": "right"}), ("status", {})]:
        t.add_column(name, **kw)
    for r in rows:
        label = escape(r["variant"]) + (" [dim](baseline)[/dim]" if r["baseline"] and r["variant"] != "baseline" else "")
        seeds = f"{r['n']}" + (f" of {r['runs']}" if r["runs"] != r["n"] else "")
        params = "-" if r["params"] is None else f"{r['params']:,}"
        if r["params_delta"]:
            params += f" [yellow]({r['params_delta_pct']:+.1f}%)[/yellow]"
        if r["mean"] is None:
            value = "-"
        else:
            value = f"{r['mean']:.4f}" + (f" ± {r['std']:.4f}" if r["std"] is not None else "")
        cells = [label, seeds, params, value, _delta_cell(r), _test_cell(r)]
        if study:
            cells += ["", ""] if "prev" not in r else [_delta_cell(r, True), _test_cell(r, True)]
        tps = "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}"
        t.add_row(*cells, tps, _status_cell(r["status"]))
    console.print(t)
    for note in getattr(rows, "notes", []):
        console.print(f"note: {escape(note)}", soft_wrap=True)
