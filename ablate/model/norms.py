"""Axis `norm`: LayerNorm and RMSNorm. Both compute in fp32 so low precision does not bias stats.
Declared (name, parameter count) in ablate/model/options.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ablate.model.roles import Role, tag


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
