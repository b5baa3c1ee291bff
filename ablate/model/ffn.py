"""Axis `ffn`, option `dense`: the feed-forward sublayer, whose structure follows the `act` axis.
Plain options use two matrices, gated ones three (Shazeer 2020, "GLU Variants Improve
Transformer"): FFN(x) = down(act(gate(x)) * up(x)). Each act option's facts (its function, gated
or not, ReLU family or not) are its declaration in ablate/model/options.py, read here.

Both are Sublayers (ablate/model/component.py): while recording they report their hidden
activation's mean |h| (`mean_abs_ffn_hidden`, what coord-check reads) and, with a ReLU-family
activation, the fraction of hidden units that never fire (`dead_ffn_frac`)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ablate.model import options
from ablate.model.axis import ActOption
from ablate.model.component import MEAN_ABS_FFN_HIDDEN, Sublayer
from ablate.model.roles import Role, linear
from ablate.model.spec import ModelSpec

DEAD_FFN_FRAC = "dead_ffn_frac"  # its diagnostics statistic (diag/dead_ffn_frac/block<i>)


def dead_fraction(hidden: torch.Tensor) -> torch.Tensor:
    """Fraction of FFN units that are exactly zero on every token: for ReLU-family activations
    the units that never fire (never positive) over the batch. hidden: (..., d_ff)."""
    fired = hidden.detach().ne(0).flatten(0, -2).any(dim=0)  # (d_ff,)
    return 1.0 - fired.float().mean()


class DenseFFN(Sublayer, nn.Module):
    """What MLP and GatedMLP share: their hidden activation `hidden(x)`, whose mean |h| (and,
    for a ReLU family, dead units) the last recorded forward reports."""

    def __init__(self, act: ActOption):
        super().__init__()
        self.relu_family = act.relu_family  # outputs exact zeros: its dead units are counted
        self.recording = False
        self.recorded: dict[str, torch.Tensor] = {}

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.hidden(x)  # (B, T, d_ff)
        if self.recording:
            self.recorded[MEAN_ABS_FFN_HIDDEN] = h.detach().float().abs().mean()
            if self.relu_family:
                self.recorded[DEAD_FFN_FRAC] = dead_fraction(h)
        return self.resid_drop(self.down(h))  # (B, T, d)

    def record(self, on: bool) -> None:
        self.recording, self.recorded = on, {}

    def diag_stats(self) -> dict[str, torch.Tensor]:
        return dict(self.recorded)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    # GPT-2's GELU (tanh approximation), so GPT-2 checkpoints import exactly.
    return F.gelu(x, approximate="tanh")


class MLP(DenseFFN):
    """down(act(up(x)))"""

    def __init__(self, spec: ModelSpec, act: ActOption, width: Optional[int] = None):
        super().__init__(act)
        d_ff = spec.d_ff if width is None else width
        self.act = act.function(spec)
        self.up = linear(spec.d_model, d_ff, spec.bias, Role.INPUT)
        self.down = linear(d_ff, spec.d_model, spec.bias, Role.OUTPUT)
        self.resid_drop = nn.Dropout(spec.dropout)  # on the residual branch, as after attention

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.up(x))  # (B, T, d_ff)


class GatedMLP(DenseFFN):
    """down(act(gate(x)) * up(x)); gate and up are one fused (d, 2*d_ff) matmul."""

    def __init__(self, spec: ModelSpec, act: ActOption, width: Optional[int] = None):
        super().__init__(act)
        d_ff = spec.d_ff if width is None else width
        self.act = act.function(spec)
        self.clamp = spec.act_clamp
        self.gate_up = linear(spec.d_model, 2 * d_ff, spec.bias, Role.INPUT, fused=(d_ff, d_ff))
        self.down = linear(d_ff, spec.d_model, spec.bias, Role.OUTPUT)
        self.resid_drop = nn.Dropout(spec.dropout)

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)  # (B, T, d_ff) each
        h = self.act(gate) * up
        if self.clamp is not None:
            h = h.clamp(-self.clamp, self.clamp)
        return h


def build_ffn(spec: ModelSpec, layer: int = 0, width: Optional[int] = None) -> DenseFFN:
    """ffn=dense for a layer: the act axis's choice says plain or gated; `width` another hidden
    width than model.d_ff (an MoE's shared experts)."""
    act = options.get("act", spec.act)
    return (GatedMLP if act.gated else MLP)(spec, act, width)
