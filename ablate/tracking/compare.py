"""`ablate compare`: read run directories, group runs by variant, and say which differences are
bigger than seed noise.

Local files are the source of truth (summary.json, metrics.jsonl, config.yaml); nothing here
touches the trainer or W&B. Used by the CLI and at the end of `ablate sweep`:

    rows = compare_dirs([sweep_dir], metric="val_loss")   # a list of dicts, one per variant
    print_comparison(rows)

A variant is a config minus its seeds (and minus keys that do not change what is trained);
its runs are the seeds. The baseline is the variant with no axis change (or `baseline=`).
A variant is tested against the baseline with a paired t-test over seeds when both have the
same seeds (same seed => same init and batches, so pairing removes shared noise), else Welch's
t-test; fewer than two seeds on either side gives no test.
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

SUMMARY, METRICS, CONFIG = "summary.json", "metrics.jsonl", "config.yaml"
SEED_KEYS = ("seed", "data_seed")
# Config keys that never change what is trained (besides run.NON_VARIANT_PREFIXES).
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
    from ablate.run import NON_VARIANT_PREFIXES

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


def seed_test(base: dict, other: dict) -> dict:
    """Is mean(other) - mean(base) bigger than seed noise? `base`/`other` map seed -> value.

    Paired t-test on per-seed differences when both have the same (>= 2) seeds, else Welch's
    t-test when both have >= 2 values, else no test. Returns {test, t, p_value, df}."""
    from scipy import stats

    none = {"test": None, "t": None, "p_value": None, "df": None}
    if len(base) < 2 or len(other) < 2:
        return none
    if set(base) == set(other):
        seeds = sorted(base, key=str)
        a, b = [other[s] for s in seeds], [base[s] for s in seeds]
        diffs = [x - y for x, y in zip(a, b)]
        mean, sd = _mean_std(diffs)
        df = len(diffs) - 1
        if sd == 0:  # identical differences on every seed: no noise to compare against
            return {"test": "paired t", "t": 0.0 if mean == 0 else math.copysign(math.inf, mean),
                    "p_value": 1.0 if mean == 0 else 0.0, "df": df}
        r = stats.ttest_rel(a, b)
        return {"test": "paired t", "t": float(r.statistic), "p_value": float(r.pvalue), "df": df}
    a, b = list(other.values()), list(base.values())
    (ma, sa), (mb, sb) = _mean_std(a), _mean_std(b)
    if sa == 0 and sb == 0:
        return {"test": "Welch t", "t": 0.0 if ma == mb else math.copysign(math.inf, ma - mb),
                "p_value": 1.0 if ma == mb else 0.0, "df": None}
    r = stats.ttest_ind(a, b, equal_var=False)
    va, vb = sa ** 2 / len(a), sb ** 2 / len(b)  # Welch-Satterthwaite degrees of freedom
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return {"test": "Welch t", "t": float(r.statistic), "p_value": float(r.pvalue), "df": df}


def verdict(delta: Optional[float], p_value: Optional[float], metric: str, alpha: float = ALPHA) -> Optional[str]:
    """better / worse (p < alpha, in the metric's direction) or noise; None without a test."""
    if delta is None or p_value is None:
        return None
    if p_value >= alpha or delta == 0:
        return "noise"
    higher = metric in HIGHER_IS_BETTER
    return "better" if (delta > 0) == higher else "worse"


# ---- grouping and the comparison ---------------------------------------------------------------
@dataclass
class Group:
    runs: list[Run]
    label: str = ""
    values: dict = field(default_factory=dict)  # seed -> metric value (completed runs only)

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
    from ablate.run import default_axes

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


def compare_dirs(paths: Sequence[Path | str], metric: str = "val_loss",
                 baseline: Optional[str] = None, alpha: float = ALPHA,
                 warn: Callable[[str], None] = _warn) -> Comparison:
    """Compare every run under `paths`; one dict per variant, the baseline first."""
    runs = find_runs(paths, warn)
    metric = _resolve_metric(metric, runs)
    by_key: dict[tuple, Group] = {}
    for r in runs:
        by_key.setdefault(r.variant_key(), Group([])).runs.append(r)
    groups = list(by_key.values())
    _labels(groups)
    notes: list[str] = []
    base = _pick_baseline(groups, baseline, notes)
    if base is not None:
        groups.remove(base)
        groups.insert(0, base)

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

    base_mean = _mean_std(list(base.values.values()))[0] if base else None
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
        is_base = g is base
        delta = None if (is_base or mean is None or base_mean is None) else mean - base_mean
        test = seed_test(base.values, g.values) if (base and not is_base and delta is not None) else \
            {"test": None, "t": None, "p_value": None, "df": None}
        params = g.first("params")
        p_delta = (params - base_params) if (params is not None and base_params and not is_base) else None
        tps = [_number(r.summary.get("tokens_per_s")) for r in g.runs if r.status == "completed"]
        tps = [t for t in tps if t]
        rows.append({
            "variant": g.label, "baseline": is_base, "metric": metric,
            "n": len(g.values), "runs": len(g.runs),
            "seeds": [s[0] for s in sorted(g.values, key=str)],
            "mean": mean, "std": std,
            "values": [g.values[s] for s in sorted(g.values, key=str)],
            "delta": delta, "delta_pct": (100 * delta / base_mean) if delta is not None and base_mean else None,
            **test, "verdict": verdict(delta, test["p_value"], metric, alpha),
            "status": counts,
            "params": params, "params_delta": p_delta,
            "params_delta_pct": (100 * p_delta / base_params) if p_delta is not None else None,
            "flops_per_token": g.first("flops_per_token"),
            "tokens_per_s": (sum(tps) / len(tps)) if tps else None,
            "axes": g.runs[0].summary.get("axes"),
            "dirs": [str(r.dir) for r in g.runs],
        })
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


def print_comparison(rows: Sequence[dict], console: Any = None) -> None:
    """The rich table: one line per variant, the baseline first; notes below it."""
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
    t = Table(title=f"ablate compare: final {metric} (mean ± std over seeds)", title_justify="left")
    for name, kw in (("variant", {"style": "bold"}), ("seeds", {"justify": "right"}),
                     ("params", {"justify": "right"}), (metric, {"justify": "right"}),
                     ("Δ vs baseline", {"justify": "right"}),
                     (f"beyond seed noise? (p<{alpha:g})", {}), ("tokens/s", {"justify": "right"}),
                     ("status", {})):
        t.add_column(name, **kw)
    for r in rows:
        label = escape(r["variant"]) + (" [dim](baseline)[/dim]" if r["baseline"] and r["variant"] != "baseline" else "")
        seeds = f"{r['n']}" + (f"/{r['runs']}" if r["runs"] != r["n"] else "")
        params = "-" if r["params"] is None else f"{r['params']:,}"
        if r["params_delta"]:
            params += f" [yellow]({r['params_delta_pct']:+.1f}%)[/yellow]"
        if r["mean"] is None:
            value = "-"
        else:
            value = f"{r['mean']:.4f}" + (f" ± {r['std']:.4f}" if r["std"] is not None else "")
        delta = "" if r["baseline"] else ("-" if r["delta"] is None else f"{r['delta']:+.4f}"
                                          + (f" ({r['delta_pct']:+.2f}%)" if r["delta_pct"] is not None else ""))
        if r["baseline"]:
            test = ""
        elif r["test"] is None:
            test = "[dim]no test (needs ≥2 seeds each)[/dim]" if r["delta"] is not None else "-"
        else:
            color = {"better": "green", "worse": "red"}.get(r["verdict"], "dim")
            word = {"better": "yes, better", "worse": "yes, worse", "noise": "no"}[r["verdict"]]
            test = f"[{color}]{word}[/{color}] ({r['test']}, p={r['p_value']:.3g})"
        tps = "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}"
        t.add_row(label, seeds, params, value, delta, test, tps, _status_cell(r["status"]))
    console.print(t)
    for note in getattr(rows, "notes", []):
        console.print(f"note: {escape(note)}", soft_wrap=True)
