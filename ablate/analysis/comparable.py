"""Which runs may share a table (mixed settings refuse a comparison), which runs are kept
(--where filters), and which metric is compared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from ablate.analysis.load import CompareError, Run, number
from ablate.config.schema import AXES
from ablate.names import VARIANT_MODEL_KEYS, metric_name, names_variant

ABSENT = "(absent)"


def is_variant_key(key: str) -> bool:
    """May this config key differ between the runs of one table? Keys under an axis group
    (norm.*, act.*, pos.base, attn.kv_group, dropout.rate, ...) and the model keys that change
    the block rather than its size or its training (VARIANT_MODEL_KEYS: the stability options,
    swept like axes; presets such as arch=vaswani set some of them). Everything else (model
    size, train.*, data.*, tokenizer.*) must be equal, unless a sweep in the table swept it."""
    return key.split(".", 1)[0] in AXES or key in VARIANT_MODEL_KEYS


def setting(config: dict, key: str) -> str:
    return json.dumps(config[key], sort_keys=True) if key in config else ABSENT


def shown_setting(value: str) -> str:
    return value if value == ABSENT else str(json.loads(value))


def alike(runs: Sequence[Run]) -> set[str]:
    """The config keys set to one value in every run that has a config (absent counts as a value)."""
    configs = [r.config for r in runs if r.config]
    keys = set().union(*configs) if configs else set()
    return {k for k in keys if len({setting(c, k) for c in configs}) == 1}


def mixed_settings(runs: Sequence[Run]) -> dict[str, dict[str, int]]:
    """Settings that differ between runs but are neither a variant key nor swept by a sweep
    among them (a key that differs between the jobs of one sweep directory is what that sweep
    swept, e.g. train.lr=1e-3,3e-3): key -> {value shown: runs}. Empty when the runs compare."""
    swept: set[str] = set()
    by_sweep: dict[Path, list[Run]] = {}
    for r in runs:
        if r.config and r.record.sweep:
            by_sweep.setdefault(r.dir.parent, []).append(r)
    for rs in by_sweep.values():
        swept |= set().union(*(r.config for r in rs)) - alike(rs)
    configs = [r.config for r in runs if r.config]
    out: dict[str, dict[str, int]] = {}
    for key in sorted(set().union(*configs) if configs else ()):
        if not names_variant(key) or is_variant_key(key) or key in swept:
            continue
        counts: dict[str, int] = {}
        for c in configs:
            v = shown_setting(setting(c, key))
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
    a, w = number(actual), number(wanted)
    return a is not None and w is not None and not isinstance(actual, bool) and a == w


def _lookup(run: Run, key: str) -> tuple[bool, Any]:
    """(found, value) of `key` for a run: an axis name (its option), `variant`, `seed`, `status`,
    or any config key (train.steps)."""
    if key in AXES:
        axes = run.record.axes or {}
        if key in axes:
            return True, axes[key]
        if f"{key}.name" in run.config:
            return True, run.config[f"{key}.name"]
        return False, None
    if key in ("variant", "status"):
        return True, run.status if key == "status" else run.record.variant
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


def resolve_metric(metric: str, runs: list[Run]) -> str:
    metric = metric_name(metric)
    if not any(r.value(metric) is not None for r in runs):
        names = sorted(set().union(*(r.metric_names() for r in runs)))
        raise CompareError(f"no run has the metric '{metric}'; available: {', '.join(names)}")
    return metric
