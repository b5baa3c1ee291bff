"""Two crossed axes: which runs form a grid of two axes A x B, each run's cell, and which
differences between runs the grid explains.

Runs are crossed by a `--mode grid` sweep of two keys (read from the sweep's multirun.yaml: its
mode and the order of its swept keys) or by `compare --cross A,B`. An axis is any key a run's
overrides set (`qk_norm`, `optim`, `arch`, `train.beta2`): a run's level is its override's value,
else its axis option, else its config's value, so a run made without the override (the default)
takes its place in the grid too. A crossed axis stratifies: the runs of A are compared within
each level of B, one baseline per level (A's first level). A setting that differs between runs
must follow one crossed axis (the same value at each of its levels: `optim=muon` bringing its own
learning rate, `arch=llama` its norm); anything else is mixed, as in any comparison.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from ablate.analysis.comparable import setting, shown_setting
from ablate.analysis.load import CompareError, Run
from ablate.names import SEED_KEYS, names_variant, override_key

MULTIRUN = "multirun.yaml"


@dataclass(frozen=True)
class Factor:
    """One crossed axis: its key and its levels, the baseline (or reference) level first."""

    key: str
    levels: tuple[str, ...]

    def name(self, level: str) -> str:
        return f"{self.key}={level}"

    @property
    def first(self) -> str:
        return self.levels[0]


@dataclass
class Crossing:
    """A (the axis whose Δ is read) crossed with B (the axis it is read under): every run's cell."""

    a: Factor
    b: Factor
    how: str  # "a --mode grid sweep" or "--cross"
    cells: dict = field(default_factory=dict)  # run dir -> (a level, b level)
    exclude: tuple = ()  # keys the report itself varies (an LR grid's train.lr)
    grid: Optional["GridSweep"] = None  # the one --mode grid sweep the runs are jobs of

    def cell(self, run: Run) -> tuple[str, str]:
        return self.cells[run.dir]

    def label(self, a: str, b: str) -> str:
        """A cell's name, as a grid sweep names its job: `qk_norm=on,norm=rmsnorm`."""
        return f"{self.a.name(a)},{self.b.name(b)}"

    @property
    def title(self) -> str:
        return f"{self.a.key} × {self.b.key}"

    @property
    def why(self) -> str:
        """Why each level of B has its own baseline (the comparison's first line)."""
        return (f"{self.a.key}'s first level; {self.title} crossed by {self.how}, so {self.a.key} is "
                f"compared within each level of {self.b.key}")

    def rebase(self, a: str, b: str) -> None:
        """Make (a, b) the baseline cell."""
        self.a = Factor(self.a.key, (a,) + tuple(x for x in self.a.levels if x != a))
        self.b = Factor(self.b.key, (b,) + tuple(x for x in self.b.levels if x != b))

    def rebase_to(self, baseline: str, runs: Sequence[Run]) -> None:
        """--baseline: a cell's name (`qk_norm=on,norm=rmsnorm`), its runs' variant name, or one
        of its runs' directories becomes the baseline cell: its level of A the baseline level, its
        level of B the reference."""
        path = Path(baseline)
        target = path.resolve() if path.exists() else None
        hits = {self.cell(r) for r in runs
                if (target is not None and (r.dir == target or target in r.dir.parents))
                or baseline in (r.record.variant, self.label(*self.cell(r)))}
        if len(hits) != 1:
            cells = ", ".join(self.label(a, b) for a in self.a.levels for b in self.b.levels)
            raise CompareError(f"--baseline {baseline}: " + ("matches no cell" if not hits else "matches several cells")
                               + f" of the grid {self.title}; cells: {cells}")
        self.rebase(*hits.pop())


# ---- a run's level of an axis ---------------------------------------------------------------------
def canonical(value: Any) -> str:
    """A level as one string, whichever record it was read from: `1e-3` (an override) and 0.001
    (a config) are one level; true and True too."""
    if isinstance(value, bool):
        return str(value).lower()
    text = str(value).strip()
    if text.lower() in ("true", "false"):
        return text.lower()
    try:
        return format(float(text), "g")
    except ValueError:
        return text


def level_of(run: Run, key: str) -> Optional[str]:
    """The run's level of `key`: its override's value, else its axis option (record), else its
    config's value (or the group's `name`); None when none of them says."""
    from ablate.config.schema import AXES

    for o in run.record.overrides or []:
        k, sep, v = o.lstrip("+~").partition("=")
        if sep and k == key:
            return canonical(v)
    if key in AXES and (run.record.axes or {}).get(key) is not None:
        return canonical(run.record.axes[key])
    for k in (key, f"{key}.name"):
        if k in run.config and not isinstance(run.config[k], (dict, list)):
            return canonical(run.config[k])
    return None


def _override_keys(runs: Sequence[Run], exclude: Sequence[str]) -> list[str]:
    """The keys the runs' overrides set that can name a variant, in the order first met."""
    keys: dict[str, None] = {}
    for r in runs:
        for o in r.record.overrides or []:
            k = override_key(o)
            if names_variant(k) and k not in SEED_KEYS and k not in exclude:
                keys.setdefault(k, None)
    return list(keys)


def levels(runs: Sequence[Run], key: str) -> list[Optional[str]]:
    """The levels of `key` among the runs, in the order first met (runs are in job order)."""
    return list(dict.fromkeys(level_of(r, key) for r in runs))


def varying(runs: Sequence[Run], keys: Sequence[str]) -> list[str]:
    return [k for k in keys if len(levels(runs, k)) > 1]


# ---- a --mode grid sweep ----------------------------------------------------------------------------
@dataclass(frozen=True)
class GridSweep:
    """What a grid sweep's multirun.yaml says: its directory, its overrides in the order given, seeds
    and LR grid (for the command that re-runs it)."""

    dir: Path
    task: tuple[str, ...]
    seeds: Optional[int]
    lr_grid: Optional[str]

    def keys(self) -> list[str]:
        return [override_key(t) for t in self.task]

    def command(self, seeds: Optional[int] = None) -> str:
        """The sweep's own command (with `seeds`, more of them): run again, it trains only the
        jobs it lacks."""
        seeds = seeds or self.seeds
        parts = ["ablate", "sweep", *map(shlex.quote, self.task), "--mode", "grid"]
        parts += ["--seeds", str(seeds)] if seeds else []
        parts += ["--lr-grid", self.lr_grid] if self.lr_grid else []
        return " ".join(parts + [shlex.quote(f"hydra.sweep.dir={_shown_path(self.dir)}")])


def _shown_path(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def _read_grid(sweep_dir: Path, cache: dict) -> Optional[GridSweep]:
    if sweep_dir not in cache:
        import yaml

        grid = None
        try:
            multirun = yaml.safe_load((sweep_dir / MULTIRUN).read_text(encoding="utf-8"))
            sweeper = multirun["hydra"]["sweeper"]
            if sweeper.get("mode") == "grid" and not sweeper.get("jobs") and not sweeper.get("ladder"):
                grid = GridSweep(sweep_dir, tuple(str(t) for t in multirun["hydra"]["overrides"]["task"] or ()),
                                 sweeper.get("seeds") or None, sweeper.get("lr_grid"))
        except (OSError, ValueError, yaml.YAMLError, TypeError, KeyError, AttributeError):
            pass
        cache[sweep_dir] = grid
    return cache[sweep_dir]


def grid_sweeps(runs: Sequence[Run]) -> list[GridSweep]:
    """The --mode grid sweeps the runs are jobs of; [] unless every run is a job of one."""
    cache: dict = {}
    found: dict[Path, GridSweep] = {}
    for r in runs:
        grid = _read_grid(r.dir.parent, cache) if r.record.sweep else None
        if grid is None:
            return []
        found.setdefault(grid.dir, grid)
    return list(found.values())


# ---- which two axes ---------------------------------------------------------------------------------
def parse_cross(text: str) -> tuple[str, str]:
    keys = [k.strip() for k in str(text).split(",")]
    if len(keys) != 2 or not all(keys) or keys[0] == keys[1]:
        raise CompareError(f"--cross {text}: name two different axes, A,B (e.g. --cross qk_norm,norm: "
                           "the Δ of qk_norm under each level of norm)")
    return keys[0], keys[1]


def _not_varied(runs: Sequence[Run], key: str, varied: list[str]) -> str:
    found = [v for v in levels(runs, key) if v is not None]
    has = f"every run has {key}={found[0]}" if len(found) == 1 else f"no run sets {key}"
    return (f"--cross {key}: the runs do not vary {key} ({has}); they vary "
            + (", ".join(varied) if varied else "nothing but the seed"))


def find_crossing(runs: Sequence[Run], cross: Optional[str], notes: list[str],
                  exclude: Sequence[str] = ()) -> Optional[Crossing]:
    """The grid of two axes the runs form: `cross` (A,B) names it; else a --mode grid sweep of
    two keys is one (a grid of more asks which, in a note). None: an ordinary comparison.
    `exclude`: keys the report varies itself (an LR grid's train.lr)."""
    grids = grid_sweeps(runs)
    if cross is None and not grids:
        return None
    order = [k for g in grids for k in g.keys()]
    keys = _override_keys(runs, exclude)
    keys = sorted(keys, key=lambda k: order.index(k) if k in order else len(order))
    varied = varying(runs, keys)
    if cross is not None:
        a, b = parse_cross(cross)
        for k in (a, b):
            if k in exclude:
                raise CompareError(f"--cross {k}: the report varies {k} itself; cross two other axes")
            if len(levels(runs, k)) < 2:
                raise CompareError(_not_varied(runs, k, varied))
        how = "--cross"
    elif len(varied) == 2:
        (a, b), how = varied, "a --mode grid sweep"
    else:
        if len(varied) > 2:
            notes.append(f"a grid of {len(varied)} axes ({', '.join(varied)}): name the two whose interaction "
                         f"you want with --cross A,B (e.g. --cross {varied[0]},{varied[1]}), the others held "
                         f"at one level with --where")
        return None
    crossing = Crossing(_factor(runs, a, bool(grids)), _factor(runs, b, bool(grids)), how, exclude=tuple(exclude))
    crossing.cells = {r.dir: (level_of(r, a), level_of(r, b)) for r in runs}
    crossing.grid = grids[0] if len(grids) == 1 else None
    _check_cells(runs, crossing, grids)
    return crossing


def _factor(runs: Sequence[Run], key: str, grid: bool) -> Factor:
    """The key's levels in the order first met (a grid sweep's jobs: as its command gave them);
    runs not of a grid sweep: an axis's default option first, where the runs have it."""
    found = levels(runs, key)
    if None in found:
        lacking = [r for r in runs if level_of(r, key) is None]
        raise CompareError(f"--cross {key}: {len(lacking)} of the runs do not say their {key} "
                           f"(e.g. {lacking[0].dir}); compare only runs that set it (--where)")
    if not grid:
        from ablate.config.axes import default_axes

        default = default_axes().get(key)
        if default in found:
            found = [default] + [x for x in found if x != default]
    return Factor(key, tuple(found))


def _check_cells(runs: Sequence[Run], crossing: Crossing, grids: list[GridSweep]) -> None:
    """Every cell of the grid has runs, or one line names the missing ones and the command that
    fills them."""
    have = set(crossing.cells.values())
    missing = [(a, b) for a in crossing.a.levels for b in crossing.b.levels if (a, b) not in have]
    if not missing:
        return
    names = ", ".join(crossing.label(a, b) for a, b in missing)
    if len(grids) == 1:
        fill = f"run its sweep again, which trains only the jobs it lacks: {grids[0].command()}"
    else:
        seeds = max(sum(1 for c in crossing.cells.values() if c == cell) for cell in have)
        fill = "; ".join(_cell_command(runs, crossing, a, b, seeds) for a, b in missing)
        fill = f"run {'it' if len(missing) == 1 else 'them'}: {fill}"
    raise CompareError(f"the grid {crossing.title} has no runs at {names}; {fill}")


def _cell_command(runs: Sequence[Run], crossing: Crossing, a: str, b: str, seeds: int) -> str:
    """`ablate sweep A=a B=b --seeds N ...` with every other override the runs give: one that
    follows B (the same at each of its levels: an optimizer's own learning rate) at level b's
    value, else one that follows A at level a's."""
    given = {r.dir: {override_key(o): o for o in r.record.overrides or []} for r in runs}
    fixed = []
    for key in sorted(set().union(*given.values()) - {crossing.a.key, crossing.b.key}):
        for index, level in ((1, b), (0, a)):
            by: dict[str, set] = {}
            for r in runs:
                by.setdefault(crossing.cell(r)[index], set()).add(given[r.dir].get(key))
            if level in by and _follows(by):
                fixed += [o for o in by[level] if o is not None]
                break
    return " ".join(["ablate sweep", shlex.quote(crossing.a.name(a)), shlex.quote(crossing.b.name(b)),
                     "--seeds", str(seeds), *map(shlex.quote, fixed)])


# ---- what the grid explains -------------------------------------------------------------------------
def _follows(by: dict[str, set]) -> bool:
    """One value at each level."""
    return all(len(values) == 1 for values in by.values())


def crossed_mixed(runs: Sequence[Run], crossing: Crossing) -> dict[str, dict[str, int]]:
    """Settings that differ between the runs but follow neither crossed axis (the same value at
    each level of it): key -> {value shown: runs}. Empty when the grid explains every difference."""
    have = [r for r in runs if r.config]
    keys = sorted(set().union(*(r.config for r in have))) if have else []
    out: dict[str, dict[str, int]] = {}
    for key in keys:
        if not names_variant(key) or key in crossing.exclude:
            continue
        values = [setting(r.config, key) for r in have]
        if len(set(values)) < 2:
            continue
        by_a: dict[str, set] = {}
        by_b: dict[str, set] = {}
        for r, v in zip(have, values):
            a, b = crossing.cell(r)
            by_a.setdefault(a, set()).add(v)
            by_b.setdefault(b, set()).add(v)
        if _follows(by_a) or _follows(by_b):
            continue
        counts: dict[str, int] = {}
        for v in values:
            shown = shown_setting(v)
            counts[shown] = counts.get(shown, 0) + 1
        out[key] = counts
    return out
