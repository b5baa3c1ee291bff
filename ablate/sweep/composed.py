"""Each job's config composed once per sweep: the checks before launch and Hydra's basic launcher
get the same config. A job that differs from a composed one only in values (an LR, a seed, a
rung's width) is derived from it by `derived_compositions` (ablate/config/compose.py, active for the
whole sweep: composing each of the 40 jobs of an LR grid on the width ladder took ~19 s of CPU).
tests/test_sweep_composed.py holds every job's config equal to Hydra's own composition."""

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
