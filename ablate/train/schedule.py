"""Learning-rate schedule: linear warmup, then cosine (or linear) decay to min_lr_ratio * lr.

A pure function of the step, so resuming needs no scheduler state beyond the step number and
the warmup and span the run started with (ablate/train/state.py keeps them). Torch-free: the
config's checks and the re-entry rule resolve the warmup too.
"""

from __future__ import annotations

import math
from typing import Any


def lr_at(step: int, lr: float, warmup: int, total: int, schedule: str, min_ratio: float) -> float:
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    if schedule == "constant" or total <= warmup:
        return lr
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "linear":
        decay = 1.0 - progress
    else:
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    return lr * (min_ratio + (1.0 - min_ratio) * decay)


def auto_warmup(steps: int, fraction: float, max_steps: int) -> int:
    """train.warmup_steps=null: `fraction` of the steps, rounded down (so below the steps for
    any fraction < 1), at most `max_steps`. 10% and 100 leave the default 1,200-step run its 100."""
    return max(0, min(int(max_steps), math.floor(fraction * steps + 1e-9)))  # 0.29 x 100: 29, not 28.99...


def resolved_warmup(train: Any) -> int:
    """The warmup of a run with these `train` settings (a config node or a plain dict): the
    count set, else the automatic one."""
    if train.get("warmup_steps") is not None:
        return int(train["warmup_steps"])
    return auto_warmup(int(train["steps"]), float(train["warmup_fraction"]), int(train["warmup_max_steps"]))
