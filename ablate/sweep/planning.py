"""Which jobs a sweep runs, in launch order.

Modes
- ofat (one factor at a time): the baseline (the first value of every swept key) plus one job
  per other value of each swept key, every other key held at its baseline value, except the
  keys a preset sets in the job that changes the preset (arch=llama brings its own norm).
- grid: every combination, in the order of Hydra's basic sweeper (the first key varies slowest).
- an explicit job list (a study, conf/study/*.yaml), e.g. a cumulative ladder.
Seeds (`--seeds N` or a swept `seed=...`) multiply every variant; `data_seed` is left alone so
the seeds of different variants are paired (same batches in the same order).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence

from ablate.errors import AblateError, ConfigError

MODES = ("ofat", "grid")
SEED_KEY = "seed"


@dataclass
class Job:
    """One run of a sweep: its overrides, its variant name (what differs from the baseline)
    and its seed (None: the config's)."""

    overrides: list[str]
    variant: str = "baseline"
    seed: Optional[int] = None
    note: str = ""  # shown by --dry-run under the job (e.g. which keys a preset sets)
    tag: str = ""  # an LR grid point or a ladder rung (ablate/sweep/transfer_plan.py)

    @property
    def name(self) -> str:
        """The job's label (progress lines, sweep.json, --dry-run): `act=swiglu_seed0`."""
        return self._with_tag_and_seed(self.variant, self.tag)

    @property
    def dir_name(self) -> str:
        """Its directory's name, which a shell takes as printed: the name, each value that
        holds shell-special characters or is long as a hash (ablate.run.directory.dir_name)."""
        from ablate.run.directory import dir_name

        return self._with_tag_and_seed(dir_name(self.variant, limit=120), dir_name(self.tag))

    def _with_tag_and_seed(self, variant: str, tag: str) -> str:
        name = f"{variant}_{tag}" if tag else variant
        return name if self.seed is None else f"{name}_seed{self.seed}"


@dataclass
class Parsed:
    fixed: list[str] = field(default_factory=list)  # every job gets these
    swept: list[tuple[str, list[str]]] = field(default_factory=list)  # (key, ["k=v", ...])
    seeds: list[int] = field(default_factory=list)  # from a swept `seed=...`


# ---- the sweep's options (the CLI's flags, or hydra.sweeper.* overrides) -----------------------
def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ConfigError(f"unknown --mode '{mode}'; choose one of {', '.join(MODES)}")


def check_seeds(seeds: Optional[int]) -> None:
    """None: not given (the config's seed); N >= 1: every variant with seed=0..N-1."""
    if seeds is not None and seeds < 1:
        raise ConfigError(f"--seeds must be >= 1 (--seeds N runs every variant with seed=0..N-1), "
                          f"got {seeds}")


def parse(arguments: Sequence[str]) -> Parsed:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        overrides = OverridesParser.create().parse_overrides(list(arguments))
    except HydraException as e:
        raise ConfigError(str(e).splitlines()[0]) from None
    out = Parsed()
    fixed_keys = {o.get_key_element().lstrip("+~") for o in overrides if not o.is_sweep_override()}
    swept_keys: set[str] = set()
    for o in overrides:
        key = o.get_key_element()
        if o.is_sweep_override():  # a fixed key given twice is fine: the last wins, as in Hydra
            name = key.lstrip("+~")
            if name in swept_keys or name in fixed_keys:
                raise ConfigError(f"'{name}' is given twice; give it once (a,b,c sweeps it)")
            swept_keys.add(name)
        if not o.is_sweep_override():
            out.fixed.append(o.input_line)
            continue
        if not o.is_discrete_sweep():
            raise ConfigError(f"'{o.input_line}': only lists of values can be swept (a,b,c or range(...))")
        values = list(dict.fromkeys(o.sweep_string_iterator()))  # keep order, drop repeats
        if key.lstrip("+") == SEED_KEY:
            try:
                out.seeds = [int(v) for v in values]
            except ValueError:
                raise ConfigError(f"'{o.input_line}': seeds must be integers") from None
            continue
        out.swept.append((key, [f"{key}={v}" for v in values]))
    return out


def _plain(override: str) -> str:
    """The override without its +/~ prefix, for names ('+x=1' and 'x=1' name the same change)."""
    return override.lstrip("+~")


def _flat_keys(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict) and node:
        return [k for key, sub in node.items() for k in _flat_keys(sub, f"{prefix}{key}.")]
    return [prefix[:-1]]


def preset_keys(override: str) -> set[str]:
    """The keys a preset option sets, read from its file: arch=llama -> the groups its defaults
    override (`override /norm: rmsnorm`, ...) and its plain values (vaswani: model.emb_scale).
    Empty for an override that is not a preset (norm=rmsnorm, train.lr=0.001)."""
    import yaml

    from ablate.config.axes import CONF_DIR

    group, _, option = _plain(override).partition("=")
    path = CONF_DIR / group / f"{option}.yaml"
    if "." in group or not option or not path.is_file():
        return set()
    try:
        text = path.read_text(encoding="utf-8")
        doc = yaml.safe_load(text) or {}
    except (OSError, yaml.YAMLError):
        return set()
    if not isinstance(doc, dict):
        return set()
    groups = {str(k).split()[-1].lstrip("/") for entry in doc.get("defaults") or []
              if isinstance(entry, dict) for k in entry if str(k).startswith("override ")}
    if not groups:
        return set()  # an ordinary option of its axis
    plain = {k: v for k, v in doc.items() if k != "defaults"}
    return groups | (set(_flat_keys(plain)) if plain and "@package _global_" in text else set())


def expand_ofat(p: Parsed) -> list[Job]:
    if not p.swept:
        raise ConfigError(
            "an ofat sweep needs at least one swept axis with two or more values, e.g. "
            "`ablate sweep norm=layernorm,rmsnorm` (or use --mode grid / --seeds N alone)")
    baseline = {key: values[0] for key, values in p.swept}
    jobs = [Job(p.fixed + list(baseline.values()), "baseline")]
    for key, values in p.swept:
        for value in values[1:]:
            # A group on the command line beats a preset's `override /norm`, so holding the
            # baseline's norm=layernorm would make the arch=llama job Llama with LayerNorm:
            # the keys the preset sets are left to it. Fixed keys still apply to every job.
            sets = preset_keys(value)
            others = {k: v for k, v in baseline.items() if k != key}
            released = [v for k, v in others.items() if _plain(k) in sets]
            held = [v for v in others.values() if v not in released]
            note = (f"takes {', '.join(_plain(v).split('=', 1)[0] for v in released)} from "
                    f"{_plain(value)}, not the baseline's {', '.join(map(_plain, released))}"
                    if released else "")
            jobs.append(Job(p.fixed + held + [value], _plain(value), note=note))
    if len(jobs) == 1:
        raise ConfigError(
            f"an ofat sweep needs a swept axis with two or more values; got only "
            f"{', '.join(v[0] for _, v in p.swept)}")
    return jobs


def expand_grid(p: Parsed) -> list[Job]:
    """The cartesian product, ordered as Hydra's BasicSweeper orders it."""
    import itertools

    jobs = []
    for combo in itertools.product(*[values for _, values in p.swept]):
        name = ",".join(_plain(v) for v in combo) or "baseline"
        jobs.append(Job(p.fixed + list(combo), name))
    return jobs


def expand_explicit(p: Parsed, entries: Iterable[Any]) -> list[Job]:
    """A fixed job list (a study): each entry {name, overrides}."""
    if p.swept:
        raise ConfigError(
            "a study fixes its own job list; sweep no axes with it "
            f"(got {', '.join(k for k, _ in p.swept)})")
    jobs = []
    for i, entry in enumerate(entries):
        name = str(entry.get("name") or f"job{i}")
        jobs.append(Job(p.fixed + [str(o) for o in (entry.get("overrides") or [])], name))
    if not jobs:
        raise ConfigError("the study's job list (hydra.sweeper.jobs) is empty")
    return jobs


def with_seeds(jobs: list[Job], seeds: Sequence[int]) -> list[Job]:
    """Every job once per seed; the seed is the last override so it wins."""
    if not seeds:
        return jobs
    return [dataclasses.replace(j, overrides=j.overrides + [f"{SEED_KEY}={s}"], seed=s)
            for j in jobs for s in seeds]


def plan(arguments: Sequence[str], mode: str = "ofat", seeds: int = 0,
         jobs: Optional[Iterable[Any]] = None) -> list[Job]:
    """The sweep's jobs, in launch order. seeds: 0 (the sweeper's default) runs the config's seed."""
    check_mode(mode)
    check_seeds(seeds or None)
    p = parse(arguments)
    if seeds and (p.seeds or any(o.lstrip("+").split("=", 1)[0] == SEED_KEY for o in p.fixed)):
        raise ConfigError("give seeds either as --seeds N or as seed=..., not both")
    seed_list = list(range(seeds)) if seeds else p.seeds
    if jobs:
        base = expand_explicit(p, jobs)
    elif mode == "grid" or (not p.swept and seed_list):
        base = expand_grid(p)  # seeds only: one variant, N seeds
    else:
        base = expand_ofat(p)
    return with_seeds(base, seed_list)


@contextlib.contextmanager
def naming(what: str):
    """An error composing or checking `what` (a job, a variant) refuses it in one line that names it."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ablate.config.compose import hydra_message

    try:
        yield
    except AblateError as e:
        raise type(e)(f"{what}: {e}") from None
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(f"{what}: {hydra_message(e)}") from None


def print_plan(jobs: list[Job], as_json: bool, header: str = "", out=None) -> None:
    try:
        _print_plan(jobs, as_json, header, out or sys.stdout)
    except BrokenPipeError:  # `ablate sweep ... --dry-run | head`: the reader has what it wanted
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # what follows goes nowhere


def _print_plan(jobs: list[Job], as_json: bool, header: str, out) -> None:
    if as_json:
        out.write(json.dumps([j.overrides for j in jobs], indent=None) + "\n")
        return
    if header:
        out.write(header + "\n")
    width = len(str(len(jobs) - 1))
    for i, j in enumerate(jobs):
        out.write(f"  #{i:<{width}} {j.name:<28} {' '.join(j.overrides)}\n")
        if j.note:
            out.write(f"{'':<{width + 33}}({j.note})\n")
