"""Every axis and every built-in option, each declared once (torch-free; ablate/model/axis.py
says what a declaration holds). A new option is one `register_option` call here, its class in
the axis's file (norms.py, blocks.py, ffn.py, positions.py); a plugin makes the same call from
its own module. Parameter counts are per option; ablate/model/spec.py adds them up.
"""

from __future__ import annotations

from ablate.errors import ConfigError
from ablate.model.axis import (AXES, ActOption, AttnOption, BlockOption, FlagOption, NormOption,
                               OptimOption, ParamOption, PosOption, declare_axis, declared, default, get,
                               names, norm_factory, register_option, store_in_hydra)

__all__ = ["AXES", "declared", "default", "get", "names", "norm_factory", "register_option",
           "store_in_hydra"]

# model.init: weight-init schemes (roles.init_weights); not an axis, a model key.
INIT_NAMES = ("normal", "xavier")


def gqa_kv_heads(n_heads: int, kv_group: int) -> int:
    """KV heads for attn=gqa: the largest divisor d of n_heads with 2 <= d <= max(2, n_heads /
    kv_group) and d < n_heads, so gqa never degenerates into mqa (1) or mha (n_heads); if no
    divisor is that small (n_heads=9 with kv_group 4) the smallest one above it."""
    proper = [d for d in range(2, n_heads) if n_heads % d == 0]
    if not proper:
        raise ConfigError(
            f"attn=gqa needs model.n_heads with a divisor d, 1 < d < n_heads, to use as the KV "
            f"head count; model.n_heads={n_heads} has none: use a head count such as 4, 6 or 8 "
            f"(or attn=mqa / attn=mha)")
    bound = max(2.0, n_heads / kv_group)
    below = [d for d in proper if d <= bound]
    return max(below) if below else min(proper)


def check_kv_heads(attn: str, n_heads: int, n_kv_heads: int) -> None:
    """An explicit model.n_kv_heads must be what the attn option means, or it says another."""
    option = get("attn", attn)
    if option.fits is None or option.fits(n_heads, n_kv_heads):
        return
    fits = next((o.name for o in declared("attn") if o.fits and o.fits(n_heads, n_kv_heads)), None)
    hint = (f"use attn={fits} for that value, or change model.n_kv_heads" if fits else
            "model.n_kv_heads must be between 1 and model.n_heads")
    raise ConfigError(f"model.n_kv_heads={n_kv_heads} contradicts attn={attn}, which needs "
                      f"{option.needs.format(n_heads=n_heads)}; {hint}")


# ---- norm (ablate/model/norms.py): params of one norm of width d --------------------------------
declare_axis("norm", NormOption, default="layernorm", eps=1e-5)
register_option("norm", "layernorm", "ablate.model.norms:LayerNorm",
                params=lambda spec, d: d * (2 if spec.bias else 1))  # gain (+ beta with bias=on)
register_option("norm", "rmsnorm", "ablate.model.norms:RMSNorm", params=lambda spec, d: d)  # gain
register_option("norm", "dyt", "ablate.model.norms:DyT", settings={"alpha0": 0.5}, normalizes=False,
                params=lambda spec, d: d * (2 if spec.bias else 1) + 1)  # gain (+ beta) + alpha

# ---- norm_pos (ablate/model/blocks.py): a block's norms, given one norm's params ----------------
declare_axis("norm_pos", BlockOption, default="pre")
register_option("norm_pos", "pre", "ablate.model.blocks:PreNormBlock",  # parallel: one shared norm
                params=lambda spec, norm: norm * (1 if spec.parallel_block else 2))
register_option("norm_pos", "post", "ablate.model.blocks:PostNormBlock",
                params=lambda spec, norm: 2 * norm, final_norm=False)
register_option("norm_pos", "sandwich", "ablate.model.blocks:SandwichBlock",
                params=lambda spec, norm: 4 * norm)
register_option("norm_pos", "reordered", "ablate.model.blocks:ReorderedBlock",
                params=lambda spec, norm: 2 * norm)

# ---- act (ablate/model/ffn.py): plain FFNs have two matrices, gated ones three ----------------
declare_axis("act", ActOption, default="gelu")
register_option("act", "relu", "torch.nn.functional:relu", relu_family=True)
register_option("act", "gelu", "ablate.model.ffn:gelu_tanh")
register_option("act", "silu", "torch.nn.functional:silu")
register_option("act", "swiglu", "torch.nn.functional:silu", gated=True)
register_option("act", "geglu", "ablate.model.ffn:gelu_tanh", gated=True)
register_option("act", "reglu", "torch.nn.functional:relu", gated=True, relu_family=True)

# ---- pos (ablate/model/positions.py): only learned positions are parameters --------------------
declare_axis("pos", PosOption, default="learned", base=10000.0)  # base: RoPE's theta
register_option("pos", "learned", "ablate.model.positions:Learned",
                params=lambda spec: spec.max_seq_len * spec.d_model)
for _name, _cls in (("sinusoidal", "Sinusoidal"), ("rope", "RoPE"), ("alibi", "ALiBi"), ("nope", "NoPE")):
    register_option("pos", _name, f"ablate.model.positions:{_cls}", params=lambda spec: 0)

# ---- attn (ablate/model/attention.py): the KV head count; params follow from it ----------------
# kv_group: gqa's n_kv_heads ~ n_heads / kv_group (gqa_kv_heads); an explicit model.n_kv_heads wins
declare_axis("attn", AttnOption, default="mha", kv_group=4)
register_option("attn", "mha", lambda n_heads, kv_group: n_heads,
                fits=lambda n_heads, n_kv: n_kv == n_heads, needs="model.n_kv_heads == model.n_heads={n_heads}")
register_option("attn", "gqa", gqa_kv_heads,
                fits=lambda n_heads, n_kv: 1 < n_kv < n_heads, needs="1 < model.n_kv_heads < model.n_heads={n_heads}")
register_option("attn", "mqa", lambda n_heads, kv_group: 1,
                fits=lambda n_heads, n_kv: n_kv == 1, needs="model.n_kv_heads=1")

# ---- flags: what each option sets in the ModelSpec ---------------------------------------------
declare_axis("tie", FlagOption, default="tied")  # the output head shares the embedding matrix
register_option("tie", "tied", True)
register_option("tie", "untied", False)
declare_axis("bias", FlagOption, default="on")  # linear layers (and LayerNorm) carry a bias
register_option("bias", "on", True)
register_option("bias", "off", False)
# dropout.rate on the embedding sum and each sublayer output; dropout.attn on attention
# probabilities (null: the same rate)
declare_axis("dropout", FlagOption, default="off", rate=0.0, attn=None)
register_option("dropout", "off", False)
register_option("dropout", "on", True, config={"rate": 0.1})
declare_axis("qk_norm", FlagOption, default="off")  # RMSNorm on queries and keys, per head
register_option("qk_norm", "off", False)
register_option("qk_norm", "on", True)

# ---- param (ablate/model/parametrization.py): how init, LR and multipliers follow the shape -----
# The reference shape is model.base_width / model.base_depth (null: the run's own, where every
# option trains as sp); docs/parametrization.md has the rules and their papers.
declare_axis("param", ParamOption, default="sp")
register_option("param", "sp", "ablate.model.parametrization:Parametrization")  # today's model
register_option("param", "mup", "ablate.model.parametrization:Parametrization", width=True)  # Yang et al. 2022
register_option("param", "completep", "ablate.model.parametrization:Parametrization",  # Dey et al. 2025
                width=True, depth_alpha=1.0)

# ---- optim (ablate/train/optimizer.py): the trainer's axis, declared here with the others so the
# axis list is one list; not in ModelSpec (the model is the same under both). Muon on each logical
# hidden matrix, AdamW on the rest (docs/optimizers.md). Its keys: adjust (match_rms_adamw: Muon's
# update scaled to AdamW's RMS, one train.lr for both parts; original: Keller Jordan's scale, with
# adam_lr for the AdamW part), and Muon's own momentum, nesterov and ns_steps (refused with adamw).
declare_axis("optim", OptimOption, default="adamw", adjust="match_rms_adamw", adam_lr=None, momentum=0.95,
             nesterov=True, ns_steps=5)
register_option("optim", "adamw", "torch.optim:AdamW")
register_option("optim", "muon", "ablate.train.optimizers.muon:Muon", state_per_param=1)
