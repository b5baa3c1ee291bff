"""Paired batches: the windows of step s depend only on (data_seed, s), never on the model,
so every variant with the same data_seed sees byte-identical batches in the same order, and a
resumed run continues from a step number without replaying anything.

One step's global batch is `batch_size * world_size * grad_accum` windows drawn at once; micro-
step m of rank r takes its own disjoint slice. So 1 process x 16 windows, 2 ranks x 8 and
1 process x 8 x 2 accumulation steps all train on the same 16 windows at every step.
"""

from __future__ import annotations

import numpy as np
import torch

from ablate.data.cache import check_one_batch
from ablate.errors import DataError


class Batches:
    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, data_seed: int,
                 rank: int = 0, world_size: int = 1, grad_accum: int = 1):
        self.tokens, self.T, self.B = tokens, seq_len, batch_size
        self.seed, self.rank, self.world, self.accum = data_seed, rank, world_size, grad_accum
        check_one_batch(len(tokens), batch_size, seq_len)
        self.n_starts = len(tokens) - seq_len  # valid starts: 0 .. len - seq_len - 1
        self._arange = np.arange(seq_len + 1)

    def starts(self, step: int) -> np.ndarray:
        """Window starts of the step's global batch (all ranks, all micro-steps)."""
        rng = np.random.default_rng([self.seed, step])
        return rng.integers(0, self.n_starts, size=self.B * self.world * self.accum)

    def window(self, step: int, micro: int = 0, pin: bool = False) -> torch.Tensor:
        """The (B, T+1) int64 windows of this rank and micro-step: inputs and targets in one
        contiguous tensor, so a GPU gets them in one copy (pinned: non-blocking)."""
        i = (micro * self.world + self.rank) * self.B
        starts = self.starts(step)[i:i + self.B]
        windows = torch.from_numpy(self.tokens[starts[:, None] + self._arange].astype(np.int64))
        return windows.pin_memory() if pin else windows

    def get(self, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y) for this rank and micro-step, each (B, T) int64; y is x shifted by one."""
        windows = self.window(step, micro)
        return windows[:, :-1], windows[:, 1:]


def val_windows(tokens: np.ndarray, seq_len: int, max_tokens: int) -> list[tuple[int, int]]:
    """Fixed, non-overlapping (start, length) windows from the start of the validation split,
    the same for every variant; `length` targets each (the input is one token longer). They
    predict tokens[1 : usable + 1]; the last window may be shorter so no token is left out."""
    usable = min(len(tokens) - 1, max(max_tokens, 1))
    if usable < 1:
        raise DataError("the validation split is too small: raise data.val_fraction or add data")
    return [(s, min(seq_len, usable - s)) for s in range(0, usable, seq_len)]
