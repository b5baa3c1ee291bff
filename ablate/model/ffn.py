"""Axis `act`: the feed-forward sublayer. Plain options use two matrices, gated ones three
(Shazeer 2020, "GLU Variants Improve Transformer"): FFN(x) = down(act(gate(x)) * up(x)).
Each act option's facts (its function, gated or not, ReLU family or not) are its declaration
in ablate/model/options.py, read here."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ablate.model import options
from ablate.model.axis import ActOption
from ablate.model.roles import Role, linear
from ablate.model.spec import ModelSpec


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    # GPT-2's GELU (tanh approximation), so GPT-2 checkpoints import exactly.
    return F.gelu(x, approximate="tanh")


class MLP(nn.Module):
    """down(act(up(x)))"""

    def __init__(self, spec: ModelSpec, act: ActOption):
        super().__init__()
        self.act = act.function(spec)
        self.relu_family = act.relu_family  # diagnostics count its dead units
        self.up = linear(spec.d_model, spec.d_ff, spec.bias, Role.INPUT)
        self.down = linear(spec.d_ff, spec.d_model, spec.bias, Role.OUTPUT)
        self.resid_drop = nn.Dropout(spec.dropout)  # on the residual branch, as after attention

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.up(x))  # (B, T, d_ff)

    def forward(self, x):
        return self.resid_drop(self.down(self.hidden(x)))  # (B, T, d)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)); gate and up are one fused (d, 2*d_ff) matmul."""

    def __init__(self, spec: ModelSpec, act: ActOption):
        super().__init__()
        self.act = act.function(spec)
        self.relu_family = act.relu_family
        self.clamp = spec.act_clamp
        self.gate_up = linear(spec.d_model, 2 * spec.d_ff, spec.bias, Role.INPUT,
                              fused=(spec.d_ff, spec.d_ff))
        self.down = linear(spec.d_ff, spec.d_model, spec.bias, Role.OUTPUT)
        self.resid_drop = nn.Dropout(spec.dropout)

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)  # (B, T, d_ff) each
        h = self.act(gate) * up
        if self.clamp is not None:
            h = h.clamp(-self.clamp, self.clamp)
        return h

    def forward(self, x):
        return self.resid_drop(self.down(self.hidden(x)))  # (B, T, d)


def build_ffn(spec: ModelSpec) -> nn.Module:
    act = options.get("act", spec.act)
    return (GatedMLP if act.gated else MLP)(spec, act)
