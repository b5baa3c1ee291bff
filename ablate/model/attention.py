"""Causal self-attention: MHA, GQA and MQA differ only in n_kv_heads (axis `attn`).

PyTorch SDPA everywhere it applies (flash / memory-efficient kernels on CUDA). On CUDA,
attention-logit soft-capping (Gemma 2) and ALiBi go through FlexAttention (ablate/model/flex.py);
on CPU (FlexAttention has no CPU backward) soft-capping takes the explicit path and ALiBi SDPA
with a float mask. Recording (Sublayer.record: diagnostics, coord-check) needs the logits:
explicit path.

Decoding (Transformer.decode) gives each layer its slice of a KV cache (ablate/model/kv_cache.py,
laid out as the option declares: keys and values, ablate/model/options.py) as `kv_cache` for one
pass: the new keys and values join the cached ones there, and the new queries, at positions
offset .. offset + T - 1, attend to all of them. A plain forward pass has
no cache and takes exactly the paths above.

A sliding-window layer (its `window` = W from attn.window and attn.global_every at its layer
index, ablate/model/sliding.py) lets query i see keys j with i - W < j <= i. Where the window
hides no key (W >= the keys so far) every path above runs unchanged, so W >= T is full causal
attention bit for bit; otherwise each path takes the band: SDPA a boolean (or ALiBi's float)
mask, the explicit path the same mask, FlexAttention on CUDA a block mask that skips the blocks
outside the band. Its cache is a ring buffer of W positions (its CacheLayout's window), whose
keys come with their positions: the mask and ALiBi's bias are built from those. Sliding layers
rotate with the RoPE tables at attn.local_rope_base where it is set (AttnContext.local_rope).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ablate.model.component import MAX_ATTN_LOGIT, MEAN_ABS_ATTN_LOGIT, Sublayer
from ablate.model.flex import flex_attend, flex_supported
from ablate.model.kv_cache import LayerCache
from ablate.model.norms import RMSNorm
from ablate.model.parametrization import Parametrization
from ablate.model.positions import AttnContext, alibi_bias_at, apply_rope
from ablate.model.roles import Role, linear
from ablate.model.sliding import layer_window
from ablate.model.spec import ModelSpec


class Attention(Sublayer, nn.Module):
    """What every attention shares once its queries, keys and values are made: causal scores at
    `scale` (None: 1/sqrt(the query width)), soft-capping, ALiBi's bias, dropout on the
    probabilities, the max-logit record, and the decode cache slot. Keys and values may have
    fewer heads than the queries (each then serves n_heads / KV of them) and values another
    width than the keys (MLA's absorbed decode, ablate/model/mla.py)."""

    def __init__(self, spec: ModelSpec, scale: Optional[float]):
        super().__init__()
        self.dropout = spec.attn_dropout_rate  # on the probabilities (dropout.attn)
        self.resid_drop = nn.Dropout(spec.dropout)  # on the output, before the residual add
        self.softcap = spec.attn_softcap
        self.scale = scale
        self.record_max_logit = False  # recording (record()); forces the explicit path
        self.max_logit: Optional[torch.Tensor] = None
        self.mean_abs_logit: Optional[torch.Tensor] = None  # recorded with max_logit (coord-check)
        self.kv_cache: Optional[LayerCache] = None  # set while decoding (KVCache.attached)

    def _attend(self, q, k, v, ctx: AttnContext) -> torch.Tensor:
        """q: (B, H, T, hd) at positions S - T .. S - 1; k: (B, KV, S, hd), v: (B, KV, S, hd_v)
        at 0 .. S - 1 (S == T without a cache). Returns (B, H, T, hd_v)."""
        T, S = q.shape[2], k.shape[2]
        p_drop = self.dropout if self.training else 0.0
        gqa = k.shape[1] != q.shape[1]  # each KV head serves H / KV queries
        if (self.softcap is not None or ctx.alibi_slopes is not None) and not self.record_max_logit \
                and S == T and flex_supported(q, p_drop):  # CUDA: one fused kernel, causal blocks skipped
            return flex_attend(q, k, v, self.softcap, ctx.alibi_slopes, scale=self.scale)  # GQA inside
        if self.softcap is not None or self.record_max_logit:
            return self._explicit(q, *self._repeat_kv(k, v, q.shape[1]), ctx.bias, p_drop)
        # SDPA broadcasts KV heads itself (enable_gqa: no copies; on CPU 0-3% faster than
        # repeat_interleave, measured with `ablate bench`), except CUDA fp32, whose kernels
        # lack GQA and would fall back to the math path.
        native = gqa and not (q.is_cuda and q.dtype == torch.float32)
        if gqa and not native:
            k, v = self._repeat_kv(k, v, q.shape[1])
        mask = ctx.bias  # ALiBi's, causal -inf included
        if mask is None and S != T:  # cached keys: is_causal would align the queries at 0, not S - T
            mask = ~future_mask(T, S, q.device)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, dropout_p=p_drop, enable_gqa=native,
            scale=self.scale)

    @staticmethod
    def _repeat_kv(k, v, n_heads: int):
        rep = n_heads // k.shape[1]
        if rep == 1:
            return k, v
        return k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # (B, H, T, hd)

    def _explicit(self, q, k, v, bias, p_drop, hidden: Optional[torch.Tensor] = None):
        """hidden: (T, S) True where a query may not see a key (None: the future ones)."""
        if hidden is None:
            hidden = future_mask(q.shape[2], k.shape[2], q.device)  # (T, S)
        scores = q @ k.transpose(-2, -1)  # (B, H, T, S)
        scores = scores / math.sqrt(q.shape[-1]) if self.scale is None else scores * self.scale
        if self.record_max_logit:  # raw q.k logit (before capping, position bias), seen entries only
            self._record_logits(scores.detach(), hidden)
        if self.softcap is not None:
            scores = self.softcap * torch.tanh(scores / self.softcap)
        if bias is not None:
            scores = scores + bias
        else:
            scores = scores.masked_fill(hidden, float("-inf"))
        probs = F.dropout(scores.softmax(dim=-1), p=p_drop, training=p_drop > 0)
        return probs @ v  # (B, H, T, hd_v)

    def _record_logits(self, scores: torch.Tensor, hidden: torch.Tensor) -> None:
        """The largest scaled logit and the mean |scaled logit|, over the entries attended to (the
        causal ones, within a window where there is one)."""
        self.max_logit = scores.masked_fill(hidden, float("-inf")).amax()
        seen = (~hidden).sum() * (scores.numel() // hidden.numel())  # entries per (T, S) x batch x heads
        self.mean_abs_logit = scores.abs().masked_fill(hidden, 0.0).sum() / seen

    def record(self, on: bool) -> None:
        self.record_max_logit = on
        self.max_logit = self.mean_abs_logit = None

    def diag_stats(self) -> dict[str, torch.Tensor]:
        if self.max_logit is None:
            return {}
        return {MAX_ATTN_LOGIT: self.max_logit, MEAN_ABS_ATTN_LOGIT: self.mean_abs_logit}


class CausalSelfAttention(Attention):
    def __init__(self, spec: ModelSpec, layer: int = 0, window: Optional[int] = None,
                 global_every: Optional[int] = None, local_rope_base: Optional[float] = None):
        # the logits' scale: None is 1/sqrt(head_dim); param=mup: sqrt(base_head_dim) / head_dim
        super().__init__(spec, Parametrization.of(spec).attn_scale)
        # keys a query sees, counting itself (None: full); local_rope_base reaches RoPE (positions.py)
        self.window = layer_window(window, global_every, layer)
        self.n_heads, self.n_kv_heads, self.head_dim = spec.n_heads, spec.n_kv_heads, spec.head_dim
        q_out, kv_out = spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim
        self.split = (q_out, kv_out, kv_out)
        self.qkv = linear(spec.d_model, q_out + 2 * kv_out, spec.bias, Role.INPUT, fused=self.split)
        self.proj = linear(q_out, spec.d_model, spec.bias, Role.OUTPUT)
        # Per-head RMSNorm on q and k (Qwen 3 / OLMo 2 style), gains shared across heads.
        self.q_norm = RMSNorm(spec.head_dim, eps=spec.norm_eps) if spec.qk_norm else None
        self.k_norm = RMSNorm(spec.head_dim, eps=spec.norm_eps) if spec.qk_norm else None

    def forward(self, x: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.qkv(x).split(self.split, dim=-1)
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        k = k.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, KV, T, hd)
        v = v.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, KV, T, hd)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        rope = ctx.local_rope if self.window is not None and ctx.local_rope is not None else ctx.rope
        if rope is not None:
            cos, sin = rope
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        start, positions = 0, None
        if self.kv_cache is not None:  # decoding: the cached positions' keys, then these
            held = self.kv_cache.append(k=k, v=v)
            k, v, start, positions = held["k"], held["v"], held.start, held.positions  # (B, KV, S, hd)
        band = self._band(T, k.shape[2], start, positions, q.device)
        y = self._attend(q, k, v, ctx) if band is None else self._attend_band(q, k, v, ctx, band)  # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)  # (B, T, H*hd)
        return self.resid_drop(self.proj(y))

    def _band(self, T: int, S: int, start: int, positions: Optional[torch.Tensor], device) -> Optional["Band"]:
        """The window's mask for T queries at start .. start + T - 1 over S keys (at 0 .. S - 1, or
        at `positions`); None where it hides no key: the causal paths then run unchanged."""
        if self.window is None or (positions is None and S <= self.window):
            return None
        k_pos = torch.arange(S, device=device) if positions is None else positions  # (S,)
        q_pos = torch.arange(start, start + T, device=device)  # (T,)
        behind = q_pos[:, None] - k_pos[None, :]  # (T, S): how far each key is behind each query
        return Band(q_pos, k_pos, (behind < 0) | (behind >= self.window))

    def _attend_band(self, q, k, v, ctx: AttnContext, band: "Band") -> torch.Tensor:
        """Attention within the window: q (B, H, T, hd), k, v (B, KV, S, hd) at band's positions."""
        T, S = q.shape[2], k.shape[2]
        p_drop = self.dropout if self.training else 0.0
        if not self.record_max_logit and S == T and flex_supported(q, p_drop):  # CUDA: the band's blocks only
            return flex_attend(q, k, v, self.softcap, ctx.alibi_slopes, scale=self.scale, window=self.window)
        bias = None
        if ctx.alibi_slopes is not None:  # from the keys' positions (a ring buffer's are not 0 .. S - 1)
            bias = alibi_bias_at(ctx.alibi_slopes, band.q_pos, band.k_pos).masked_fill(band.hidden, float("-inf"))
            bias = bias.to(q.dtype)  # (H, T, S)
        if self.softcap is not None or self.record_max_logit:
            return self._explicit(q, *self._repeat_kv(k, v, self.n_heads), bias, p_drop, band.hidden)
        native = self.n_kv_heads != self.n_heads and not (q.is_cuda and q.dtype == torch.float32)
        if self.n_kv_heads != self.n_heads and not native:
            k, v = self._repeat_kv(k, v, self.n_heads)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=~band.hidden if bias is None else bias, dropout_p=p_drop, enable_gqa=native,
            scale=self.scale)


@dataclass(frozen=True)
class Band:
    """A sliding window's mask for one pass: the queries' positions (T,), the keys' (S,), and
    hidden (T, S), True where a key is in the query's future or W or more positions behind it."""

    q_pos: torch.Tensor
    k_pos: torch.Tensor
    hidden: torch.Tensor


def future_mask(T: int, S: int, device) -> torch.Tensor:
    """(T, S) bool, True where a key is in the query's future: queries at S - T .. S - 1, keys
    at 0 .. S - 1 (S == T: the plain causal mask)."""
    return torch.ones(T, S, dtype=torch.bool, device=device).triu(S - T + 1)
