"""Axis `norm`: LayerNorm, RMSNorm and DyT. All compute in fp32 so low precision does not bias
stats. Declared (name, parameter count, settings) in ablate/model/options.py."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ablate.model.roles import ParamInit, Role, tag


class LayerNorm(nn.Module):
    """y = (x - mean) / sqrt(var + eps) * g + b   (Ba et al. 2016); b only with bias=on."""

    def __init__(self, d: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d)) if bias else None
        tag(self.weight, Role.GAIN)
        tag(self.bias, Role.BIAS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)
        y = F.layer_norm(x.float(), x.shape[-1:], self.weight.float(),
                         None if self.bias is None else self.bias.float(), self.eps)
        return y.to(x.dtype)


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * g   (Zhang & Sennrich 2019): no mean, no beta."""

    def __init__(self, d: int, eps: float = 1e-5, bias: bool = False):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        tag(self.weight, Role.GAIN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, x.shape[-1:], self.weight, self.eps)
        y = F.rms_norm(x.float(), x.shape[-1:], self.weight.float(), self.eps)
        return y.to(x.dtype)


class DyT(nn.Module):
    """y = g * tanh(alpha * x) + b   (Zhu et al. 2025, "Transformers without Normalization"):
    Dynamic Tanh, element-wise, no statistics (so no eps: accepted and unused). alpha is one
    learned scalar starting at the option's setting alpha0 (norm.alpha0, 0.5 as in the paper);
    g starts at 1, b at 0, b only with bias=on (as LayerNorm's beta).

    Unlike a norm, its output reaches |g| per coordinate only as tanh saturates, where no
    gradient passes: with inputs far below 1 (N(0, 0.02) embeddings) Adam grows the residual
    stream until the final DyT saturates and the blocks stop learning (docs/axes.md, DyT)."""

    def __init__(self, d: int, eps: float = 1e-5, bias: bool = True, alpha0: float = 0.5):
        super().__init__()
        self.alpha0 = float(alpha0)
        self.alpha = nn.Parameter(torch.empty(1))
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d)) if bias else None
        tag(self.alpha, Role.SCALAR)
        tag(self.weight, Role.GAIN)
        tag(self.bias, Role.BIAS)
        self.init_parameters()

    @torch.no_grad()
    def init_parameters(self, init: Optional[ParamInit] = None) -> None:
        """alpha = alpha0: the option's own init, not a role's (init=None: from __init__)."""
        self.alpha.fill_(self.alpha0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d) -> (..., d)
        y = torch.tanh(self.alpha.float() * x.float()) * self.weight.float()
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, bias={self.bias is not None}, alpha0={self.alpha0}"
