"""A Hydra composition derived from an earlier one that differs from it only in values.

Composing a config runs Hydra's defaults list, loads every config file, merges the schema and
applies the overrides: ~0.3 s of CPU. A value override (`train.lr=0.01`: a key, not a config
group) is applied by Hydra after composition, in order, to the composed config; so a config whose
overrides differ from a composed one's only in scalar values is that config with its own values
applied in the same way, and its hydra node's overrides, `override_dirname`, working directory and
copied environment written as Hydra writes them. Used within a command (`derived_compositions`,
ablate/config/compose.py: a run, a sweep and its jobs); tests/test_composition.py and
tests/test_sweep_composed.py hold every derived config equal to Hydra's own composition."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any, Optional

_SCALARS = (str, int, float, bool, type(None))


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
    added, which the composition before them did not hold."""
    from hydra._internal.config_loader_impl import get_overrides_dirname
    from omegaconf import OmegaConf, open_dict

    config, adding = copy.deepcopy(base), set()
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
