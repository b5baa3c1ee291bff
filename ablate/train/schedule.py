"""Learning-rate schedule: linear warmup, then cosine (or linear) decay to min_lr_ratio * lr.

A pure function of the step, so resuming needs no scheduler state beyond the step number.
"""

from __future__ import annotations

import math


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
