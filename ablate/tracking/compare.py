"""`ablate compare`: read run directories, group runs by variant, and say which differences are
bigger than seed noise, without claiming more than the seeds support.

Local files are the source of truth (summary.json, metrics.jsonl, config.yaml); nothing here
touches the trainer or W&B. Used by the CLI and at the end of `ablate sweep`:

    rows = compare_dirs([sweep_dir], metric="val_loss")   # a list of dicts, one per variant
    print_comparison(rows)

A variant is a config minus its seeds (and minus keys that do not change what is trained);
its runs are the seeds. Runs that differ in anything but variant keys (is_variant_key: the
axis groups and the model's stability keys) and keys a sweep among them swept are refused
(mixed_settings), since their deltas would mix effects. The baseline is the variant with no
axis change, a study's first rung, or `baseline=`; the reason is kept (baseline_reason).

A variant is tested against the baseline with a paired t-test over the seeds both completed
when there are at least two (same seed => same init and batches, so pairing removes shared
noise; a diverged seed leaves the pairing, and the row says how many seeds its mean covers),
else Welch's t-test; fewer than two seeds on either side gives no test. Every test carries its
confidence interval, an effect size in units of seed noise and the seeds that would detect the
observed difference with 80% power; the p-values of all variants are Holm-corrected, and the
corrected p gives the verdict.

A study sweep (`ablate sweep study=gpt2_to_llama`: its multirun.yaml holds the job list) is a
cumulative ladder: its rungs are shown in ladder order, each also against the rung before it
(delta_prev, p_prev, test_prev, verdict_prev; Holm over the rungs' steps), so each step's own
gain is visible.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

from ablate.config import AXES
from ablate.errors import AblateError
from ablate.vocab import VARIANT_MODEL_KEYS, higher_is_better, metric_name, names_variant
from ablate.report import table_console

SUMMARY, METRICS, CONFIG = "summary.json", "metrics.jsonl", "config.yaml"
MULTIRUN = "multirun.yaml"  # a sweep dir's composed config; a study's job list is in it
ALPHA = 0.05
POWER = 0.8  # "seeds needed": the seeds that detect the observed difference this often
SEEDS_NEEDED_LIMIT = 1000  # beyond this, "seeds needed" is reported as more than the limit
MIN_SEEDS = 3  # fewer seeds in a test: a warning (one or two degrees of freedom say little)
SIZE_NOTE_PCT = 0.5  # a variant whose parameter count differs by more than this (%) is noted


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
    return not names_variant(key)


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


NO_TEST = {"test": None, "t": None, "p_value": None, "df": None, "test_seeds": None,
           "test_delta": None, "ci_low": None, "ci_high": None, "effect": None, "seeds_needed": None}


def seeds_needed(effect: Optional[float], alpha: float = ALPHA, power: float = POWER,
                 paired: bool = True, limit: int = SEEDS_NEEDED_LIMIT) -> Optional[int]:
    """Seeds per variant for a two-sided t-test at `alpha` to detect a true difference of
    `effect` (in units of seed noise: Δ / sd) with probability `power`: the smallest n whose
    power, from the noncentral t distribution, reaches it. Paired: df = n - 1, noncentrality
    effect * sqrt(n); two independent samples of n: df = 2n - 2, effect * sqrt(n / 2).
    None when no n up to `limit` does (a zero effect never does)."""
    from scipy import stats

    if effect is None or math.isnan(effect) or effect == 0:
        return None
    if math.isinf(effect):
        return 2  # no noise at all: the smallest test there is
    for n in range(2, limit + 1):
        df, nc = (n - 1, abs(effect) * math.sqrt(n)) if paired else (2 * n - 2, abs(effect) * math.sqrt(n / 2))
        crit = stats.t.ppf(1 - alpha / 2, df)
        if stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc) >= power:
            return n
    return None


def seed_test(base: dict, other: dict, alpha: float = ALPHA) -> dict:
    """Is mean(other) - mean(base) bigger than seed noise? `base`/`other` map seed -> value.

    Paired t-test on per-seed differences over the seeds both have (when >= 2: a diverged seed
    on one side drops out of the pairing instead of turning the test into Welch), else Welch's
    t-test when both have >= 2 values, else no test. Returns {test, t, p_value, df, test_seeds,
    test_delta, ci_low, ci_high, effect, seeds_needed}: test_seeds are the seeds of `other` in
    the test, test_delta the difference it tested (the mean paired difference, or the
    difference of the means), ci_* its (1 - alpha) confidence interval, effect that difference
    in units of seed noise (sd of the paired differences; Welch: the pooled sd), seeds_needed
    the seeds per variant that would detect it with 80% power at alpha."""
    from scipy import stats

    if len(base) < 2 or len(other) < 2:
        return dict(NO_TEST)
    common = sorted(set(base) & set(other), key=str)
    if len(common) >= 2:
        a, b = [other[s] for s in common], [base[s] for s in common]
        diffs = [x - y for x, y in zip(a, b)]
        mean, sd = _mean_std(diffs)
        n = len(diffs)
        out = {"test": "paired t", "df": n - 1, "test_seeds": _seeds(common), "test_delta": mean}
        if sd == 0:  # identical differences on every seed: no noise to compare against
            effect = 0.0 if mean == 0 else math.copysign(math.inf, mean)
            return {**out, "t": 0.0 if mean == 0 else math.copysign(math.inf, mean),
                    "p_value": 1.0 if mean == 0 else 0.0, "ci_low": mean, "ci_high": mean,
                    "effect": effect, "seeds_needed": seeds_needed(effect, alpha)}
        r = stats.ttest_rel(a, b)
        half = stats.t.ppf(1 - alpha / 2, n - 1) * sd / math.sqrt(n)
        effect = mean / sd  # Cohen's d_z: the difference in units of its seed-to-seed sd
        return {**out, "t": float(r.statistic), "p_value": float(r.pvalue),
                "ci_low": float(mean - half), "ci_high": float(mean + half), "effect": effect,
                "seeds_needed": seeds_needed(effect, alpha)}
    a, b = list(other.values()), list(base.values())
    (ma, sa), (mb, sb) = _mean_std(a), _mean_std(b)
    seeds = _seeds(sorted(other, key=str))
    diff = ma - mb
    out = {"test": "Welch t", "test_seeds": seeds, "test_delta": diff}
    if sa == 0 and sb == 0:
        effect = 0.0 if diff == 0 else math.copysign(math.inf, diff)
        return {**out, "t": 0.0 if diff == 0 else math.copysign(math.inf, diff),
                "p_value": 1.0 if diff == 0 else 0.0, "df": None, "ci_low": diff, "ci_high": diff,
                "effect": effect, "seeds_needed": seeds_needed(effect, alpha, paired=False)}
    r = stats.ttest_ind(a, b, equal_var=False)
    va, vb = sa ** 2 / len(a), sb ** 2 / len(b)  # Welch-Satterthwaite degrees of freedom
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = stats.t.ppf(1 - alpha / 2, df) * math.sqrt(va + vb)
    pooled = math.sqrt(((len(a) - 1) * sa ** 2 + (len(b) - 1) * sb ** 2) / (len(a) + len(b) - 2))
    effect = diff / pooled  # Cohen's d
    return {**out, "t": float(r.statistic), "p_value": float(r.pvalue), "df": df,
            "ci_low": float(diff - half), "ci_high": float(diff + half), "effect": effect,
            "seeds_needed": seeds_needed(effect, alpha, paired=False)}


def holm(p_values: Sequence[Optional[float]]) -> list[Optional[float]]:
    """Holm-Bonferroni adjusted p-values (None stays None): the k-th smallest of m is
    multiplied by m - k + 1, made monotone and capped at 1. Rejecting where the adjusted p is
    below alpha keeps the chance of any false "better/worse" among the m tests below alpha."""
    idx = sorted((i for i, p in enumerate(p_values) if p is not None), key=lambda i: p_values[i])
    m, out, running = len(idx), list(p_values), 0.0
    for k, i in enumerate(idx):
        running = max(running, min(1.0, (m - k) * p_values[i]))
        out[i] = running
    return out


def verdict(direction: Optional[float], p_value: Optional[float], metric: str,
            alpha: float = ALPHA) -> Optional[str]:
    """better / worse (p < alpha, in the metric's direction) or noise; None without a test.
    `direction`: the sign of the difference the test saw (its t), which can differ from the
    all-seeds delta when the pairing leaves seeds out."""
    if direction is None or p_value is None:
        return None
    if p_value >= alpha or direction == 0:
        return "noise"
    higher = higher_is_better(metric)
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


def _key(name: str, prev: bool) -> str:
    """A row key, or its against-the-previous-rung twin (delta_prev, p_prev, test_prev, ...)."""
    return name if not prev else ("p_prev" if name == "p_value" else f"{name}_prev")


class Comparison(list):
    """The rows (one dict per variant, baseline first) plus what the table needs around them."""

    def __init__(self, rows: Iterable[dict], metric: str, baseline: Optional[str],
                 notes: list[str], groups: list[Group], alpha: float):
        super().__init__(rows)
        self.metric, self.baseline, self.notes, self.groups, self.alpha = metric, baseline, notes, groups, alpha
        self.baseline_reason: Optional[str] = None  # why `baseline` was chosen
        self.mixed: dict[str, dict[str, int]] = {}  # settings the runs do not share (--allow-mixed)


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


def _pick_baseline(groups: list[Group], baseline: Optional[str],
                   notes: list[str]) -> tuple[Optional[Group], Optional[str]]:
    """The baseline group and why it was chosen (shown as "baseline: X (why)")."""
    if baseline:
        path = Path(baseline)
        if path.exists():
            target = path.resolve()
            hits = [g for g in groups if any(r.dir == target or target in r.dir.parents for r in g.runs)]
            if len(hits) != 1:
                what = "no compared run" if not hits else f"runs of {len(hits)} variants"
                raise CompareError(f"--baseline {baseline}: that directory holds {what}; "
                                   "give one run directory or a variant name")
            return hits[0], "--baseline"
        hits = [g for g in groups if g.label == baseline] or \
               [g for g in groups if any(r.summary.get("variant") == baseline for r in g.runs)]
        if len(hits) != 1:
            names = ", ".join(g.label for g in groups)
            why = "matches no variant" if not hits else "matches several variants"
            raise CompareError(f"--baseline {baseline}: {why}; variants: {names}")
        return hits[0], "--baseline"
    from ablate.axes import default_axes

    base_axes = default_axes()
    named = [g for g in groups if g.label == "baseline"]
    if len(named) == 1:
        g = named[0]
        if g.runs[0].summary.get("axes") == base_axes:
            return g, "no axis changed"
        if g.runs[0].summary.get("sweep"):
            return g, "the sweep's baseline job: every swept key at its first value"
        return g, "no override beyond those every run shares"
    cands = named or [g for g in groups if g.runs[0].summary.get("axes") == base_axes]
    reason = "no axis changed"
    if len(cands) > 1:  # the one with the fewest extra overrides, if that is unique
        fewest = min(len(g.runs[0].summary.get("overrides") or []) for g in cands)
        cands = [g for g in cands if len(g.runs[0].summary.get("overrides") or []) == fewest]
        reason = "no axis changed; fewest other overrides"
    if len(cands) == 1:
        return cands[0], reason
    if len(groups) > 1:
        notes.append("no baseline: " + ("several variants have no axis change" if cands else
                     "every variant changes an axis") + "; pick one with --baseline DIR_OR_VARIANT")
    return None, None


# ---- which runs may share a table -------------------------------------------------------------
ABSENT = "(absent)"


def is_variant_key(key: str) -> bool:
    """May this config key differ between the runs of one table? Keys under an axis group
    (norm.*, act.*, pos.base, attn.kv_group, dropout.rate, ...) and the model keys that change
    the block rather than its size or its training (VARIANT_MODEL_KEYS: the stability options,
    swept like axes; presets such as arch=vaswani set some of them). Everything else (model
    size, train.*, data.*, tokenizer.*) must be equal, unless a sweep in the table swept it."""
    return key.split(".", 1)[0] in AXES or key in VARIANT_MODEL_KEYS


def _setting(config: dict, key: str) -> str:
    return json.dumps(config[key], sort_keys=True) if key in config else ABSENT


def _shown(value: str) -> str:
    return value if value == ABSENT else str(json.loads(value))


def mixed_settings(runs: Sequence[Run]) -> dict[str, dict[str, int]]:
    """Settings that differ between runs but are neither a variant key nor swept by a sweep
    among them (a key that differs between the jobs of one sweep directory is what that sweep
    swept, e.g. train.lr=1e-3,3e-3): key -> {value shown: runs}. Empty when the runs compare."""
    swept: set[str] = set()
    by_sweep: dict[Path, list[Run]] = {}
    for r in runs:
        if r.config and r.summary.get("sweep"):
            by_sweep.setdefault(r.dir.parent, []).append(r)
    for rs in by_sweep.values():
        keys = set().union(*(r.config for r in rs))
        swept |= {k for k in keys if len({_setting(r.config, k) for r in rs}) > 1}
    configs = [r.config for r in runs if r.config]
    out: dict[str, dict[str, int]] = {}
    for key in sorted(set().union(*configs) if configs else ()):
        if _non_variant(key) or is_variant_key(key) or key in swept:
            continue
        counts: dict[str, int] = {}
        for c in configs:
            v = _shown(_setting(c, key))
            counts[v] = counts.get(v, 0) + 1
        if len(counts) > 1:
            out[key] = counts
    return out


def describe_mixed(mixed: dict[str, dict[str, int]]) -> str:
    """train.steps (10 in 1 run, 20 in 6 runs); model.d_model (...)"""
    def one(key, counts):
        parts = [f"{v} in {n} run{'s' if n != 1 else ''}" for v, n in counts.items()]
        return f"{key} ({', '.join(parts)})"

    return "; ".join(one(k, c) for k, c in mixed.items())


# ---- --where filters --------------------------------------------------------------------------
def _same(actual: Any, wanted: str) -> bool:
    if actual is None:
        return wanted.lower() in ("null", "none")
    if str(actual).lower() == wanted.lower():
        return True
    a, w = _number(actual), _number(wanted)
    return a is not None and w is not None and not isinstance(actual, bool) and a == w


def _lookup(run: Run, key: str) -> tuple[bool, Any]:
    """(found, value) of `key` for a run: an axis name (its option), `variant`, `seed`, `status`,
    or any config key (train.steps)."""
    if key in AXES:
        axes = run.summary.get("axes") or {}
        if key in axes:
            return True, axes[key]
        if f"{key}.name" in run.config:
            return True, run.config[f"{key}.name"]
        return False, None
    if key in ("variant", "status"):
        return True, run.status if key == "status" else run.summary.get("variant")
    if key in run.config:
        return True, run.config[key]
    if key in run.summary and not isinstance(run.summary[key], (dict, list)):
        return True, run.summary[key]
    return False, None


def filter_runs(runs: list[Run], where: Sequence[str]) -> list[Run]:
    """The runs that match every `KEY=VALUE` (the same key given twice, or `KEY=a,b`: any of
    them). KEY: an axis (norm=rmsnorm), variant, seed, status, or a config key (train.steps=300)."""
    wanted: dict[str, list[str]] = {}
    for w in where:
        key, sep, value = w.partition("=")
        key = key.strip()
        if not sep or not key or not value.strip():
            raise CompareError(f"--where {w}: expected KEY=VALUE, e.g. --where norm=rmsnorm "
                               "or --where train.steps=300")
        wanted.setdefault(key, []).extend(v.strip() for v in value.split(","))
    for key in wanted:
        if not any(_lookup(r, key)[0] for r in runs):
            raise CompareError(f"--where {key}=...: no run has '{key}'; use an axis "
                               f"({', '.join(AXES)}), variant, seed, status or a config key such as train.steps")
    kept = [r for r in runs if all(any(_same(_lookup(r, k)[1], v) for v in vs) and _lookup(r, k)[0]
                                   for k, vs in wanted.items())]
    if not kept:
        raise CompareError(f"no run matches --where {' --where '.join(where)} "
                           f"(of {len(runs)} runs found)")
    return kept


def _resolve_metric(metric: str, runs: list[Run]) -> str:
    metric = metric_name(metric)
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
    """`g` against `ref`: delta of the means and the seed test (the verdict comes after the
    Holm correction, over every variant compared with the same reference)."""
    mean = _mean_std(list(g.values.values()))[0]
    ref_mean = _mean_std(list(ref.values.values()))[0] if ref is not None and ref is not g else None
    delta = None if mean is None or ref_mean is None else mean - ref_mean
    test = seed_test(ref.values, g.values, alpha) if delta is not None else dict(NO_TEST)
    return {"delta": delta, "delta_pct": (100 * delta / ref_mean) if delta is not None and ref_mean else None,
            **test, "few_seeds": test["test"] is not None and len(test["test_seeds"]) < MIN_SEEDS}


def _correct(rows: list[dict], metric: str, alpha: float, prev: bool) -> None:
    """Holm over the tests of one family (every variant vs the baseline; or every rung vs the
    rung before it); the corrected p decides the verdict."""
    k = (lambda n: _key(n, prev))
    family = [r for r in rows if k("p_value") in r]
    for r, p in zip(family, holm([r[k("p_value")] for r in family])):
        r[k("p_holm")] = p
        r[k("verdict")] = verdict(r[k("t")], p, metric, alpha)


def compare_dirs(paths: Sequence[Path | str], metric: str = "val_loss",
                 baseline: Optional[str] = None, alpha: float = ALPHA,
                 warn: Callable[[str], None] = _warn, where: Sequence[str] = (),
                 allow_mixed: bool = False) -> Comparison:
    """Compare every run under `paths`; one dict per variant, the baseline first (a study's
    rungs in ladder order, each also against the rung before it: delta_prev, p_prev, ...).
    Runs that differ in more than variant keys and seed are refused (CompareError naming the
    keys) unless `allow_mixed`; `where` keeps only the runs that match (see filter_runs)."""
    runs = find_runs(paths, warn)
    if where:
        runs = filter_runs(runs, where)
    mixed = mixed_settings(runs)
    if mixed and not allow_mixed:
        raise CompareError(
            f"these runs differ in more than axis options and seed, so their deltas would mix "
            f"effects: {describe_mixed(mixed)}; compare like with like (e.g. --where "
            f"{next(iter(mixed))}=VALUE) or pass --allow-mixed")
    metric = _resolve_metric(metric, runs)
    by_key: dict[tuple, Group] = {}
    for r in runs:
        by_key.setdefault(r.variant_key(), Group([])).runs.append(r)
    groups = list(by_key.values())
    _labels(groups)
    notes: list[str] = []
    unchecked = sum(1 for r in runs if not r.config)
    if unchecked and len(runs) > 1:
        notes.append(f"{unchecked} run(s) have no {CONFIG}: not checked for settings that differ")
    ladder = _study(groups, notes)
    if ladder and baseline is None and not any(g.label == "baseline" for g in groups):
        base, reason = ladder[0], "the study's first rung"  # a study's starting point
    else:
        base, reason = _pick_baseline(groups, baseline, notes)
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
        p_pct = (100 * p_delta / base_params) if p_delta is not None else None
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
            "params": params, "params_delta": p_delta, "params_delta_pct": p_pct,
            "size_differs": p_pct is not None and abs(p_pct) > SIZE_NOTE_PCT,
            "flops_per_token": g.first("flops_per_token"),
            "tokens_per_s": (sum(tps) / len(tps)) if tps else None,
            "axes": g.runs[0].summary.get("axes"),
            "dirs": [str(r.dir) for r in g.runs],
        }
        if id(g) in in_ladder:  # the step this rung adds: against the rung before it
            row["prev"] = g.prev.label if g.prev else None
            row.update({_key(k, True): v for k, v in _versus(g.prev, g, metric, alpha).items()})
        rows.append(row)
    _correct(rows, metric, alpha, prev=False)
    _correct([r for r in rows if "prev" in r], metric, alpha, prev=True)
    few = [f"{r['variant']} ({len(r['test_seeds'])})" for r in rows if r["few_seeds"]]
    if few:
        notes.append(f"fewer than {MIN_SEEDS} seeds in the test: " + ", ".join(few) + "; with one or "
                     "two degrees of freedom the noise estimate is rough, so read the interval, "
                     "not the verdict (run --seeds 3 or more)")
    sized = [f"{r['variant']} ({r['params_delta']:+,} params, {r['params_delta_pct']:+.2f}%)"
             for r in rows if r["size_differs"]]
    if sized:
        notes.append(f"differs in size from the baseline by more than {SIZE_NOTE_PCT:g}%, so part of "
                     "its delta may be capacity: " + "; ".join(sized))
    cmp = Comparison(rows, metric, base.label if base else None, notes, groups, alpha)
    cmp.baseline_reason, cmp.mixed = reason, mixed
    for row in rows:
        row["mixed"] = sorted(mixed)  # --allow-mixed: the settings the rows do not share
        row["baseline_reason"] = reason if row["baseline"] else None
    return cmp


# ---- output --------------------------------------------------------------------------------------
FORMATS = ("table", "csv", "markdown", "latex")


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


def per_seed_rows(cmp: Comparison) -> list[dict]:
    """One dict per run (--per-seed): its variant, seed, status, final value, and its difference
    from the baseline's run with the same seed (what the paired test averages)."""
    base = next((g for g, r in zip(cmp.groups, cmp) if r["baseline"]), None)
    out = []
    for g, row in zip(cmp.groups, cmp):
        for r in sorted(g.runs, key=lambda r: str(r.seed)):
            v = g.values.get(r.seed) if r.status == "completed" else None
            ref = base.values.get(r.seed) if base is not None and g is not base else None
            out.append({"variant": row["variant"], "baseline": row["baseline"], "seed": r.seed[0],
                        "status": r.status if r.status != "completed" or v is not None else f"no {cmp.metric}",
                        "metric": cmp.metric, "value": v,
                        "delta": (v - ref) if v is not None and ref is not None else None,
                        "params": _number(r.summary.get("params")),
                        "tokens_per_s": _number(r.summary.get("tokens_per_s")), "dir": str(r.dir)})
    return out


def header_lines(cmp: Any) -> list[str]:
    """What to read before the table: the baseline and why; the settings the runs do not share."""
    lines = []
    if getattr(cmp, "mixed", None):
        lines.append(f"MIXED (--allow-mixed): the runs also differ in {describe_mixed(cmp.mixed)}; "
                     "a delta here is not the effect of the variant alone")
    if getattr(cmp, "baseline", None):
        lines.append(f"baseline: {cmp.baseline} ({cmp.baseline_reason})")
    return lines


def _n(v: Optional[float], spec: str, default: str = "-") -> str:
    return default if v is None else format(v, spec)


def _pct(v: Optional[float]) -> str:
    return "" if v is None else f" ({v:+.2f}%)"


def _needed(r: dict, prev: bool = False) -> str:
    n = r.get(_key("seeds_needed", prev))
    if n is not None:
        return str(n)
    if r.get(_key("test", prev)) is None:
        return "-"
    return "∞" if r.get(_key("effect", prev)) == 0 else f">{SEEDS_NEEDED_LIMIT}"


def _effect(r: dict, prev: bool = False) -> str:
    e = r.get(_key("effect", prev))
    if e is None:
        return "-"
    return f"{'+' if e > 0 else '-'}inf σ" if math.isinf(e) else f"{e:+.2f}σ"


def _ci(r: dict, prev: bool = False) -> str:
    lo, hi = r.get(_key("ci_low", prev)), r.get(_key("ci_high", prev))
    return "-" if lo is None else f"[{lo:+.4f}, {hi:+.4f}]"


def _p(r: dict, prev: bool = False) -> str:
    p, ph = r.get(_key("p_value", prev)), r.get(_key("p_holm", prev))
    return "-" if p is None else f"{p:.3g} ({ph:.3g})"


def _word(r: dict, prev: bool = False) -> str:
    v = r.get(_key("verdict", prev))
    if v is None:
        return "no test" if r.get(_key("delta", prev)) is not None else "-"
    return {"better": "yes, better", "worse": "yes, worse", "noise": "no"}[v] + \
        (f" ({len(r[_key('test_seeds', prev)])} seeds)" if r.get(_key("few_seeds", prev)) else "")


def _skip(r: dict, prev: bool) -> bool:
    return (r.get("prev") is None) if prev else r["baseline"]


def _name(r: dict) -> str:
    return r["variant"] + (" (baseline)" if r["baseline"] and r["variant"] != "baseline" else "")


def plain_table(cmp: Any, per_seed: bool = False) -> tuple[list[str], list[list[str]]]:
    """Headers and cells as plain text (markdown and LaTeX are this table)."""
    metric = getattr(cmp, "metric", cmp[0]["metric"] if cmp else "metric")
    if per_seed:
        heads = ["variant", "seed", "status", metric, "Δ vs baseline (same seed)", "params", "tokens/s",
                 "run dir"]
        cells = [[_name(r), str(r["seed"]), r["status"], _n(r["value"], ".4f"),
                  "" if r["baseline"] else _n(r["delta"], "+.4f"), _n(r["params"], ",.0f"),
                  _n(r["tokens_per_s"], ",.0f"), r["dir"]] for r in per_seed_rows(cmp)]
        return heads, cells
    study = any("prev" in r for r in cmp)
    ci = f"{100 * (1 - getattr(cmp, 'alpha', ALPHA)):g}% CI"
    heads = ["variant", "seeds", "params", f"{metric} (mean ± std)", "Δ vs baseline", f"{ci} of Δ",
             "p (Holm)", "beyond seed noise?", "effect (Δ/σ)", "seeds needed"]
    if study:
        heads += ["Δ vs previous rung", ci, "p (Holm)", "step beyond seed noise?"]
    heads += ["tokens/s", "status"]
    cells = []
    for r in cmp:
        seeds = f"{r['n']}" + (f" of {r['runs']}" if r["runs"] != r["n"] else "")
        params = _n(r["params"], ",") + (f" ({r['params_delta_pct']:+.2f}%)" if r["params_delta"] else "")
        value = "-" if r["mean"] is None else \
            f"{r['mean']:.4f}" + (f" ± {r['std']:.4f}" if r["std"] is not None else "")
        row = [_name(r), seeds, params, value]
        row += [""] * 6 if r["baseline"] else [
            _n(r["delta"], "+.4f") + _pct(r["delta_pct"]), _ci(r), _p(r), _word(r), _effect(r), _needed(r)]
        if study:
            row += [""] * 4 if _skip(r, True) else [
                _n(r.get("delta_prev"), "+.4f") + _pct(r.get("delta_pct_prev")), _ci(r, True), _p(r, True),
                _word(r, True)]
        status = "ok" if list(r["status"]) == ["completed"] else \
            ", ".join(f"{n} {st}" for st, n in r["status"].items())
        cells.append(row + [_n(r["tokens_per_s"], ",.0f"), status])
    return heads, cells


def to_csv(cmp: Any, per_seed: bool = False) -> str:
    """Machine-readable: raw numbers, one line per variant (or per run)."""
    import csv
    import io

    if per_seed:
        data = per_seed_rows(cmp)
        fields = list(data[0]) if data else []
    else:
        fields = ["variant", "baseline", "metric", "n", "runs", "mean", "std", "delta", "delta_pct",
                  "test", "test_delta", "ci_low", "ci_high", "t", "df", "p_value", "p_holm", "verdict",
                  "effect", "seeds_needed", "few_seeds", "params", "params_delta", "params_delta_pct",
                  "size_differs", "flops_per_token", "tokens_per_s", "status"]
        if any("prev" in r for r in cmp):
            fields += ["prev", "delta_prev", "ci_low_prev", "ci_high_prev", "p_prev", "p_holm_prev",
                       "verdict_prev", "seeds_needed_prev"]
        data = [{**r, "status": ";".join(f"{n} {st}" for st, n in r["status"].items())} for r in cmp]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in data:
        w.writerow({k: ("" if r.get(k) is None else repr(r[k]) if isinstance(r.get(k), float) else r.get(k))
                    for k in fields})
    return buf.getvalue()


def to_markdown(cmp: Any, per_seed: bool = False) -> str:
    heads, cells = plain_table(cmp, per_seed)
    esc = (lambda c: c.replace("|", "\\|"))
    lines = [f"{line}  " for line in header_lines(cmp)] + ([""] if header_lines(cmp) else [])
    lines += ["| " + " | ".join(map(esc, heads)) + " |",
              "|" + "|".join("---" if h in TEXT_COLUMNS else "--:" for h in heads) + "|"]
    lines += ["| " + " | ".join(map(esc, row)) + " |" for row in cells]
    notes = getattr(cmp, "notes", [])
    return "\n".join(lines + ([""] + [f"- note: {n}" for n in notes] if notes else [])) + "\n"


TEXT_COLUMNS = {"variant", "status", "run dir", "beyond seed noise?", "step beyond seed noise?"}
_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
        "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
        "Δ": r"$\Delta$", "±": r"$\pm$", "σ": r"$\sigma$", "∞": r"$\infty$"}


def _tex(text: str) -> str:
    return "".join(_TEX.get(c, c) for c in text)


def to_latex(cmp: Any, per_seed: bool = False) -> str:
    """A booktabs tabular (\\usepackage{booktabs}); the baseline line and notes as comments."""
    heads, cells = plain_table(cmp, per_seed)
    lines = [f"% {line}" for line in header_lines(cmp)]
    lines += [r"\begin{tabular}{" + "".join("l" if h in TEXT_COLUMNS else "r" for h in heads) + "}", r"\toprule",
              " & ".join(map(_tex, heads)) + r" \\", r"\midrule"]
    lines += [" & ".join(map(_tex, row)) + r" \\" for row in cells]
    lines += [r"\bottomrule", r"\end{tabular}"]
    lines += [f"% note: {n}" for n in getattr(cmp, "notes", [])]
    return "\n".join(lines) + "\n"


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


def _delta_cell(r: dict, prev: bool = False) -> str:
    if _skip(r, prev):
        return ""
    delta, pct = r[_key("delta", prev)], r[_key("delta_pct", prev)]
    if delta is None:
        return "-"
    ci = f"\n[dim]{_ci(r, prev)}[/dim]" if r.get(_key("ci_low", prev)) is not None else ""
    return f"{delta:+.4f}" + _pct(pct) + ci


def _test_cell(r: dict, prev: bool = False) -> str:
    if _skip(r, prev):
        return ""
    test, seeds = r[_key("test", prev)], r[_key("test_seeds", prev)]
    if test is None:
        return "[dim]no test (needs ≥2 seeds each)[/dim]" if r[_key("delta", prev)] is not None else "-"
    v = r[_key("verdict", prev)]
    color = {"better": "green", "worse": "red"}.get(v, "dim")
    word = {"better": "yes, better", "worse": "yes, worse", "noise": "no"}[v]
    if test == "paired t" and len(seeds) < r["n"]:  # a seed missing on the other side
        test += " on seeds " + ",".join(map(str, seeds))
    few = f" [yellow]only {len(seeds)} seeds[/yellow]" if r.get(_key("few_seeds", prev)) else ""
    return (f"[{color}]{word}[/{color}] ({test}, p={r[_key('p_value', prev)]:.3g}, "
            f"Holm p={r[_key('p_holm', prev)]:.3g})" + few)


def _rich_table(cmp: Any, per_seed: bool) -> Any:
    from rich.markup import escape
    from rich.table import Table

    metric = getattr(cmp, "metric", cmp[0]["metric"] if cmp else "metric")
    alpha = getattr(cmp, "alpha", ALPHA)
    if per_seed:
        heads, cells = plain_table(cmp, per_seed=True)
        t = Table(title=f"ablate compare: final {metric}, one row per run", title_justify="left")
        for i, h in enumerate(heads):
            t.add_column(h, **({"style": "bold", "no_wrap": True} if i == 0 else
                               {"justify": "right", "overflow": "fold"} if 0 < i < len(heads) - 1 else
                               {"overflow": "fold"}))
        for row in cells:
            t.add_row(*map(escape, row))
        return t
    study = any("prev" in r for r in cmp)
    t = Table(title=f"ablate compare: final {metric} (mean ± std over seeds)"
              + ("; study: rungs in ladder order, each step vs the previous rung" if study else ""),
              title_justify="left")
    names = [escape(r["variant"]) + (" [dim](baseline)[/dim]" if r["baseline"] and r["variant"] != "baseline" else "")
             for r in cmp]
    right = {"justify": "right", "overflow": "fold"}
    # the variant is never cut: it keeps its full width; every other cell may fold
    columns = [("variant", {"style": "bold", "no_wrap": True,
                            "min_width": max([len(r["variant"]) for r in cmp] + [7])}),
               ("seeds", right), ("params", right), (metric, right),
               (f"Δ vs baseline [{100 * (1 - alpha):g}% CI]", right),
               (f"beyond seed noise? (Holm p<{alpha:g})", {"overflow": "fold"}),
               ("effect (Δ/σ)", right), ("seeds needed (80% power)", right)]
    if study:
        columns += [(f"Δ vs previous rung [{100 * (1 - alpha):g}% CI]", right),
                    ("step beyond seed noise?", {"overflow": "fold"})]
    for name, kw in columns + [("tokens/s", right), ("status", {"overflow": "fold"})]:
        t.add_column(name, **kw)
    for r, label in zip(cmp, names):
        seeds = f"{r['n']}" + (f" of {r['runs']}" if r["runs"] != r["n"] else "")
        params = "-" if r["params"] is None else f"{r['params']:,}"
        if r["params_delta"]:
            color = "yellow" if r["size_differs"] else "dim"
            params += f" [{color}]({r['params_delta_pct']:+.2f}%)[/{color}]"
        if r["mean"] is None:
            value = "-"
        else:
            value = f"{r['mean']:.4f}" + (f" ± {r['std']:.4f}" if r["std"] is not None else "")
        cells = [label, seeds, params, value, _delta_cell(r), _test_cell(r),
                 "" if r["baseline"] else _effect(r), "" if r["baseline"] else _needed(r)]
        if study:
            cells += ["", ""] if "prev" not in r else [_delta_cell(r, True), _test_cell(r, True)]
        tps = "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}"
        t.add_row(*cells, tps, _status_cell(r["status"]))
    return t


def _blocks(cmp: Any, console: Any, per_seed: bool) -> None:
    """The table as one block per row, for a terminal too narrow for its columns: every
    number is kept and nothing is cut (lines wrap at spaces)."""
    from rich.markup import escape

    heads, cells = plain_table(cmp, per_seed)
    console.print(f"ablate compare: final {escape(getattr(cmp, 'metric', heads[3]))}"
                  + (", one block per run" if per_seed else ", one block per variant"),
                  style="italic", highlight=False)
    for row in cells:
        console.print(f"[bold]{escape(row[0])}[/bold]", soft_wrap=True, highlight=False)
        fields = [f"{h}: {c}" for h, c in zip(heads[1:], row[1:]) if c not in ("", "-")]
        console.print(escape("  " + " · ".join(fields)), highlight=False)


def print_comparison(rows: Sequence[dict], console: Any = None, per_seed: bool = False) -> None:
    """The rich table: one line per variant, the baseline first (a study: its rungs in ladder
    order, with each rung's step against the one before it); the baseline and why above it,
    notes below it. `per_seed`: one line per run. A terminal narrower than the table gets one
    block per variant instead (a squeezed table would fold every number)."""
    from rich.markup import escape
    from rich.measure import Measurement

    console = console or table_console()  # on a TTY the variant column is never shrunk
    for line in header_lines(rows):
        console.print(escape(line), soft_wrap=True, highlight=False,
                      style="bold yellow" if line.startswith("MIXED") else None)
    table = _rich_table(rows, per_seed)
    if Measurement.get(console, console.options.update(max_width=100_000), table).maximum > console.width:
        _blocks(rows, console, per_seed)
    else:
        console.print(table)
    for note in getattr(rows, "notes", []):
        console.print(f"note: {escape(note)}", soft_wrap=True, highlight=False)


def render(cmp: Any, fmt: str = "table", per_seed: bool = False) -> str:
    """csv / markdown / latex as text (the table format prints through rich instead)."""
    if fmt not in FORMATS or fmt == "table":
        raise CompareError(f"--format {fmt}: choose one of {', '.join(FORMATS)}")
    return {"csv": to_csv, "markdown": to_markdown, "latex": to_latex}[fmt](cmp, per_seed)
