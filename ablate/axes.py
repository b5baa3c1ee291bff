"""`ablate axes`: the groups, their options (the option files in conf/ and in each loaded
plugin's conf/) and the defaults.

Reads conf files only (no torch) unless a plugin is loaded, so it answers fast; a test asserts
that this listing, the conf files and the registries agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ablate.config import AXES


def conf_dir() -> Path:
    here = Path(__file__).resolve().parent
    return here.parent / "conf" if (here.parent / "conf").is_dir() else here / "conf"


CONF_DIR = conf_dir()


def default_axes() -> dict[str, str]:
    """Axis -> the option of the typed schema's default (what a run without overrides trains)."""
    from ablate.config import AblateConfig

    base = AblateConfig()
    return {axis: getattr(base, axis).name for axis in AXES}


def group_options(group: str, root: Optional[Path] = None) -> list[str]:
    d = (root or conf_dir()) / group
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def defaults() -> dict[str, str]:
    """Group -> default option, read from the primary config's defaults list."""
    import yaml

    cfg = yaml.safe_load((conf_dir() / "config.yaml").read_text())
    out = {}
    for entry in cfg["defaults"]:
        if isinstance(entry, dict):
            for k, v in entry.items():
                out[str(k)] = str(v)
    return out


def list_axes(plugin_confs: Optional[dict[str, Path]] = None) -> list[dict]:
    """plugin_confs: plugin module -> its conf dir (ablate.plugins.loaded_confs()). A group's
    `plugins` maps each option a plugin adds to that module."""
    d = defaults()
    groups = list(AXES) + [g for g in ("arch", "model", "train", "data", "tokenizer", "logger",
                                        "launcher", "study") if (conf_dir() / g).is_dir()]
    rows = []
    for g in groups:
        builtin = group_options(g)
        added = {o: module for module, root in (plugin_confs or {}).items()
                 for o in group_options(g, root) if o not in builtin}
        rows.append({"group": g, "options": builtin + sorted(added), "default": d.get(g, "-"),
                     "axis": g in AXES, "plugins": added})
    return rows
