"""Two components of one's own (docs/extending.md, "Components: attention and FFN options"):

attn=latent    attention whose decode cache is one latent of width `attn.rank` per token and
               layer, not keys and values of head_dim: keys and values are up-projected from
               the cached latents at every step (MLA's cache without its decoupled RoPE, so it
               takes absolute positions or ALiBi, and refuses pos=rope).
ffn=penalized  a GELU FFN whose hidden activation h is penalized: the auxiliary loss
               act_l2 = ffn.coef * mean(h^2) (logged as loss/act_l2), h's RMS a statistic on
               every log row (stat/hidden_rms, the largest over layers) and in diagnostics rows
               (diag/hidden_rms/block<i>); `ffn.width`, an optional integer (null: model.d_ff),
               is its hidden width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ablate.errors import ConfigError
from ablate.model.component import MAX_ATTN_LOGIT, MEAN_ABS_ATTN_LOGIT, CacheLayout, CacheTensor, Sublayer
from ablate.model.parametrization import Parametrization
from ablate.model.roles import Role, linear
from ablate.plugins import register_option, setting


class LatentAttention(Sublayer, nn.Module):
    def __init__(self, spec, layer: int, rank: int = 8):
        super().__init__()
        if spec.pos == "rope":
            raise ConfigError("attn=latent caches latents, from which RoPE's rotated keys are not rebuilt: "
                              "use pos=learned, sinusoidal, alibi or nope")
        d, self.H, self.hd = spec.d_model, spec.n_heads, spec.head_dim
        width = self.H * self.hd
        self.q = linear(d, width, spec.bias, Role.INPUT)
        self.down = linear(d, rank, spec.bias, Role.INPUT)  # the latent: what the cache holds
        self.up = linear(rank, 2 * width, spec.bias, Role.INPUT, fused=(width, width))  # keys, values
        self.proj = linear(width, d, spec.bias, Role.OUTPUT)
        self.scale = Parametrization.of(spec).attn_scale  # None: 1/sqrt(head_dim)
        self.kv_cache = None  # a LayerCache of one tensor, "latent", while decoding
        self.recording, self.stats = False, {}

    def forward(self, x: torch.Tensor, ctx) -> torch.Tensor:
        B, T, _ = x.shape
        c = self.down(x)  # (B, T, r)
        if self.kv_cache is not None:
            c = self.kv_cache.append(latent=c)["latent"]  # (B, S, r): every position so far
        S = c.shape[1]
        q = self.q(x).view(B, T, self.H, self.hd).transpose(1, 2)  # (B, H, T, hd)
        k, v = self.up(c).view(B, S, 2, self.H, self.hd).permute(2, 0, 3, 1, 4)  # (B, H, S, hd) each
        future = torch.ones(T, S, dtype=torch.bool, device=x.device).triu(S - T + 1)  # (T, S)
        scores = q @ k.transpose(-2, -1) * (self.scale or self.hd ** -0.5)  # (B, H, T, S)
        if self.recording:
            causal = scores.detach().masked_fill(future, float("nan"))
            self.stats = {MAX_ATTN_LOGIT: causal.nan_to_num(float("-inf")).amax(),
                          MEAN_ABS_ATTN_LOGIT: causal.abs().nanmean()}
        scores = scores + ctx.bias if ctx.bias is not None else scores.masked_fill(future, float("-inf"))
        y = scores.softmax(dim=-1) @ v  # (B, H, T, hd)
        return self.proj(y.transpose(1, 2).reshape(B, T, self.H * self.hd))

    def record(self, on: bool) -> None:
        self.recording, self.stats = on, {}

    def diag_stats(self) -> dict:
        return self.stats


def latent_params(spec, layer: int) -> int:
    d, r, w, b = spec.d_model, spec.attn.rank, spec.n_heads * spec.head_dim, int(spec.bias)
    return (d * w + b * w) + (d * r + b * r) + (r * 2 * w + b * 2 * w) + (w * d + b * d)


register_option(
    "attn", "latent", LatentAttention, settings={"rank": 8},
    params=latent_params,
    flops=lambda spec, layer, T: 6 * latent_params(spec, layer) + 12 * spec.n_heads * spec.head_dim * T,
    cache=lambda spec, layer: CacheLayout((CacheTensor("latent", (spec.attn.rank,)),)),
    flops_formula="6*N + 12*L*d_attn*T, N counting the latent's down and up projections",
    cache_formula="attn.rank * L * bytes per element (one latent per token and layer)")


class PenalizedFFN(Sublayer, nn.Module):
    def __init__(self, spec, layer: int, coef: float = 0.01, width=None):
        super().__init__()
        width = spec.d_ff if width is None else width
        self.up = linear(spec.d_model, width, spec.bias, Role.INPUT)
        self.down = linear(width, spec.d_model, spec.bias, Role.OUTPUT)
        self.coef = coef
        self.loss = self.rms = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.up(x))  # (B, T, width)
        self.loss = self.coef * h.float().pow(2).mean()
        self.rms = h.detach().float().pow(2).mean().sqrt()
        return self.down(h)

    def aux_losses(self) -> dict:
        return {"act_l2": self.loss}

    def log_stats(self) -> dict:
        return {"hidden_rms": self.rms}

    def diag_stats(self) -> dict:
        return {} if self.rms is None else {"hidden_rms": self.rms}


def penalized_params(spec, layer: int) -> int:
    width = spec.d_ff if spec.ffn.width is None else spec.ffn.width
    return 2 * spec.d_model * width + int(spec.bias) * (width + spec.d_model)


register_option("ffn", "penalized", PenalizedFFN, settings={"coef": 0.01, "width": setting(None, int)},
                params=penalized_params, losses=("act_l2",), stats={"hidden_rms": "max"})
