"""`ablate axes`: the groups, their options (the option files in conf/) and the defaults.

Reads conf/ only (no torch), so it answers fast; a test asserts that this listing, the conf
files and the registries agree.
"""

from __future__ import annotations

from pathlib import Path

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


def group_options(group: str) -> list[str]:
    d = conf_dir() / group
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


def list_axes() -> list[dict]:
    d = defaults()
    groups = list(AXES) + [g for g in ("arch", "model", "train", "data", "tokenizer", "logger",
                                        "launcher", "study") if (conf_dir() / g).is_dir()]
    return [{"group": g, "options": group_options(g), "default": d.get(g, "-"),
             "axis": g in AXES} for g in groups]
