"""Each job's config composed once per sweep, and a job that differs from a composed one only in
values (an LR, a seed, a rung's width) derived from it instead of composed again
(ablate/composition.py: composing each of the 40 jobs of an LR grid on the width ladder took ~19 s
of CPU). tests/test_sweep_composed.py holds every derived config equal to Hydra's own composition."""

from __future__ import annotations

import copy
from typing import List, Optional

from ablate.composition import Bases, Overrides, parse


class ComposedJobs:
    """The checks before launch compose every job, and Hydra's basic launcher, which composes
    each job again in this process, gets a copy of the same config instead. A copy, since the
    checks and the launcher set the job's number and Hydra marks its node read-only; the same
    config, since composition depends only on the sweep's config (its timestamps included) and
    the job's overrides. A job is derived from a composed job whose overrides are its own but
    for scalar values, on keys it sets too."""

    def __init__(self):
        self.configs: dict = {}  # (master, overrides) -> the job as Hydra composed it
        self.bases = Bases(per_shape=64)  # a sweep's jobs: every composed job may be a base

    def load(self, config_loader, master, overrides: List[str]):
        key = (id(master), tuple(overrides))
        if key not in self.configs:
            job = _job(config_loader, master, list(overrides))
            config = self.bases.derive(id(master), job)
            if config is not None:
                from omegaconf import OmegaConf

                OmegaConf.copy_cache(from_config=master, to_config=config)
                return config
            self.configs[key] = config_loader.load_sweep_config(master, list(overrides))
            self.bases.add(id(master), job, self.configs[key])
        return copy.deepcopy(self.configs[key])

    def loader(self, config_loader) -> "_ComposedLoader":
        """`config_loader` with its load_sweep_config answered from this memo."""
        return _ComposedLoader(config_loader, self)


class _ComposedLoader:
    def __init__(self, delegate, composed: ComposedJobs):
        self.delegate, self.composed = delegate, composed

    def __getattr__(self, name):
        return getattr(self.delegate, name)

    def load_sweep_config(self, master_config, sweep_overrides: List[str]):
        return self.composed.load(self.delegate, master_config, sweep_overrides)


def _job(config_loader, master, overrides: List[str]) -> Optional[Overrides]:
    """The job's overrides as Hydra composes it: the sweep's hydra overrides first, as
    load_sweep_config prepends them."""
    from omegaconf import OmegaConf

    return parse(config_loader, OmegaConf.to_container(master.hydra.overrides.hydra) + overrides)
