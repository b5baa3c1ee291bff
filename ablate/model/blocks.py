"""Axis `norm_pos`: where the norms sit in a block. One small class per option, so the
structural difference is visible in `forward`. Declared (name, norms per block, whether the model
adds a final norm) in ablate/model/options.py.

Every block knows its layer index (`self.layer`, 0-based) and builds that layer's attention and
FFN components (`self.attn`, `self.ffn`: the attn and ffn axes' choices, ablate/model/component.py).
A block class takes (spec, make_norm): the index reaches Block.__init__ from the build
(BlockOption.build), so a plugin block written before blocks knew it keeps working.

Every block scales each residual branch by `self.branch_multiplier` (1.0: standard
parametrization; a depth parametrization such as CompleteP sets it from the spec), so a block
written today needs no change when it does."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import nn

from ablate.model import options
from ablate.model.axis import building_layer
from ablate.model.options import norm_factory
from ablate.model.positions import AttnContext
from ablate.model.spec import ModelSpec

NormFactory = Callable[[int], Any]  # width -> a norm module (ablate.model.options.norm_factory)


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, make_norm: NormFactory, layer: Optional[int] = None):
        super().__init__()
        self.layer = building_layer() if layer is None else layer
        self.attn = options.get("attn", spec.attn).build(spec, self.layer)
        self.ffn = options.get("ffn", spec.ffn).build(spec, self.layer)
        self.branch_multiplier = 1.0  # on each branch before its residual add


class PreNormBlock(Block):
    """Pre-norm (GPT-2, Llama); the model adds a final norm (as after sandwich and reordered).

        x ─┬─ norm1 ─ attn ─(+)─┬─ norm2 ─ ffn ─(+)─>
           └────────────────┘   └──────────────┘

    With model.parallel_block (GPT-J, PaLM): x + attn(norm1(x)) + ffn(norm1(x)).
    """

    def __init__(self, spec, make_norm):
        super().__init__(spec, make_norm)
        self.parallel = spec.parallel_block
        self.norm1 = make_norm(spec.d_model)
        self.norm2 = None if self.parallel else make_norm(spec.d_model)

    def forward(self, x: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        m = self.branch_multiplier
        if self.parallel:
            h = self.norm1(x)
            return x + m * self.attn(h, ctx) + m * self.ffn(h)
        x = x + m * self.attn(self.norm1(x), ctx)
        return x + m * self.ffn(self.norm2(x))


class PostNormBlock(Block):
    """Post-norm (Vaswani et al. 2017): norm after the residual add; no final norm.

        x ─┬─ attn ─(+)─ norm1 ─┬─ ffn ─(+)─ norm2 ─>
           └────────┘           └───────┘
    """

    def __init__(self, spec, make_norm):
        super().__init__(spec, make_norm)
        self.norm1 = make_norm(spec.d_model)
        self.norm2 = make_norm(spec.d_model)

    def forward(self, x, ctx):
        m = self.branch_multiplier
        x = self.norm1(x + m * self.attn(x, ctx))
        return self.norm2(x + m * self.ffn(x))


class SandwichBlock(Block):
    """Sandwich norm (Gemma 2): norm before and after each sublayer, then the residual add.

        x ─┬─ pre_attn ─ attn ─ post_attn ─(+)─┬─ pre_ffn ─ ffn ─ post_ffn ─(+)─>
           └───────────────────────────────┘   └─────────────────────────────┘
    """

    def __init__(self, spec, make_norm):
        super().__init__(spec, make_norm)
        self.pre_attn_norm = make_norm(spec.d_model)
        self.post_attn_norm = make_norm(spec.d_model)
        self.pre_ffn_norm = make_norm(spec.d_model)
        self.post_ffn_norm = make_norm(spec.d_model)

    def forward(self, x, ctx):
        m = self.branch_multiplier
        x = x + m * self.post_attn_norm(self.attn(self.pre_attn_norm(x), ctx))
        return x + m * self.post_ffn_norm(self.ffn(self.pre_ffn_norm(x)))


OLMO2_EPS = 1e-6  # OLMo 2's RMSNorm eps


def output_norm_eps(spec: ModelSpec) -> float:
    """eps for a norm that reads a sublayer's output (reordered): min(norm.eps, OLMo 2's 1e-6)
    times init_std^2. norm.eps is sized for inputs of mean square ~1 (or the embeddings'
    init_std^2); a sublayer output at init is smaller still (block 0's attention: mean square
    ~1e-8 at d=128, less at late positions), so with eps 1e-5 the norm returned eps-limited
    values (output RMS 0.03, not 1) and block 0 started nearly off. Scaled, eps stays below
    those outputs, as OLMo 2's 1e-6 is below most of them at its d=4096."""
    return min(spec.norm_eps, OLMO2_EPS) * spec.init_std ** 2


class ReorderedBlock(Block):
    """Reordered norm (OLMo 2): norm on the sublayer output only, before the residual add.

        x ─┬─ attn ─ norm1 ─(+)─┬─ ffn ─ norm2 ─(+)─>
           └────────────────┘   └───────────────┘

    Differs from OLMo 2 in: eps (see output_norm_eps; OLMo 2 uses RMSNorm eps 1e-6), qk_norm
    (OLMo 2 norms the whole q and k projections, qk_norm=on here norms each head like Qwen 3),
    and init (OLMo 2: N(0, 0.02) everywhere, no depth scaling; here the shared role-based init).
    """

    def __init__(self, spec, make_norm):
        super().__init__(spec, make_norm)
        make_out_norm = norm_factory(spec, eps=output_norm_eps(spec))
        self.norm1 = make_out_norm(spec.d_model)
        self.norm2 = make_out_norm(spec.d_model)

    def forward(self, x, ctx):
        m = self.branch_multiplier
        x = x + m * self.norm1(self.attn(x, ctx))
        return x + m * self.norm2(self.ffn(x))
