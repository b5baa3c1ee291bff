"""A run that learned nothing but token frequencies: named in its summary and in compare, its
status unchanged (`completed`: summary.json's values are public, and it did complete).

Two signs, each from summary.json:
- its final val_loss is within UNIGRAM_TOLERANCE of `unigram_loss`, the entropy of the training
  split's token frequencies: the loss of a model that predicts each token from how often it
  occurs, whatever precedes it (a bigram-free "model" any network reaches in a few steps);
- `block_grad_norm` is 0 at its last step: no gradient reaches the transformer blocks, so only
  the embeddings, the final norm and the head still learn (a saturated tanh or norm, a dead
  activation), and the prediction cannot depend on the context.

Measured 2026-11-29 (the CPU default model, Shakespeare bytes, 150 steps, seed 0): `norm=dyt`
ends at val_loss 3.3360 against a unigram loss of 3.3368, with block gradients exactly 0 (DyT
saturates: docs/axes.md); LayerNorm ends at 2.5062.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ablate.names import Status

UNIGRAM_TOLERANCE = 0.05  # nats: DyT's 150-step run ends 0.0008 from it, LayerNorm's 0.83 below it
NO_GRADIENT = 1e-10  # a block gradient norm at or below this is none


@dataclass(frozen=True)
class Collapse:
    """Why a completed run is collapsed: its val_loss at the unigram level, no gradient to its
    blocks, or both."""

    val_loss: Optional[float]
    unigram_loss: Optional[float]
    at_unigram: bool
    no_block_gradient: bool

    def reason(self) -> str:
        parts = []
        if self.at_unigram:
            parts.append(f"val_loss {self.val_loss:.4f} is within {UNIGRAM_TOLERANCE:g} of the unigram loss "
                         f"{self.unigram_loss:.4f} (each token predicted from its frequency alone)")
        if self.no_block_gradient:
            parts.append("no gradient reached the blocks at the last step (a saturated tanh or norm passes none; "
                         "train.diagnostics_every=25 shows from when)")
        return "; ".join(parts)


def collapse_of(record) -> Optional[Collapse]:
    """A completed run's Collapse (ablate.run.record.RunRecord), None when it learned more than
    token frequencies or its record does not say (a run recorded before these keys)."""
    if record.status != Status.COMPLETED:
        return None
    val, unigram, blocks = record.result.val_loss, record.info.unigram_loss, record.result.block_grad_norm
    at_unigram = val is not None and unigram is not None and abs(val - unigram) <= UNIGRAM_TOLERANCE
    no_gradient = blocks is not None and blocks <= NO_GRADIENT
    if not (at_unigram or no_gradient):
        return None
    return Collapse(val, unigram, at_unigram, no_gradient)
