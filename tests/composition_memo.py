"""The test suite's composition memo: Hydra's compositions derived from earlier ones, so that the
suite's thousands of commands do not each pay Hydra's full composition (~0.13 s of CPU each on
the 2-core test machine; `ablate run` composes three times). Not a test file, and no part of the
product: `ablate` composes every config with Hydra itself.

Installed for the whole session by tests/conftest.py (commands run in the test's process) and in
the zygote (tests/forkserver.py: commands forked from it). `ABLATE_TEST_MEMO=0` installs nothing:
every composition is then Hydra's own, as in the product. Three of Hydra's methods are replaced:

- ConfigLoaderImpl.load_configuration: a composition in run mode (the compose API, `ablate run`,
  a sweep's jobs) whose overrides differ from an earlier one's only in scalar values, with the
  same inputs (config groups, files, ConfigStore entries, search path, job name), is that config
  with its own values applied as Hydra applies them (`derived`), its resolver cache cleared so
  that `${now:...}` resolves afresh as in Hydra's own composition;
- ConfigRepository.load_config: a composition that is not derived reads each config once
  (Hydra reads each one twice a composition, ~25% of its CPU);
- Hydra.get_mode: Hydra composes the whole config once more, in multirun mode, only to read
  hydra.mode, which ablate's config leaves unset (tests/test_composition.py checks that): answered
  None (the command's mode) unless the inputs could set it.

tests/test_composition.py and tests/test_sweep_composed.py hold every derived config equal to
Hydra's own composition."""

from __future__ import annotations

import contextlib
import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

ENV = "ABLATE_TEST_MEMO"
_SCALARS = (str, int, float, bool, type(None))


def enabled() -> bool:
    """Whether the environment lets the memo be installed (ABLATE_TEST_MEMO=0: it does not)."""
    return os.environ.get(ENV, "1") != "0"


@dataclass
class Record:
    """What the memo did while it was on: the overrides of each composition Hydra ran (every one
    that was not derived) and of each one it derived."""

    composed: list = field(default_factory=list)
    derived: list = field(default_factory=list)


class _State:
    originals: Optional[tuple] = None  # Hydra's own methods, while installed
    on = True  # off(): Hydra's own, through the installed methods
    bases: Any = None  # Bases
    loading: Optional[dict] = None  # the configs read for the composition in progress
    record = Record()


def installed() -> bool:
    return _State.originals is not None


def install() -> None:
    """Replace Hydra's three methods with the memo's (once; not where ABLATE_TEST_MEMO=0)."""
    if installed() or not enabled():
        return
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.config_repository import ConfigRepository
    from hydra._internal.hydra import Hydra

    load, read, get_mode = ConfigLoaderImpl.load_configuration, ConfigRepository.load_config, Hydra.get_mode

    def load_configuration(self, config_name, overrides, run_mode, *args, **kwargs):
        if not _State.on:
            return load(self, config_name, overrides, run_mode, *args, **kwargs)
        return _derived_or_loaded(load, self, config_name, list(overrides), run_mode, *args, **kwargs)

    def load_config(self, config_path):
        if _State.loading is None:
            return read(self, config_path)
        key = (tuple((s.provider, s.path) for s in self.sources), config_path)
        if key not in _State.loading:
            _State.loading[key] = read(self, config_path)
        return copy.deepcopy(_State.loading[key])  # Hydra changes what it reads: the copy, never the read

    def mode(self, config_name, overrides):
        if not _State.on or _may_set_mode(self, config_name, overrides):
            return get_mode(self, config_name, overrides)
        return None

    _State.originals = (load, read, get_mode)
    ConfigLoaderImpl.load_configuration, ConfigRepository.load_config, Hydra.get_mode = (
        load_configuration, load_config, mode)


def uninstall() -> None:
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.config_repository import ConfigRepository
    from hydra._internal.hydra import Hydra

    if installed():
        ConfigLoaderImpl.load_configuration, ConfigRepository.load_config, Hydra.get_mode = _State.originals
        _State.originals = None


@contextlib.contextmanager
def off() -> Iterator[None]:
    """Within, every composition is Hydra's own (nothing derived, nothing read from the memo,
    get_mode composes), as in the product."""
    on, _State.on = _State.on, False
    try:
        yield
    finally:
        _State.on = on


@contextlib.contextmanager
def fresh() -> Iterator[Record]:
    """Within, the memo starts empty, as in a new process, and records what it does; the
    session's memo is back after."""
    saved = _State.bases, _State.record
    _State.bases, _State.record = None, Record()
    try:
        yield _State.record
    finally:
        _State.bases, _State.record = saved


_SETS_MODE = ("hydra.mode", "hydra.searchpath")


def _may_set_mode(hydra: Any, config_name: Optional[str], overrides: list) -> bool:
    """Whether anything but ablate's own configs could set hydra.mode: another primary config,
    an override of it or of the search path, a directory of the user's on the search path
    (--config-dir, --config-path). A plugin's conf dir holds options of ablate's axes."""
    from ablate.config.axes import CONF_DIR

    dirs = [(e.provider, e.path.removeprefix("file://").rstrip("/"))
            for e in hydra.config_loader.get_search_path().get_path()
            if (e.path.startswith("file://") or "://" not in e.path) and e.provider != "ablate-plugin"]
    return config_name != "config" or any(o.lstrip("+~").startswith(_SETS_MODE) for o in overrides) or \
        any(d != ("main", str(CONF_DIR)) for d in dirs)


def _derived_or_loaded(load, loader: Any, config_name: str, overrides: list[str], run_mode: Any, *args, **kwargs):
    from hydra import version
    from hydra.core.utils import JobRuntime
    from hydra.types import RunMode

    _State.bases = _State.bases or Bases()
    inputs = _inputs(loader)
    job = parse(loader, overrides) if run_mode == RunMode.RUN else None  # a sweep's master: composed
    # the job's name is hydra.job.name; version_base changes what Hydra composes
    context = (inputs, config_name, JobRuntime.instance().get("name"), version.getbase())
    cfg = _State.bases.derive(context, job)
    if cfg is not None:
        _State.record.derived.append(overrides)
        return cfg
    _State.loading = _State.bases.read(inputs)
    try:
        cfg = load(loader, config_name, overrides, run_mode, *args, **kwargs)
    finally:
        _State.loading = None
    _State.record.composed.append(overrides)
    _State.bases.add(context, job, cfg)
    return cfg


class _Same:
    """An object compared by identity (and kept alive, so its id is not reused)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj


def _inputs(loader: Any) -> tuple:
    """What a composition reads besides its overrides: the entries of Hydra's ConfigStore (the
    schema, every option, a plugin's), the search path, and its directories' files as of now."""
    from hydra.core.config_store import ConfigStore

    def entries(node: dict, prefix: str):
        for key, value in node.items():
            if isinstance(value, dict):
                yield from entries(value, f"{prefix}{key}/")
            else:
                yield f"{prefix}{key}", _Same(value)

    path = tuple((e.provider, e.path) for e in loader.get_search_path().get_path())
    dirs = [d.removeprefix("file://") for _, d in path if d.startswith("file://") or "://" not in d]
    files = tuple((p, hash(p.read_bytes())) for d in dirs for p in sorted(Path(d).rglob("*.yaml")))
    return tuple(entries(ConfigStore.instance().repo, "")), path, files


# ---- deriving a composition from an earlier one -------------------------------------------------
# Composing a config runs Hydra's defaults list, loads every config file, merges the schema and
# applies the overrides. A value override (`train.lr=0.01`: a key, not a config group) is applied
# by Hydra after composition, in order, to the composed config; so a config whose overrides differ
# from a composed one's only in scalar values is that config with its own values applied in the
# same way, and its hydra node's overrides, `override_dirname`, working directory and copied
# environment written as Hydra writes them.


@dataclass(frozen=True)
class Shape:
    """What a composition depends on, and the keys it sets to a scalar afterwards."""

    fixed: tuple  # every override but the scalar values: config groups, dicts, lists, as written
    keys: frozenset  # the keys set to a scalar after composition


@dataclass
class Overrides:
    parsed: list  # the overrides Hydra composes with, parsed
    values: list  # those it applies after composition (Hydra's config_overrides), in order
    shape: Shape

    def added(self) -> set:
        """The keys its values add (`+key=value`): absent from the composition before them."""
        return {o.key_or_group for o in self.values if o.is_add()}


def parse(config_loader, overrides: list[str]) -> Optional[Overrides]:
    """`overrides` parsed and split as Hydra applies them; None where nothing may be derived:
    overrides that do not parse, a sweep or a deletion (Hydra says why, or it cannot be applied
    twice), or a loader that is not Hydra's ConfigLoaderImpl."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    repository = getattr(config_loader, "repository", None)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides=list(overrides))
    except Exception:  # noqa: BLE001 - Hydra says what is wrong when it composes
        return None
    if repository is None or any(o.is_sweep_override() or o.is_delete() for o in parsed):
        return None
    values = [o for o in parsed if o.package is None and (
        isinstance(o.value(), dict) or not repository.group_exists(o.key_or_group))]
    scalar = [o for o in values if isinstance(o.value(), _SCALARS)]
    return Overrides(parsed, values, Shape(fixed=tuple(o.input_line for o in parsed if o not in scalar),
                                           keys=frozenset(o.key_or_group for o in scalar)))


class Bases:
    """Composed configs by shape. A config is derived from one composed with the same fixed
    overrides whose scalar keys it sets too (so it writes over every value the base set)."""

    PER_SHAPE, SHAPES = 4, 128  # ~0.2 MB a config: bounded

    def __init__(self):
        self.bases: dict = {}  # (context, shape.fixed) -> [(its overrides, a composed config)]
        self.reads: dict = {}  # inputs -> the configs read from them, by source and config path

    def read(self, inputs: Any) -> dict:
        """The configs read from `inputs` (the compositions of the same inputs share them)."""
        if inputs not in self.reads and len(self.reads) >= 4:
            del self.reads[next(iter(self.reads))]
        return self.reads.setdefault(inputs, {})

    def derive(self, context: Any, job: Optional[Overrides]):
        """The config `job` composes to, derived from a base; None when none fits, or when its
        values fail (a value the schema refuses: Hydra says it when composing)."""
        for base_job, base in self.bases.get((context, job.shape.fixed), ()) if job is not None else ():
            if base_job.shape.keys <= job.shape.keys:
                try:
                    return derived(base, job, added=base_job.added())
                except Exception:  # noqa: BLE001
                    return None
        return None

    def add(self, context: Any, job: Optional[Overrides], config) -> None:
        if job is not None and (context, job.shape.fixed) not in self.bases and len(self.bases) >= self.SHAPES:
            del self.bases[next(iter(self.bases))]  # the oldest shape
        held = self.bases.setdefault((context, job.shape.fixed), []) if job is not None else None
        if held is not None and len(held) < self.PER_SHAPE:
            held.append((job, copy.deepcopy(config)))


def derived(base, job: Overrides, added: set):
    """A copy of `base` with the job's values applied in order, as
    ConfigLoaderImpl._apply_overrides_to_config applies them (all of them, dicts and lists too:
    the base's values on the same keys are written over), and its hydra node as
    ConfigLoaderImpl._load_configuration_impl writes it. `added`: the keys the base's own values
    added, which the composition before them did not hold. Its resolver cache is cleared: Hydra
    resolved the base's `${now:...}` (in hydra.run.dir) when it composed the base, and this
    composition's time is another."""
    from hydra._internal.config_loader_impl import get_overrides_dirname
    from omegaconf import OmegaConf, open_dict

    config, adding = copy.deepcopy(base), set()
    OmegaConf.clear_cache(config)
    for o in job.values:
        key, value = o.key_or_group, o.value()
        if o.is_add() and not isinstance(value, (dict, list)) and (key in adding or key not in added and \
                OmegaConf.select(config, key, throw_on_missing=False) is not None):
            raise ValueError(f"{o.input_line}: an item is already there")  # Hydra refuses it
        adding |= {key} if o.is_add() else set()
        OmegaConf.update(config, key, value, merge=True, force_add=o.is_add() or o.is_force_add())
    app = [o for o in job.parsed if not o.is_hydra_override()]
    dirname = config.hydra.job.config.override_dirname
    with open_dict(config.hydra):
        config.hydra.overrides.task = [o.input_line for o in app]
        config.hydra.overrides.hydra = [o.input_line for o in job.parsed if o.is_hydra_override()]
        config.hydra.job.override_dirname = get_overrides_dirname(
            overrides=app, kv_sep=dirname.kv_sep, item_sep=dirname.item_sep, exclude_keys=dirname.exclude_keys)
        config.hydra.runtime.cwd = os.getcwd()
        for key in config.hydra.job.env_copy:
            config.hydra.job.env_set[key] = os.environ[key]
    return config
