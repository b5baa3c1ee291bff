"""The `optim` axis's typed settings and their checks (torch-free: the config's checks run them
before any directory exists).

The axis is declared with the others in ablate/model/options.py (one axis list: names, Hydra's
group, `ablate axes`, summary.json's `axes`, compare's strata), but it is the trainer's: the model
is the same under both options, so ModelSpec does not hold it; the trainer gets an OptimSpec.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Optional

from ablate.errors import ConfigError
from ablate.model import options

ADJUSTS = ("match_rms_adamw", "original")
MUON_TORCH = (2, 9)  # torch.optim.Muon's release: the update this one reproduces, and its tests
# Muon's own keys: with optim=adamw a value other than the default would be ignored, so it is refused.
MUON_KEYS = ("adjust", "adam_lr", "momentum", "nesterov", "ns_steps")


@dataclass(frozen=True)
class OptimSpec:
    """One run's optimizer: `name` (adamw | muon) and Muon's keys (ignored under adamw)."""

    name: str = options.AXES["optim"].default
    adjust: str = options.AXES["optim"].config["adjust"].default
    adam_lr: Optional[float] = options.AXES["optim"].config["adam_lr"].default
    momentum: float = options.AXES["optim"].config["momentum"].default
    nesterov: bool = options.AXES["optim"].config["nesterov"].default
    ns_steps: int = options.AXES["optim"].config["ns_steps"].default

    @classmethod
    def from_config(cls, cfg: Any) -> "OptimSpec":
        """The config's `optim` node; a config saved before the axis existed has none: AdamW."""
        node = cfg.get("optim") if hasattr(cfg, "get") else None
        if node is None:
            return cls()
        return cls(**{f.name: node[f.name] for f in fields(cls) if f.name in node})

    @property
    def muon(self) -> bool:
        return self.name != "adamw"

    @property
    def option(self) -> Any:
        return options.get("optim", self.name)

    def adam_lr_mult(self, lr: float) -> float:
        """The AdamW part's LR over train.lr: 1, or optim.adam_lr / train.lr under `original`
        (the schedule moves both parts together; --lr-grid keeps the ratio)."""
        if self.muon and self.adjust == "original":
            return float(self.adam_lr) / float(lr)
        return 1.0

    def tied_lrs(self) -> dict[str, float]:
        """The LRs that move with train.lr when a sweep sets it (--lr-grid, a ladder's rungs): the
        AdamW part's under `original`, at its ratio to train.lr; none under match_rms_adamw."""
        if self.muon and self.adjust == "original" and self.adam_lr is not None:
            return {"optim.adam_lr": float(self.adam_lr)}
        return {}

    def check(self, lr: float, param: str = "sp") -> None:
        """The refusals (ConfigError, one line): keys that would be ignored, an unknown
        adjustment, an LR of 0 or less, `original` under a width parametrization, an old torch."""
        options.get("optim", self.name)  # an unknown name lists the valid ones
        default = OptimSpec()
        if not self.muon:
            changed = [k for k in MUON_KEYS if getattr(self, k) != getattr(default, k)]
            if changed:
                raise ConfigError(f"optim.{changed[0]}={_show(getattr(self, changed[0]))} has no effect with "
                                  f"optim={self.name} (it is a key of optim=muon); add optim=muon or drop it")
            return
        if self.adjust not in ADJUSTS:
            raise ConfigError(f"optim.adjust must be {' or '.join(ADJUSTS)}, got '{self.adjust}'")
        if self.adjust == "match_rms_adamw" and self.adam_lr is not None:
            raise ConfigError(f"optim.adam_lr={_show(self.adam_lr)} is the AdamW part's LR under "
                              "optim.adjust=original; with match_rms_adamw one train.lr serves both parts: "
                              "drop optim.adam_lr, or set optim.adjust=original")
        if self.adjust == "original" and self.adam_lr is None:
            raise ConfigError("optim.adjust=original puts train.lr on Muon's own scale (e.g. 0.02); give "
                              "the AdamW part's LR as optim.adam_lr (e.g. 3e-3)")
        if self.adam_lr is not None and not (math.isfinite(self.adam_lr) and self.adam_lr > 0):
            raise ConfigError(f"optim.adam_lr must be positive, got {_show(self.adam_lr)}")
        if not lr > 0:
            raise ConfigError(f"train.lr must be positive, got {lr}")
        if not 0.0 <= self.momentum < 1.0:
            raise ConfigError(f"optim.momentum must be in [0, 1), got {self.momentum}")
        if not 1 <= self.ns_steps < 100:
            raise ConfigError(f"optim.ns_steps must be between 1 and 99 (Newton-Schulz iterations), "
                              f"got {self.ns_steps}")
        if self.adjust == "original" and options.get("param", param).width:
            raise ConfigError(f"optim.adjust=original with param={param}: muP's per-layer LR rules are "
                              "MuAdam's, on AdamW's scale; use optim.adjust=match_rms_adamw (the default) "
                              "or param=sp")
        check_torch(self.name)


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else f"{value:g}" if isinstance(value, float) else str(value)


def torch_version() -> tuple[int, int]:
    """The installed torch's (major, minor), read without importing it (the CLI stays fast)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = version("torch").split("+")[0].split(".")[:2]
        return int(major), int(minor)
    except (PackageNotFoundError, ValueError):
        return MUON_TORCH  # a source build without metadata: its own import will tell


def check_torch(name: str, have: Optional[tuple[int, int]] = None) -> None:
    have = have or torch_version()
    if have < MUON_TORCH:
        raise ConfigError(f"optim={name} needs torch >= {MUON_TORCH[0]}.{MUON_TORCH[1]} (torch.optim.Muon's "
                          f"update and its tests); this is torch {have[0]}.{have[1]}: upgrade torch or use optim=adamw")
