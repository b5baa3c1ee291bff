"""Runs grouped by variant (a variant's runs are its seeds), their labels, the baseline and why
it was chosen, and a study sweep's ladder of rungs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from ablate.analysis.comparable import alike
from ablate.analysis.load import CompareError, Run
from ablate.names import names_variant, override_key

MULTIRUN = "multirun.yaml"  # a sweep dir's composed config; a study's job list is in it


@dataclass
class Group:
    runs: list[Run]
    label: str = ""
    values: dict = field(default_factory=dict)  # seed -> metric value (completed runs only)
    prev: Optional["Group"] = None  # a study rung: the rung before it in the same sweep
    ref: Optional["Group"] = None  # what it is compared with: the baseline (its level's, when crossed)
    baseline: bool = False  # a baseline (one per level of a crossed axis)

    def first(self, read: Callable[[Run], Any]) -> Any:
        """The first of its runs' values that is known (`read`: a run's value from its record)."""
        return next((v for v in map(read, self.runs) if v is not None), None)


def label_groups(groups: list[Group]) -> None:
    """Readable names: a sweep's own variant names; for a single run, its overrides that name a
    variant less those set alike in every run compared ("baseline" when none are left), so a run
    beside a sweep is not named by the settings it shares with the sweep."""
    same = alike([r for g in groups for r in g.runs]) if len(groups) > 1 else None
    for g in groups:
        r = g.runs[0]
        if r.record.sweep or same is None or not r.config:
            g.label = str(r.record.variant or r.dir.name)
        else:
            g.label = ",".join(o for o in (r.record.overrides or [])
                               if names_variant(o) and not _set_alike(o, r.config, same)) or "baseline"
    seen: dict[str, int] = {}
    for g in groups:  # same name, different config (two sweeps' baselines): keep them apart
        n = seen[g.label] = seen.get(g.label, 0) + 1
        if n > 1:
            sweep = g.runs[0].record.sweep
            g.label = f"{g.label} [{sweep}]" if sweep else f"{g.label} ({n})"


def _set_alike(override: str, config: dict, same: set) -> bool:
    """Every config key the override sets (a group's, for `model=small`) is in `same`."""
    key = override_key(override)
    keys = [k for k in config if k == key or k.startswith(key + ".")]
    return bool(keys) and all(k in same for k in keys)


def pick_baseline(groups: list[Group], baseline: Optional[str],
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
               [g for g in groups if any(r.record.variant == baseline for r in g.runs)]
        if len(hits) != 1:
            names = ", ".join(g.label for g in groups)
            why = "matches no variant" if not hits else "matches several variants"
            raise CompareError(f"--baseline {baseline}: {why}; variants: {names}")
        return hits[0], "--baseline"
    from ablate.config.axes import default_axes

    base_axes = default_axes()
    named = [g for g in groups if g.label == "baseline"]
    if len(named) == 1:
        g = named[0]
        if g.runs[0].record.axes == base_axes:
            return g, "no axis changed"
        if g.runs[0].record.sweep:
            return g, "the sweep's baseline job: every swept key at its first value"
        return g, "no override beyond those every run shares"
    cands = named or [g for g in groups if g.runs[0].record.axes == base_axes]
    reason = "no axis changed"
    if len(cands) > 1:  # the one with the fewest extra overrides, if that is unique
        fewest = min(len(g.runs[0].record.overrides or []) for g in cands)
        cands = [g for g in cands if len(g.runs[0].record.overrides or []) == fewest]
        reason = "no axis changed; fewest other overrides"
    if len(cands) == 1:
        return cands[0], reason
    if len(groups) > 1:
        notes.append("no baseline: " + ("several variants have no axis change" if cands else
                     "every variant changes an axis") + "; pick one with --baseline DIR_OR_VARIANT")
    return None, None


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


def study_ladder(groups: list[Group], notes: list[str]) -> list[Group]:
    """The groups that are rungs of a study sweep, in ladder order; each gets `prev`, the rung
    before it in the same sweep (a missing rung is skipped, with a note)."""
    cache: dict = {}
    rungs: dict[tuple, Group] = {}
    sweeps: list[Path] = []
    for g in groups:
        r = g.runs[0]
        names, name = _ladder(r.dir.parent, cache), r.record.variant
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
