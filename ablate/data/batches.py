"""Paired batches: the windows of step s depend only on (data_seed, s), never on the model,
so every variant with the same data_seed sees byte-identical batches in the same order, and a
resumed run continues from a step number without replaying anything."""

from __future__ import annotations

import numpy as np
import torch

from ablate.errors import DataError


class Batches:
    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, data_seed: int,
                 rank: int = 0, world_size: int = 1):
        self.tokens, self.T, self.B = tokens, seq_len, batch_size
        self.seed, self.rank, self.world = data_seed, rank, world_size
        self.n_starts = len(tokens) - seq_len - 1
        if self.n_starts < 1:
            raise DataError(
                f"the training split has {len(tokens)} tokens, fewer than one window of "
                f"train.seq_len={seq_len} + 1; use more data or a shorter train.seq_len")
        self._arange = np.arange(seq_len + 1)

    def starts(self, step: int, micro: int = 0) -> np.ndarray:
        """Window starts of the global batch (all ranks) of this step and micro-step."""
        rng = np.random.default_rng([self.seed, step, micro])
        return rng.integers(0, self.n_starts + 1, size=self.B * self.world)

    def get(self, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y) for this rank: disjoint slices of one global batch. Each (B, T) int64."""
        starts = self.starts(step, micro)[self.rank * self.B:(self.rank + 1) * self.B]
        windows = torch.from_numpy(self.tokens[starts[:, None] + self._arange].astype(np.int64))
        return windows[:, :-1], windows[:, 1:]


def val_windows(tokens: np.ndarray, seq_len: int, max_tokens: int) -> list[tuple[int, int]]:
    """Fixed, non-overlapping (start, length) windows from the start of the validation split,
    the same for every variant; the last one may be shorter so no token is left out."""
    usable = min(len(tokens) - 1, max(max_tokens, 1))
    if usable < 1:
        raise DataError("the validation split is too small: lower data.val_fraction or add data")
    return [(s, min(seq_len, usable - s)) for s in range(0, usable, seq_len)]
