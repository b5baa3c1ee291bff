"""Multi-head Latent Attention's shapes, parameter counts, FLOPs and cache width (torch-free):
what `ablate inspect`, the KV cache and the module (ablate/model/mla.py) read, stated once.

DeepSeek-V2 (arXiv:2405.04434) section 2.1, in its symbols, per layer and token h_t (width d):

    c_kv  = RMSNorm(W_DKV h)            the KV latent, kv_rank (d_c) wide: this is cached
    k_C   = W_UK c_kv,  v_C = W_UV c_kv  per-head keys and values, head_dim (d_h) wide each
    k_R   = RoPE(W_KR h)                 ONE rope key of rope_dim (d_h^R), shared by all heads: cached
    c_q   = RMSNorm(W_DQ h)              the query latent, q_rank (d_c') wide (null: no latent,
    q_C   = W_UQ c_q,  q_R = RoPE(W_QR c_q)   q_C and q_R straight from h)
    score = (q_C . k_C + q_R . k_R) / sqrt(d_h + d_h^R)
    out   = W_O concat_h(softmax(score) v_C)

so a position's cache is kv_rank + rope_dim numbers per layer, against 2 * n_kv_heads * head_dim
for keys and values. Our tensors: `kv_a` = [W_DKV; W_KR] (one matrix, as HF's kv_a_proj_with_mqa),
`kv_b` = [W_UK; W_UV] (all heads' key rows, then all value rows: two matrices stacked, recorded as
fused parts so an optimizer that works per matrix can split them), `q` = [W_UQ; W_QR] (plain) or
`q_a` = W_DQ and `q_b` = [W_UQ; W_QR], `proj` = W_O. The latent norms are RMSNorms with eps 1e-6
(DeepSeek's, fixed in HF's DeepseekV3). With model.bias=on, q_a, kv_a and proj carry biases and the
up-projections none (DeepSeek-V2's and HF's layout).

Null ranks derive from head_dim in DeepSeek-V2's proportions (d_h = 128: d_c = 512, d_h^R = 64):
kv_rank 4 * head_dim, rope_dim head_dim / 2 (rounded down to an even number, at least 2); q_rank
null is the plain query projection. Derived ranks grow with the width, so a width ladder or muP
scales them; a fixed rank stays.

The decoupled part exists under pos=rope only: with any other pos (nope, or learned / sinusoidal
added at the embeddings, or ALiBi's bias on the scores) rope_dim is 0 and the cache is the latent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from ablate.errors import ConfigError

Spec = Any  # ablate.model.spec.ModelSpec (torch-free, but imports the declarations)
LATENT_NORM_EPS = 1e-6  # DeepSeek's q_a / kv_a RMSNorm eps (HF DeepseekV3 fixes it)
DECODE_MODES = ("absorbed", "plain")  # attn.decode: how a decode step attends (ablate/model/mla.py)


def derived_kv_rank(head_dim: int) -> int:
    return 4 * head_dim


def derived_rope_dim(head_dim: int) -> int:
    return max(2, head_dim // 4 * 2)


def _check_rank(key: str, value: Optional[int], derived: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"attn.{key}={value!r} must be a positive integer or null ({derived})")


@dataclass(frozen=True)
class LatentShape:
    """One MLA layer's widths, resolved (see the module docstring for the symbols)."""

    d_model: int
    n_heads: int
    head_dim: int  # d_h: each head's key content part and value
    kv_rank: int  # d_c
    q_rank: Optional[int]  # d_c'; None: a plain query projection
    rope_dim: int  # d_h^R; 0 without pos=rope
    bias: bool

    @classmethod
    def of(cls, spec: Spec, kv_rank: Optional[int] = None, q_rank: Optional[int] = None,
           rope_dim: Optional[int] = None, head_dim: Optional[int] = None) -> "LatentShape":
        """The settings (attn.kv_rank, attn.q_rank, attn.rope_dim; null: derived) resolved for
        `spec`, at its head dim or at `head_dim` (muP's base model); ConfigError in one line for
        a rank below 1, an odd rope_dim, or a rope_dim without pos=rope."""
        hd = spec.head_dim if head_dim is None else head_dim
        _check_rank("kv_rank", kv_rank, "null: 4 * head_dim")
        _check_rank("q_rank", q_rank, "null: a plain query projection")
        _check_rank("rope_dim", rope_dim, "null: head_dim / 2 with pos=rope")
        rope = str(spec.pos) == "rope"
        if rope_dim is not None and not rope:
            raise ConfigError(f"attn.rope_dim={rope_dim} is the width of MLA's decoupled RoPE key, which "
                              f"needs pos=rope; with pos={spec.pos} leave attn.rope_dim null (no rope part)")
        if rope_dim is not None and rope_dim % 2:
            raise ConfigError(f"attn.rope_dim={rope_dim} must be even: RoPE rotates pairs of dimensions")
        return cls(d_model=spec.d_model, n_heads=spec.n_heads, head_dim=hd,
                   kv_rank=derived_kv_rank(hd) if kv_rank is None else kv_rank, q_rank=q_rank,
                   rope_dim=(derived_rope_dim(hd) if rope_dim is None else rope_dim) if rope else 0,
                   bias=bool(spec.bias))

    @classmethod
    def for_spec(cls, spec: Spec) -> "LatentShape":
        """The shape of an attn=mla spec's layers, from its attn settings."""
        return cls.of(spec, **ranks_of(spec))

    @property
    def qk_dim(self) -> int:
        """Each head's query and key width: head_dim + rope_dim."""
        return self.head_dim + self.rope_dim

    @property
    def cache_width(self) -> int:
        """Numbers a layer caches per position: the latent and the shared rope key."""
        return self.kv_rank + self.rope_dim

    @property
    def q_out(self) -> int:
        """The query projection's rows: every head's content part, then every head's rope part."""
        return self.n_heads * self.qk_dim

    @property
    def kv_b_parts(self) -> tuple[int, int]:
        """kv_b's two matrices (rows): W_UK (all heads' keys), W_UV (all heads' values)."""
        return self.n_heads * self.head_dim, self.n_heads * self.head_dim

    def projections(self) -> dict[str, int]:
        """Parameters by module (attribute name in ablate/model/mla.py), biases included."""
        d, b = self.d_model, 1 if self.bias else 0
        out = {}
        if self.q_rank is None:
            out["q"] = d * self.q_out
        else:
            out.update(q_a=d * self.q_rank + b * self.q_rank, q_norm=self.q_rank, q_b=self.q_rank * self.q_out)
        out.update(kv_a=d * self.cache_width + b * self.cache_width, kv_norm=self.kv_rank,
                   kv_b=self.kv_rank * sum(self.kv_b_parts),
                   proj=self.n_heads * self.head_dim * d + b * d)
        return out

    def params(self) -> int:
        return sum(self.projections().values())

    def train_flops(self, seq_len: int) -> int:
        """Training FLOPs per token (forward + backward), PaLM appendix B's convention: 6 x the
        weights, plus 6 x the score (q.k over head_dim + rope_dim) and value (head_dim) matmuls
        per head at sequence length T: 6 * n_heads * (2 * head_dim + rope_dim) * T (MHA's
        12 * d_attn * T when rope_dim is 0)."""
        return 6 * self.params() + 6 * self.n_heads * (2 * self.head_dim + self.rope_dim) * seq_len

    def decode_flops(self, context: int, absorbed: bool = True) -> int:
        """Forward FLOPs (2 per multiply-add) of one decode step attending to `context` positions.

        absorbed: the query's content part is taken into the latent (q_C W_UK: n_heads x head_dim
        x kv_rank), scores are taken against the cached latent and rope key (kv_rank + rope_dim
        per position and head), the weighted latents summed (kv_rank) and taken out through W_UV.
        plain: every cached latent is up-projected to keys and values again (kv_rank x 2 x
        n_heads x head_dim per position), then attention as MHA's."""
        d, H, hd, c, r = self.d_model, self.n_heads, self.head_dim, self.kv_rank, self.rope_dim
        weights = d * self.q_out if self.q_rank is None else d * self.q_rank + self.q_rank * self.q_out
        weights += d * self.cache_width + H * hd * d  # kv_a, proj
        if absorbed:
            per_step = weights + 2 * H * hd * c  # W_UK into the query, W_UV out of the latent
            per_position = H * (c + r) + H * c  # scores, weighted sum
        else:
            per_step = weights
            per_position = c * 2 * H * hd + H * (hd + r) + H * hd  # up-projection, scores, values
        return 2 * (per_step + per_position * context)

    def details(self, scales: tuple[float, float], context: int) -> dict[str, Any]:
        """What `ablate inspect` shows of one layer: the resolved ranks, the logit scales
        (content, rope: shape_and_scales), parameters by projection, and one decode step's
        FLOPs at `context` positions, absorbed and plain."""
        content, rope = scales
        return {"head_dim": self.head_dim, "kv_rank": self.kv_rank, "q_rank": self.q_rank,
                "rope_dim": self.rope_dim, "qk_dim": self.qk_dim, "cache_per_position": self.cache_width,
                "logit_scale": content, **({"rope_logit_scale": rope} if rope != content else {}),
                "params_by_projection": self.projections(), "context": context,
                "decode_flops_absorbed": self.decode_flops(context, absorbed=True),
                "decode_flops_plain": self.decode_flops(context, absorbed=False)}

    def logit_scales(self, base: Optional["LatentShape"] = None) -> tuple[float, float]:
        """(content, rope): the scales of q_C . k_C and of q_R . k_R in the score. Both are
        1 / sqrt(head_dim + rope_dim) (DeepSeek-V2). Under muP (`base`: the base model's shape,
        its width differing) each part follows muP's 1/width attention by its own width, so as to
        agree at the base: content (base head_dim / head_dim) / sqrt(base qk_dim), rope (base
        rope_dim / rope_dim) / sqrt(base qk_dim). With derived ranks both parts grow with the
        width and the scales are one, sqrt(base qk_dim) / qk_dim; a fixed rope_dim keeps its
        base scale (a fixed-width dot product does not grow)."""
        sp = 1.0 / math.sqrt(self.qk_dim if base is None else base.qk_dim)
        if base is None:
            return sp, sp
        return sp * base.head_dim / self.head_dim, sp * base.rope_dim / self.rope_dim if self.rope_dim else sp


def ranks_of(spec: Spec) -> dict[str, Optional[int]]:
    """An attn=mla spec's rank settings (null: derived)."""
    given = spec.settings.of("attn")
    return {key: given.get(key) for key in ("kv_rank", "q_rank", "rope_dim")}


def shape_and_scales(spec: Spec, width_rules: bool, kv_rank: Optional[int] = None, q_rank: Optional[int] = None,
                     rope_dim: Optional[int] = None) -> tuple[LatentShape, tuple[float, float]]:
    """A layer's widths and its logit scales, (content, rope) (LatentShape.logit_scales): with
    muP's width rules (`width_rules`, the param option's) away from the base width, against the
    base model's widths (model.base_width / n_heads per head, as muP's attention scale)."""
    shape = LatentShape.of(spec, kv_rank, q_rank, rope_dim)
    base_head_dim = spec.base_width // spec.n_heads
    base = None
    if width_rules and base_head_dim != shape.head_dim:
        base = LatentShape.of(spec, kv_rank, q_rank, rope_dim, head_dim=base_head_dim)
    return shape, shape.logit_scales(base)
