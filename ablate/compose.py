"""Compose a config outside a Hydra job (for pre-flight checks, `inspect`, `bench`, tests).

`compose_config` refuses secrets and invalid configs; `preflight` checks what depends on the
machine rather than the config (output directory, a run directory's owner, data files, device),
so bad input is refused with one line before Hydra makes a directory or writes a file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Optional

from ablate.errors import ConfigError, DataError, RunDirError


def hydra_message(e: Exception) -> str:
    """Hydra's multi-line composition error as one line (keeping the list of valid options)."""
    text = str(e).split("Config search path")[0]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if len(lines) > 1 and lines[1].startswith("Available options"):
        return f"{lines[0]}. {lines[1]} {', '.join(lines[2:])}"
    return " ".join(lines)


def check_no_secrets(overrides: list[str]) -> None:
    """A credential given as an override would be copied into config.yaml, .hydra/ and the
    W&B config, so it is refused (before Hydra parses it: its errors echo the value)."""
    from ablate.tracking.wandb_sink import is_secret_key

    env_key = os.environ.get("WANDB_API_KEY") or ""
    for o in overrides:
        key = o.lstrip("+~").split("=", 1)[0]
        leaf = key.rsplit(".", 1)[-1].lower()
        if is_secret_key(leaf) or (len(env_key) >= 8 and env_key in o):
            raise ConfigError(
                f"'{key}': credentials are not accepted as overrides (they would be written to the "
                "run's files); set WANDB_API_KEY or run `wandb login` instead")


def compose_config(overrides: list[str], validate: bool = True) -> Any:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ablate.config import validate as check
    from ablate.run import CONF_DIR

    check_no_secrets(list(overrides))
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


# ---- pre-flight: the machine, not the config ---------------------------------------------------
def explicit_run_dir(overrides: list[str]) -> Optional[Path]:
    """The value of a literal `hydra.run.dir=...` override (None if absent or interpolated)."""
    for o in reversed(overrides):
        key, _, value = o.lstrip("+").partition("=")
        if key == "hydra.run.dir" and value and "${" not in value:
            return Path(os.path.expanduser(value.strip("'\"")))
    return None


def check_writable(target: Path, what: str) -> None:
    """`target` (which may not exist yet) can be created and written: its nearest existing
    ancestor is a writable directory, and no component on the way is a file."""
    p = Path(os.path.abspath(target))
    while not p.exists():
        if p.parent == p:
            break
        p = p.parent
    if not p.is_dir():
        raise RunDirError(f"{what} {target} cannot be created: {p} is not a directory")
    if not os.access(p, os.W_OK | os.X_OK):
        raise RunDirError(f"{what} {target} is not writable (no write permission on {p})")


def check_data(data_cfg: Any) -> None:
    """Local data files exist and are not all empty (deeper problems surface while tokenizing)."""
    if data_cfg.name != "text_files":
        return
    from ablate.data.sources import expand_paths

    files = expand_paths(data_cfg.paths)  # DataError naming a missing path
    for f in files:
        if not os.access(f, os.R_OK):
            raise DataError(f"data file not readable: {f}")
    if sum(f.stat().st_size for f in files) == 0:
        raise DataError(f"data.paths: the corpus is empty ({len(files)} file(s), 0 bytes)")


def check_device(name: str) -> None:
    if not name.startswith("cuda"):
        return
    import torch  # only when a GPU was asked for

    if not torch.cuda.is_available():
        raise ConfigError(f"train.device={name} but no CUDA device is available; use train.device=auto or cpu")
    index = int(name.split(":", 1)[1]) if ":" in name else 0
    if index >= torch.cuda.device_count():
        raise ConfigError(f"train.device={name} but only {torch.cuda.device_count()} CUDA device(s) are visible")


def preflight(cfg: Any, overrides: list[str]) -> None:
    """Refuse what would fail after Hydra made the run directory; raises AblateError."""
    from ablate.rundir import RunLock

    run_dir = explicit_run_dir(overrides)
    if run_dir is not None:
        RunLock(run_dir).check_free()
        check_writable(run_dir, "run directory")
        if cfg.train.resume == "auto":
            from ablate.train.checkpoint import check_resumable

            check_resumable(run_dir)
    else:
        check_writable(Path(os.path.expanduser(str(cfg.out_dir))), "out_dir")
    device = str(cfg.train.device)
    if device not in ("auto", "cpu", "mps") and not re.fullmatch(r"cuda(:\d+)?", device):
        raise ConfigError(f"train.device must be auto, cpu, cuda, cuda:N or mps, got '{device}'")
    check_device(device)
    check_data(cfg.data)
    from ablate.data.sources import preflight as data_preflight

    data_preflight(cfg.data, cfg.tokenizer.name)  # e.g. a hub dataset, offline and not cached
