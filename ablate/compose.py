"""Compose a config outside a Hydra job (for pre-flight checks, `inspect`, `bench`, tests)."""

from __future__ import annotations

import re
from typing import Any

from ablate.errors import ConfigError


def hydra_message(e: Exception) -> str:
    """Hydra's multi-line composition error as one line (keeping the list of valid options)."""
    text = str(e).split("Config search path")[0]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if len(lines) > 1 and lines[1].startswith("Available options"):
        return f"{lines[0]}. {lines[1]} {', '.join(lines[2:])}"
    return " ".join(lines)


def compose_config(overrides: list[str], validate: bool = True) -> Any:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ablate.config import validate as check
    from ablate.run import CONF_DIR

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(hydra_message(e)) from None
    finally:
        GlobalHydra.instance().clear()
    if validate:
        check(cfg)
    return cfg
