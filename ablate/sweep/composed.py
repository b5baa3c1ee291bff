"""A sweep's job configs, each composed by Hydra once for both the checks before launch and the
basic launcher (ComposedJobs). tests/test_sweep_composed.py holds every job's config equal to the
one Hydra composes for it."""

from __future__ import annotations

import copy
from typing import List


class ComposedJobs:
    """The checks before launch compose every job, and Hydra's basic launcher, which composes
    each job again in this process, gets a copy of the same config instead. A copy, since the
    checks and the launcher set the job's number and Hydra marks its node read-only; the same
    config, since composition depends only on the sweep's config (its timestamps included) and
    the job's overrides."""

    def __init__(self):
        self.configs: dict = {}  # (master, overrides) -> the job's config

    def load(self, config_loader, master, overrides: List[str]):
        key = (id(master), tuple(overrides))
        if key not in self.configs:
            self.configs[key] = config_loader.load_sweep_config(master, list(overrides))
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
