"""Each job's config composed once per sweep, and a job that differs from a composed one only in
values (an LR, a seed, a rung's width) derived from it instead of composed again.

Composing a job runs Hydra's defaults list, loads every config file, merges the schema and
applies the overrides: ~0.3 s of CPU, most of a dry run's time (composing each of the 40 jobs
of an LR grid on the width ladder: ~19 s). A value override (`train.lr=0.01`: a key, not a config group) is applied by
Hydra after composition, in order, to the composed config; so a job whose overrides differ from a
composed job's only in values is that job's config with its own values applied in the same way,
and its `hydra.overrides` and `hydra.job.override_dirname` written as Hydra writes them.
tests/test_sweep_composed.py holds every derived config equal to Hydra's own composition."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import List, Optional

_SCALARS = (str, int, float, bool, type(None))


@dataclass(frozen=True)
class _Shape:
    """What a job's composition depends on, and the keys it sets to a scalar afterwards."""

    fixed: tuple  # every override but the scalar values: config groups, dicts, lists, as written
    keys: frozenset  # the keys set to a scalar after composition


@dataclass
class _Job:
    parsed: list  # the overrides Hydra composes the job with, parsed
    values: list  # those it applies after composition (Hydra's config_overrides), in order
    shape: _Shape


class ComposedJobs:
    """The checks before launch compose every job, and Hydra's basic launcher, which composes
    each job again in this process, gets a copy of the same config instead. A copy, since the
    checks and the launcher set the job's number and Hydra marks its node read-only; the same
    config, since composition depends only on the sweep's config (its timestamps included) and
    the job's overrides. A job is derived from a composed job whose overrides are its own but
    for scalar values, on keys it sets too."""

    def __init__(self):
        self.configs: dict = {}  # (master, overrides) -> the job as Hydra composed it
        self.bases: dict = {}  # (master, shape.fixed) -> [(shape.keys, a composed job)]

    def load(self, config_loader, master, overrides: List[str]):
        key = (id(master), tuple(overrides))
        if key not in self.configs:
            job = _job(config_loader, master, list(overrides))
            derived = self._derived(job, master) if job is not None else None
            if derived is not None:
                return derived
            self.configs[key] = config_loader.load_sweep_config(master, list(overrides))
            if job is not None:
                self.bases.setdefault((id(master), job.shape.fixed), []).append((job.shape.keys, self.configs[key]))
        return copy.deepcopy(self.configs[key])

    def loader(self, config_loader) -> "_ComposedLoader":
        """`config_loader` with its load_sweep_config answered from this memo."""
        return _ComposedLoader(config_loader, self)

    def _derived(self, job: _Job, master):
        for keys, base in self.bases.get((id(master), job.shape.fixed), ()):
            if keys <= job.shape.keys:  # the job writes over every value the base set
                try:
                    return _derived(base, job, master)
                except Exception:  # noqa: BLE001 - a value the schema refuses: Hydra says it when composing
                    return None
        return None


class _ComposedLoader:
    def __init__(self, delegate, composed: ComposedJobs):
        self.delegate, self.composed = delegate, composed

    def __getattr__(self, name):
        return getattr(self.delegate, name)

    def load_sweep_config(self, master_config, sweep_overrides: List[str]):
        return self.composed.load(self.delegate, master_config, sweep_overrides)


def _job(config_loader, master, overrides: List[str]) -> Optional[_Job]:
    """The job's overrides as Hydra composes it (the sweep's hydra overrides first, as
    load_sweep_config prepends them), parsed; None where no job may be derived: overrides that
    do not parse, a sweep or a deletion (Hydra says why, or it cannot be applied twice), or a
    loader that is not Hydra's ConfigLoaderImpl."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    repository = getattr(config_loader, "repository", None)
    try:
        every = OmegaConf.to_container(master.hydra.overrides.hydra) + overrides
        parsed = OverridesParser.create().parse_overrides(overrides=every)
    except Exception:  # noqa: BLE001
        return None
    if repository is None or any(o.is_sweep_override() or o.is_delete() for o in parsed):
        return None
    values = [o for o in parsed if o.package is None and (
        isinstance(o.value(), dict) or not repository.group_exists(o.key_or_group))]
    scalar = [o for o in values if isinstance(o.value(), _SCALARS)]
    return _Job(parsed, values, _Shape(fixed=tuple(o.input_line for o in parsed if o not in scalar),
                                       keys=frozenset(o.key_or_group for o in scalar)))


def _derived(base, job: _Job, master):
    """`base` with the job's values applied in order, as
    ConfigLoaderImpl._load_configuration_impl applies them, and its hydra node's overrides.
    All of them, dicts and lists too: the base's values on the same keys are written over."""
    from hydra._internal.config_loader_impl import get_overrides_dirname
    from hydra.core.override_parser.types import OverrideType
    from omegaconf import OmegaConf, open_dict

    config = copy.deepcopy(base)
    for o in job.values:
        # + adds a key the composition lacks (or holds as null), as it did for the base
        OmegaConf.update(config, o.key_or_group, o.value(), merge=True,
                         force_add=o.type in (OverrideType.ADD, OverrideType.FORCE_ADD))
    app = [o for o in job.parsed if not o.is_hydra_override()]
    dirname = config.hydra.job.config.override_dirname
    with open_dict(config.hydra):
        config.hydra.overrides.task = [o.input_line for o in app]
        config.hydra.overrides.hydra = [o.input_line for o in job.parsed if o.is_hydra_override()]
        config.hydra.job.override_dirname = get_overrides_dirname(
            overrides=app, kv_sep=dirname.kv_sep, item_sep=dirname.item_sep, exclude_keys=dirname.exclude_keys)
    OmegaConf.copy_cache(from_config=master, to_config=config)
    return config
