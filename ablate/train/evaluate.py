"""Validation on fixed windows: val_loss in nats per token, val_bpb = nats / (ln 2 * bytes).

Bits per byte divides by the UTF-8 bytes of the predicted tokens, so runs with different
tokenizers compare.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn.functional as F

from ablate.names import VAL_BPB, VAL_LOSS


@torch.no_grad()
def evaluate(model, tokens: np.ndarray, windows: list[tuple[int, int]], byte_lengths: np.ndarray,
             device: torch.device, batch_size: int, autocast=nullcontext) -> dict:
    """windows: (start, length) scores every target of each window; (start, length, scored)
    only its last `scored` targets (a sliding window's new tokens, ablate/evaluation/lengths.py)."""
    was_training = model.training
    model.eval()
    total_nats, total_tokens, total_bytes = 0.0, 0, 0
    # Group windows by shape (all but possibly the first and last are alike) and run them in batches.
    by_shape: dict[tuple[int, int], list[int]] = {}
    for start, length, *scored in windows:
        by_shape.setdefault((length, scored[0] if scored else length), []).append(start)
    for (length, scored), starts in by_shape.items():
        offsets = np.arange(length + 1)
        for i in range(0, len(starts), batch_size):
            s = np.asarray(starts[i:i + batch_size])
            w = torch.from_numpy(tokens[s[:, None] + offsets].astype(np.int64))
            x, y = w[:, :-1].to(device), w[:, length + 1 - scored:]
            with autocast():
                logits = model(x).logits[:, length - scored:]
            nats = F.cross_entropy(logits.float().flatten(0, 1), y.to(device).flatten(), reduction="sum")
            total_nats += nats.item()
            total_tokens += y.numel()
            total_bytes += int(byte_lengths[y.numpy()].sum())
    if was_training:
        model.train()
    return {
        VAL_LOSS: total_nats / max(1, total_tokens),
        VAL_BPB: total_nats / (math.log(2) * max(1, total_bytes)),
    }
