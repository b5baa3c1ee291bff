"""FlexAttention for the attention variants SDPA cannot fuse: ALiBi, logit soft-capping and
sliding windows.

SDPA takes ALiBi only as a dense (H, T, T) float mask, which rules out the flash kernel, and it
cannot soft-cap at all (the explicit path materialises (B, H, T, T) scores); a window is a dense
boolean mask to it, computed in full. FlexAttention compiles the score modification into one
fused kernel with a block mask that skips the blocks above the diagonal (and, with a window of W,
those wholly W or more positions behind it). It is used on CUDA only: it has no CPU backward, so
CPU keeps SDPA (ALiBi, windows) and explicit attention (soft-capping).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional

import torch


_enabled = False  # train.flex_attention (set by the trainer's backend settings)


def enable(on: bool) -> None:
    global _enabled
    _enabled = bool(on)


def flex_supported(q: torch.Tensor, dropout_p: float) -> bool:
    """FlexAttention applies here: enabled, a CUDA tensor, no attention dropout (flex has none)."""
    if not _enabled or not q.is_cuda or dropout_p > 0:
        return False
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


@lru_cache(maxsize=8)
def causal_block_mask(T: int, device: torch.device):
    """Block-sparse causal mask, shared by all layers, heads and batch rows."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(_causal, None, None, T, T, device=device)


@lru_cache(maxsize=16)
def sliding_mask_mod(window: int):
    """Query q sees key kv when 0 <= q - kv < window (the window counts the query itself)."""

    def mask(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < window)

    return mask


@lru_cache(maxsize=8)
def sliding_block_mask(T: int, window: int, device: torch.device):
    """Block-sparse band mask of a sliding-window layer, shared by its heads and batch rows."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(sliding_mask_mod(window), None, None, T, T, device=device)


@lru_cache(maxsize=1)
def _compiled_flex():
    """Compiled once: uncompiled flex_attention is a slow reference implementation. Inside a
    model that is itself torch.compile'd this is traced through and fused with the rest."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


@lru_cache(maxsize=64)  # one function object per setting: compiled flex guards on it
def score_mod_for(softcap: Optional[float], alibi_slopes: Optional[torch.Tensor]):
    """score' = cap * tanh(score / cap) (Gemma 2), then + slope_h * (kv - q) (ALiBi; <= 0 for
    the causal keys): the same order as the explicit path."""

    def mod(score, b, h, q_idx, kv_idx):
        if softcap is not None:
            score = softcap * torch.tanh(score / softcap)
        if alibi_slopes is not None:
            score = score + alibi_slopes[h] * (kv_idx - q_idx)
        return score

    return mod


def flex_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softcap: Optional[float],
                alibi_slopes: Optional[torch.Tensor], compiled: bool = True,
                scale: Optional[float] = None, window: Optional[int] = None) -> torch.Tensor:
    """Causal attention with soft-capping and/or ALiBi, within `window` keys (None: all before).
    q: (B, H, T, hd); k, v: (B, KV, T, hd) with KV dividing H (GQA handled by flex itself).
    scale: the logits' (None: 1/sqrt(hd)). Returns (B, H, T, hd)."""
    from torch.nn.attention.flex_attention import flex_attention

    T = q.shape[2]
    fn = _compiled_flex() if compiled else flex_attention
    block_mask = causal_block_mask(T, q.device) if window is None else sliding_block_mask(T, window, q.device)
    return fn(q, k, v, score_mod=score_mod_for(softcap, alibi_slopes),
              block_mask=block_mask, enable_gqa=k.shape[1] != q.shape[1], scale=scale)
