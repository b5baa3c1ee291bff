"""Your own variant without forking: plugin modules that register options for any axis.

A plugin is an importable module (on PYTHONPATH or installed) that declares each option with one
`register_option` call at import time, as the built-in options are declared
(ablate/model/options.py; ablate/model/axis.py says what each axis expects):

    my_pkg/my_norm.py     register_option("norm", "crmsnorm", CRMSNorm, params=lambda spec, d: d)

The option is then an option of its config group (`norm=crmsnorm`), with the config values its
registration gives (config={...}) and its own settings (settings={"g0_scale": 1.0}, or
{"width": setting(None, int)} for an optional integer: typed keys of its node, `norm.g0_scale=2`,
passed to its class as keyword arguments). An attention or FFN option is a component
(ablate/model/component.py): it also declares its decode cache, auxiliary losses and statistics. Its module may set its own
parameters (`init_parameters(init)`, after the role defaults). Without `params=` its parameters
are counted on its class, built on the meta device. A `conf/` directory beside the module may add config files of its own
(e.g. `conf/arch/<preset>.yaml`), put on Hydra's search path; a file for an option it registers
(`conf/norm/crmsnorm.yaml`) is used instead of the registration's config values.

It is loaded by `plugins=[my_pkg.my_norm]` on the command line (recorded in the run's config, so
torchrun ranks, SLURM jobs and `ablate resume` load it too) or, for an installed package, by an
entry point in the group `ablate.plugins` (loaded always). Loading happens before Hydra composes
(ablate.config.compose, and the search-path plugin in hydra_plugins/ablate_sweeper for `@hydra.main`),
so `norm=crmsnorm` is an ordinary option of `run`, `sweep`, `inspect`.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Iterable, Optional, Sequence

from ablate.errors import ConfigError
from ablate.model.axis import conf_dir_of, registering_for
from ablate.model.options import register_option, setting  # noqa: F401  (the plugin API, re-exported)

ENTRY_POINT_GROUP = "ablate.plugins"
KEY = "plugins"  # the config key (top level) that lists plugin modules

_loaded: dict[str, Optional[Path]] = {}  # module name -> its conf dir (None: it has none)
_entry_points_loaded = False


def load(names: Iterable[str]) -> list[Path]:
    """Import each plugin module once (entry points too); returns every loaded conf dir.
    Raises ConfigError naming a module that cannot be imported."""
    load_entry_points()
    for name in names:
        name = str(name).strip()
        if not name or name in _loaded:
            continue
        try:
            with registering_for(name):
                module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and name.startswith(e.name):  # the plugin itself, not one of its imports
                raise ConfigError(
                    f"plugin module '{name}' not found; put its directory on PYTHONPATH or install "
                    "its package (plugins=[a.module] names modules, as in `import a.module`)") from None
            raise ConfigError(f"plugin module '{name}' failed to import: {e}") from None
        except Exception as e:  # noqa: BLE001 - a broken plugin is bad input, in one line
            raise ConfigError(f"plugin module '{name}' failed to import: {type(e).__name__}: {e}") from None
        _loaded[name] = conf_dir_of(module)
    return conf_dirs()


def load_entry_points() -> None:
    """Plugins an installed package declares: [project.entry-points."ablate.plugins"]."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.module in _loaded:
            continue
        try:
            with registering_for(ep.module):
                module = importlib.import_module(ep.module)
        except Exception as e:  # noqa: BLE001
            raise ConfigError(f"plugin '{ep.name}' (entry point {ep.value} in group "
                              f"{ENTRY_POINT_GROUP}) failed to import: {type(e).__name__}: {e}") from None
        _loaded[ep.module] = conf_dir_of(module)


def loaded_confs() -> dict[str, Path]:
    """Each loaded plugin module that has a conf dir -> that dir."""
    return {name: d for name, d in _loaded.items() if d is not None}


def conf_dirs() -> list[Path]:
    return list(dict.fromkeys(d for d in _loaded.values() if d is not None))


def names_in(overrides: Sequence[str]) -> list[str]:
    """The modules a `plugins=[a.b,c]` (or +plugins / ++plugins) override names, else []."""
    # "=" required: a bare `plugins` is a value (`--info plugins`), not this key
    wanted = [o for o in overrides if "=" in o and o.lstrip("+~").split("=", 1)[0].strip() == KEY]
    if not wanted:
        return []
    from hydra.core.override_parser.overrides_parser import OverridesParser  # ~0.1 s: only when needed
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(wanted)
    except HydraException as e:
        raise ConfigError(f"{KEY}: {str(e).splitlines()[0]}; write plugins=[my_pkg.my_module]") from None
    out: list[str] = []
    for o in parsed:
        value = o.value()
        if o.is_delete():
            continue
        out = [str(v) for v in value] if isinstance(value, list) else [str(value)]  # last wins
    return out


def load_from_overrides(overrides: Sequence[str]) -> list[Path]:
    return load(names_in(overrides))


def load_from_argv(argv: Optional[Sequence[str]] = None) -> list[Path]:
    """For `@hydra.main` processes (a run, a sweep, a torchrun rank): the overrides are argv."""
    args = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
    return load_from_overrides(args)
