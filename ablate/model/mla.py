"""Multi-head Latent Attention (attn=mla; DeepSeek-V2, arXiv:2405.04434, section 2.1).

Shapes, symbols, counts and costs are in ablate/model/latent.py. The forward pass:

    h -> q (or q_a -> q_norm -> q_b) -> per head [q_C | q_R], RoPE on q_R
    h -> kv_a -> [latent | k_R] -> kv_norm on the latent, RoPE on k_R -> (the decode cache)
         plain:    kv_b(latent) -> per head k_C, v; score (q_C.k_C + q_R.k_R) / sqrt(hd + r)
         absorbed: score ((W_UK^T q_C).latent + q_R.k_R) / sqrt(hd + r), W_UV after the sum
    -> the heads' weighted values -> proj

Training (no cache) takes the plain path through SDPA: keys [k_C | k_R] (the one rope key
broadcast to every head), values v zero-padded to the keys' width (SDPA's fused kernels need
equal widths), scale 1/sqrt(head_dim + rope_dim).

Decoding caches one tensor per layer, `latent` = [normed latent | rotated k_R], (B, 1, positions,
kv_rank + rope_dim): never per-head keys or values. A decode step (one new token) is absorbed by
default (DeepSeek-V2's "absorb W_UK into W_UQ and W_UV into W_O", done per step on the query):

    q_C . k_C = q_C . (W_UK c) = (W_UK^T q_C) . c        score against the cached latent c
    sum_s p_s v_s = W_UV (sum_s p_s c_s)                 weigh the latents, then up-project once

so the step is MQA with one key head of width kv_rank + rope_dim (the cache itself), whose value
is the key's first kv_rank dims, at the scale 1/sqrt(head_dim + rope_dim); its cost does not
grow with head_dim x kv_rank per cached position. The plain path (attn.decode=plain) up-projects
every cached latent at each step, as HF's DeepseekV3 does; a prefill of several tokens always
takes it (its keys, built once, serve all its queries: cheaper than T latent scores).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ablate.model import options
from ablate.model.attention import Attention, future_mask
from ablate.model.latent import LATENT_NORM_EPS, shape_and_scales
from ablate.model.norms import RMSNorm
from ablate.model.positions import AttnContext, apply_rope
from ablate.model.roles import Role, linear
from ablate.model.spec import ModelSpec


class MultiHeadLatentAttention(Attention):
    def __init__(self, spec: ModelSpec, layer: int = 0, kv_rank: Optional[int] = None,
                 q_rank: Optional[int] = None, rope_dim: Optional[int] = None, decode: str = "absorbed"):
        width_rules = options.get("param", spec.param).width  # muP: each part's own width
        shape, (scale, rope_scale) = shape_and_scales(spec, width_rules, kv_rank, q_rank, rope_dim)
        super().__init__(spec, scale)
        # q_R . k_R's scale relative to q_C . k_C's: 1 but under muP with a fixed rope_dim
        self.rope_gain = rope_scale / scale
        self.shape = s = shape
        d, H, hd, r, c = s.d_model, s.n_heads, s.head_dim, s.rope_dim, s.kv_rank
        if s.q_rank is None:
            self.q = linear(d, s.q_out, False, Role.INPUT)  # [W_UQ; W_QR] of h
            self.q_a = self.q_norm = self.q_b = None
        else:
            self.q = None
            self.q_a = linear(d, s.q_rank, spec.bias, Role.INPUT)  # W_DQ
            self.q_norm = RMSNorm(s.q_rank, eps=LATENT_NORM_EPS)
            self.q_b = linear(s.q_rank, s.q_out, False, Role.INPUT)  # [W_UQ; W_QR] of c_q
        self.kv_a = linear(d, c + r, spec.bias, Role.INPUT)  # [W_DKV; W_KR]
        self.kv_norm = RMSNorm(c, eps=LATENT_NORM_EPS)
        self.kv_b = linear(c, 2 * H * hd, False, Role.INPUT, fused=s.kv_b_parts)  # [W_UK; W_UV]
        self.proj = linear(H * hd, d, spec.bias, Role.OUTPUT)  # W_O
        self.decode = decode  # how a cached one-token step attends: absorbed | plain (attn.decode)

    def optimizer_matrices(self) -> dict[str, dict[str, list[tuple[int, int]]]]:
        """Muon's matrices where one weight holds two maps (ablate/train/optimizers/matrices.py):
        kv_a's latent down-projection W_DKV and the shared rope key W_KR, each orthogonalized on its
        own (kv_b's W_UK and W_UV are its fused parts; init keeps kv_a one matrix)."""
        c, r = self.shape.kv_rank, self.shape.rope_dim
        return {"kv_a.weight": {"latent": [(0, c)], "rope key": [(c, c + r)]}} if r else {}

    def forward(self, x: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        s = self.shape
        B, T, _ = x.shape
        H, hd, r, c = s.n_heads, s.head_dim, s.rope_dim, s.kv_rank
        q = self.q(x) if self.q is not None else self.q_b(self.q_norm(self.q_a(x)))  # (B, T, H*(hd+r))
        q_c, q_r = q.split((H * hd, H * r), dim=-1)
        q_c = q_c.view(B, T, H, hd).transpose(1, 2)  # (B, H, T, hd)
        q_r = q_r.view(B, T, H, r).transpose(1, 2)  # (B, H, T, r)
        latent, k_r = self.kv_a(x).split((c, r), dim=-1)  # (B, T, c), (B, T, r)
        latent = self.kv_norm(latent).unsqueeze(1)  # (B, 1, T, c)
        k_r = k_r.unsqueeze(1)  # (B, 1, T, r): one rope key for all heads
        if ctx.rope is not None:
            cos, sin = ctx.rope  # (T, r) each
            q_r, k_r = apply_rope(q_r, cos, sin), apply_rope(k_r, cos, sin)
        if self.rope_gain != 1.0:
            q_r = q_r * self.rope_gain
        if self.kv_cache is not None:  # decoding: every position's latent so far
            held = self.kv_cache.append(latent=torch.cat([latent, k_r], dim=-1))["latent"]  # (B, 1, S, c+r)
            if T == 1 and self.decode == "absorbed":
                y = self._absorbed(q_c, q_r, held, ctx)
            else:
                y = self._plain(q_c, q_r, held[..., :c], held[..., c:], ctx)
        else:
            y = self._plain(q_c, q_r, latent, k_r, ctx)  # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, H * hd)  # (B, T, H*hd)
        return self.resid_drop(self.proj(y))

    def _plain(self, q_c, q_r, latent, k_r, ctx: AttnContext) -> torch.Tensor:
        """q_c (B, H, T, hd), q_r (B, H, T, r); latent (B, 1, S, c), k_r (B, 1, S, r) -> (B, H, T, hd)."""
        s = self.shape
        B, S = latent.shape[0], latent.shape[2]
        kv = self.kv_b(latent).view(B, S, 2, s.n_heads, s.head_dim)  # (B, S, 2, H, hd)
        k_c, v = kv.permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, S, hd) each
        k = torch.cat([k_c, k_r.expand(-1, s.n_heads, -1, -1)], dim=-1)  # (B, H, S, hd + r)
        q = torch.cat([q_c, q_r], dim=-1)  # (B, H, T, hd + r)
        if s.rope_dim:  # SDPA's fused kernels need values as wide as the keys (its fallback
            v = F.pad(v, (0, s.rope_dim))  # builds the T x S scores: 6x slower at T 2048 on a CPU)
        return self._attend(q, k, v, ctx)[..., :s.head_dim]

    def _absorbed(self, q_c, q_r, held, ctx: AttnContext) -> torch.Tensor:
        """q_c (B, H, T, hd), q_r (B, H, T, r) at positions S - T .. S - 1; held (B, 1, S, c + r):
        [latent | k_r] -> (B, H, T, hd). One key head for all: the heads are folded into the
        queries, so the cache is read once, never repeated per head."""
        s = self.shape
        B, H, T, _ = q_c.shape
        S, c = held.shape[2], s.kv_rank
        w_uk, w_uv = self.kv_b.weight.view(2, H, s.head_dim, c).unbind(0)  # (H, hd, c) each
        q = torch.cat([q_c @ w_uk, q_r], dim=-1)  # (B, H, T, c + r): W_UK^T q_C, then q_R
        scores = (q.reshape(B, 1, H * T, c + s.rope_dim) @ held.transpose(-2, -1)).view(B, H, T, S) * self.scale
        if self.softcap is not None:
            scores = self.softcap * torch.tanh(scores / self.softcap)
        if ctx.bias is not None:  # ALiBi's, causal -inf included
            scores = scores + ctx.bias
        else:
            scores = scores.masked_fill(future_mask(T, S, q.device), float("-inf"))
        probs = scores.softmax(dim=-1).reshape(B, 1, H * T, S)
        y = (probs @ held[..., :c]).view(B, H, T, c)  # the weighted latents
        return y @ w_uv.transpose(1, 2)  # (B, H, T, hd)
