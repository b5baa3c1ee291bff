"""Axis `act`: the feed-forward sublayer. Plain options use two matrices, gated ones three
(Shazeer 2020, "GLU Variants Improve Transformer"): FFN(x) = down(act(gate(x)) * up(x)).
Declared (name, function, gated or not) in ablate/model/options.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ablate.model import options
from ablate.model.roles import Role, linear
from ablate.model.spec import ModelSpec


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    # GPT-2's GELU (tanh approximation), so GPT-2 checkpoints import exactly.
    return F.gelu(x, approximate="tanh")


@dataclass(frozen=True)
class Activation:
    """An act option as the FFN uses it (a plugin may also register one: register_option("act",
    name, Activation(fn, gated=True)))."""
    fn: Callable[[torch.Tensor], torch.Tensor]
    gated: bool
    relu_family: bool = False  # outputs exact zeros, so a unit can die (diagnostics count them)


class MLP(nn.Module):
    """down(act(up(x)))"""

    def __init__(self, spec: ModelSpec, act: Activation):
        super().__init__()
        self.act = act.fn
        self.relu_family = act.relu_family
        self.up = linear(spec.d_model, spec.d_ff, spec.bias, Role.INPUT)
        self.down = linear(spec.d_ff, spec.d_model, spec.bias, Role.OUTPUT)
        self.resid_drop = nn.Dropout(spec.dropout)  # on the residual branch, as after attention

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.up(x))  # (B, T, d_ff)

    def forward(self, x):
        return self.resid_drop(self.down(self.hidden(x)))  # (B, T, d)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)); gate and up are one fused (d, 2*d_ff) matmul."""

    def __init__(self, spec: ModelSpec, act: Activation):
        super().__init__()
        self.act = act.fn
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
    option = options.get("act", spec.act)
    act = Activation(option.load(), option.gated, option.relu_family)
    return (GatedMLP if act.gated else MLP)(spec, act)
