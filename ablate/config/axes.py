"""`ablate axes`: the groups, their options and the defaults. The axes' options are their
declarations (ablate/model/options.py, and plugins'); the other groups' are the option files in
conf/ and in each loaded plugin's conf/.

Reads declarations and conf files only (no torch) unless a plugin is loaded, so it answers fast;
a test asserts that this listing, Hydra's config groups and the declarations agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ablate.config.schema import AXES
from ablate.model import options


def conf_dir() -> Path:
    root = Path(__file__).resolve().parents[2]  # the checkout, or site-packages (conf is a package)
    return root / "conf"


CONF_DIR = conf_dir()
# The other groups `ablate axes` lists, in its order (they are not part of a variant's identity).
GROUPS = ("arch", "model", "train", "data", "tokenizer", "logger", "launcher", "study")


def default_axes() -> dict[str, str]:
    """Axis -> its default option (what a run without overrides trains)."""
    return {axis: options.AXES[axis].default for axis in AXES}


def group_options(group: str, root: Optional[Path] = None) -> list[str]:
    """The options of a group, sorted: an axis's built-in declarations, else the group's files
    (under `root`: a plugin's conf dir)."""
    if group in AXES and root is None:
        return sorted(o.name for o in options.declared(group) if o.plugin is None)
    d = (root or conf_dir()) / group
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def config_groups() -> dict[str, list[str]]:
    """Every config group with options -> its built-in options, by group name (`run --help`)."""
    dirs = [p.name for p in CONF_DIR.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))]
    found = {g: group_options(g) for g in sorted({*AXES, *dirs})}
    return {g: opts for g, opts in found.items() if opts}


def defaults() -> dict[str, str]:
    """Group -> default option: the axes' declared defaults, the other groups' from the primary
    config's defaults list."""
    import yaml

    cfg = yaml.safe_load((conf_dir() / "config.yaml").read_text())
    out = default_axes()
    for entry in cfg["defaults"]:
        if isinstance(entry, dict):
            for k, v in entry.items():
                out[str(k)] = str(v)
    return out


def preset_axes(arch: str) -> dict[str, str]:
    """Axis -> option of an arch preset (conf/arch/<arch>.yaml's `override /axis: option`)."""
    import yaml

    doc = yaml.safe_load((conf_dir() / "arch" / f"{arch}.yaml").read_text())
    overrides = {str(k).split()[-1].lstrip("/"): str(v) for entry in doc.get("defaults") or []
                 for k, v in entry.items() if str(k).startswith("override ")}
    return {axis: overrides.get(axis, option) for axis, option in default_axes().items()}


def list_axes(plugin_confs: Optional[dict[str, Path]] = None) -> list[dict]:
    """plugin_confs: plugin module -> its conf dir (ablate.plugins.loaded_confs()). A group's
    `plugins` maps each option a plugin adds to that module; an axis's `settings` are its keys
    with their defaults (`attn.kv_group`: 4), `option_settings` each option's own ({"dyt":
    {"alpha0": 0.5}})."""
    d = defaults()
    groups = list(AXES) + [g for g in GROUPS if (conf_dir() / g).is_dir()]
    rows = []
    for g in groups:
        builtin = group_options(g)
        if g in AXES:
            added = {o.name: o.plugin for o in options.declared(g) if o.plugin is not None}
        else:
            added = {o: module for module, root in (plugin_confs or {}).items()
                     for o in group_options(g, root) if o not in builtin}
        settings, own = {}, {}
        if g in AXES:
            settings = options.AXES[g].defaults()
            own = {o.name: {key: s.default for key, s in o.settings.items()}
                   for o in sorted(options.declared(g), key=lambda o: o.name) if o.settings}
        rows.append({"group": g, "options": builtin + sorted(added), "default": d.get(g, "-"),
                     "axis": g in AXES, "plugins": added, "settings": settings, "option_settings": own})
    return rows
