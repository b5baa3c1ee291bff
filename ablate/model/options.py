"""Every axis and every built-in option, each declared once (torch-free; ablate/model/axis.py
says what a declaration holds, ablate/model/component.py the contract of attention and FFN
components). A new option is one `register_option` call here, its class in the axis's file
(norms.py, blocks.py, ffn.py, positions.py, attention.py); a plugin makes the same call from its
own module. Counts, FLOPs and decode caches are per option and layer; ablate/model/spec.py adds
them up over the layers.
"""

from __future__ import annotations

from ablate.errors import ConfigError
from ablate.model import moe_spec
from ablate.model.axis import (AXES, ActOption, AttnOption, BlockOption, FfnOption, FlagOption, NormOption,
                               OptimOption, ParamOption, PosOption, component_axes, declare_axis, declared,
                               default, get, names, norm_factory, register_option, setting, store_in_hydra)
from ablate.model.component import CacheLayout, CacheTensor, kv_layout, Reduce
from ablate.model.latent import DECODE_MODES, LatentShape, ranks_of, shape_and_scales
from ablate.model.sliding import attended_keys, spec_window
from ablate.names import BALANCE_TERM, ROUTER_Z_TERM

__all__ = ["AXES", "component_axes", "declared", "default", "get", "names", "norm_factory", "register_option",
           "setting", "store_in_hydra"]

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


def check_kv_heads(attn: str, n_heads: int, n_kv_heads: int, explicit: bool = False) -> None:
    """An explicit model.n_kv_heads must be what the attn option means, or it says another; an
    option whose keys and values are not per-head (no_kv_heads) refuses any explicit value."""
    option = get("attn", attn)
    if explicit and option.no_kv_heads:
        raise ConfigError(f"model.n_kv_heads={n_kv_heads} has no meaning with attn={attn}: {option.no_kv_heads}; "
                          f"leave model.n_kv_heads null")
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

# ---- attn (ablate/model/attention.py): MHA, GQA and MQA differ in the KV head count only -------
def attention_params(spec, layer: int) -> int:
    """One layer's q, k, v and output projections (biases with bias=on), and QK-norm's two gains
    of head_dim shared across heads."""
    d, hd, b = spec.d_model, spec.head_dim, 1 if spec.bias else 0
    q_out, kv_out = spec.n_heads * hd, spec.n_kv_heads * hd
    qk_norm = 2 * hd if spec.qk_norm else 0
    return d * (q_out + 2 * kv_out) + b * (q_out + 2 * kv_out) + q_out * d + b * d + qk_norm


def attention_flops(spec, layer: int, seq_len: int) -> int:
    """PaLM appendix B per layer: 6 x its weights (all in matmuls, by convention) + 12 * d_attn * T
    for the score and value matmuls (QK^T and AV, forward + backward), d_attn = n_heads * head_dim;
    a sliding layer counts min(W, T) keys (OLMo-core's convention: the same at W >= T)."""
    keys = attended_keys(spec_window(spec, layer), seq_len)
    return 6 * attention_params(spec, layer) + 12 * spec.n_heads * spec.head_dim * keys


def attention_cache(spec, layer: int):
    """Keys and values of n_kv_heads x head_dim; a sliding layer keeps its window's positions."""
    return kv_layout(spec.n_kv_heads, spec.head_dim, spec_window(spec, layer))


DENSE_ATTN = dict(params=attention_params, flops=attention_flops, cache=attention_cache,
                  flops_formula=("6*N + 12*L*d_attn*T (PaLM appendix B, training = forward + backward): N = "
                                 "attention + FFN weights + the d x V output head (tied or not), L = layers, "
                                 "d_attn = n_heads * head_dim, T = seq_len (the causal half of the score "
                                 "matrix is counted, by convention)"),
                  cache_formula="2 (K and V) * L * n_kv_heads * head_dim * bytes per element",
                  # sliding windows (ablate/model/sliding.py): the keys a query sees counting itself
                  # (null: full), every Nth layer full (null: all slide), sliding layers' RoPE base
                  settings={"window": setting(None, int), "global_every": setting(None, int),
                            "local_rope_base": setting(None, float)})
# kv_group: gqa's n_kv_heads ~ n_heads / kv_group (gqa_kv_heads); an explicit model.n_kv_heads wins
declare_axis("attn", AttnOption, default="mha", kv_group=4)
register_option("attn", "mha", "ablate.model.attention:CausalSelfAttention", kv_heads=lambda n_heads, kv_group: n_heads,
                fits=lambda n_heads, n_kv: n_kv == n_heads, needs="model.n_kv_heads == model.n_heads={n_heads}",
                **DENSE_ATTN)
register_option("attn", "gqa", "ablate.model.attention:CausalSelfAttention", kv_heads=gqa_kv_heads,
                fits=lambda n_heads, n_kv: 1 < n_kv < n_heads, needs="1 < model.n_kv_heads < model.n_heads={n_heads}",
                **DENSE_ATTN)
register_option("attn", "mqa", "ablate.model.attention:CausalSelfAttention", kv_heads=lambda n_heads, kv_group: 1,
                fits=lambda n_heads, n_kv: n_kv == 1, needs="model.n_kv_heads=1", **DENSE_ATTN)


# ---- attn=mla (ablate/model/mla.py; its shapes, counts and costs: ablate/model/latent.py) -------
def check_mla(spec) -> None:
    """What MLA cannot combine with, and its settings' values (ranks, rope_dim, decode)."""
    settings = spec.settings.of("attn")
    if spec.qk_norm:
        raise ConfigError("qk_norm=on norms each head's full key, which attn=mla never builds when it decodes "
                          "(it scores against the cached latent); use qk_norm=off with attn=mla")
    if settings["decode"] not in DECODE_MODES:
        raise ConfigError(f"attn.decode={settings['decode']!r} must be one of {', '.join(DECODE_MODES)}")
    LatentShape.for_spec(spec)  # the ranks and rope_dim


def _mla_details(spec, layer: int, seq_len: int) -> dict:
    scales = shape_and_scales(spec, get("param", spec.param).width, **ranks_of(spec))[1]
    return LatentShape.for_spec(spec).details(scales, seq_len)


register_option(
    "attn", "mla", "ablate.model.mla:MultiHeadLatentAttention",
    # ranks null: derived from head_dim (ablate/model/latent.py); decode: how a decode step attends
    settings={"kv_rank": setting(None, int), "q_rank": setting(None, int), "rope_dim": setting(None, int),
              "decode": DECODE_MODES[0]},
    kv_heads=lambda n_heads, kv_group: n_heads,  # every head has its keys and values (from the latent)
    fits=lambda n_heads, n_kv: n_kv == n_heads, needs="model.n_kv_heads == model.n_heads={n_heads}",
    no_kv_heads="its keys and values are up-projected for every head from one latent per position (attn.kv_rank)",
    params=lambda spec, layer: LatentShape.for_spec(spec).params(),
    flops=lambda spec, layer, seq_len: LatentShape.for_spec(spec).train_flops(seq_len),
    # one tensor (B, 1, positions, kv_rank + rope_dim): [normed latent | rotated rope key]
    cache=lambda spec, layer: CacheLayout((CacheTensor("latent", (1, LatentShape.for_spec(spec).cache_width), 1),)),
    rope_width=lambda spec: LatentShape.for_spec(spec).rope_dim,
    check=check_mla,
    details=_mla_details,
    flops_formula=("6*N + 6*L*n_heads*(2*head_dim + rope_dim)*T (PaLM appendix B's convention, training = "
                   "forward + backward): N = attention + FFN weights + the d x V output head, L = layers, scores "
                   "over head_dim + rope_dim and values of head_dim per head, T = seq_len"),
    cache_formula="(kv_rank + rope_dim) (the normed latent and the shared rope key) * L * bytes per element")


# ---- ffn (ablate/model/ffn.py): the feed-forward sublayer; its GLU structure follows `act` -----
def ffn_layer_params(d_model: int, d_ff: int, gated: bool, bias: bool) -> int:
    """One FFN's parameters: 2 (plain) or 3 (gated) matrices, plus biases with bias=on (the
    formula an MoE's experts share: moe_spec.expert_params)."""
    return moe_spec.expert_params(d_model, d_ff, gated, bias)


declare_axis("ffn", FfnOption, default="dense")
register_option("ffn", "dense", "ablate.model.ffn:build_ffn",  # up/down, or gate_up/down with a gated act
                params=lambda spec, layer: ffn_layer_params(spec.d_model, spec.d_ff, spec.gated, spec.bias))
# moe (ablate/model/moe.py; counts and checks in moe_spec.py): E experts of the act axis's kind, each
# token routed to k; the defaults are OLMoE's recipe at 8 experts top-2 (softmax, no renorm,
# balancing loss 0.01, router z-loss 0.001, dropless); d_expert null: the fair width. DeepSeek's
# parts: shared experts, the sigmoid router, the choice bias (balance=bias, bias_rate null: 0.001),
# the sequence-wise loss; capacity null: dropless
register_option("ffn", "moe", "ablate.model.moe:build_moe",
                settings=dict(experts=8, top_k=2, d_expert=setting(None, int), renorm=False, balance="aux",
                              aux_coef=0.01, z_coef=0.001, dense_first=0, router="softmax", shared=0,
                              aux_scope="batch", bias_rate=setting(None, float), capacity=setting(None, float)),
                params=lambda spec, layer: moe_spec.layer_params(spec, layer),
                active=lambda spec, layer: moe_spec.layer_params(spec, layer, active=True),
                check=lambda spec: moe_spec.check_spec(spec), losses=(BALANCE_TERM, ROUTER_Z_TERM),
                stats={moe_spec.DROPPED: Reduce.MEAN})

# ---- flags: what each option sets in the ModelSpec ---------------------------------------------
declare_axis("tie", FlagOption, default="tied")  # the output head shares the embedding matrix
register_option("tie", "tied", True)
register_option("tie", "untied", False)
declare_axis("bias", FlagOption, default="on")  # linear layers (and LayerNorm) carry a bias
register_option("bias", "on", True)
register_option("bias", "off", False)
# dropout.rate on the embedding sum and each sublayer output; dropout.attn on attention
# probabilities (null: the same rate)
declare_axis("dropout", FlagOption, default="off", rate=0.0, attn=setting(None, float))
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
declare_axis("optim", OptimOption, default="adamw", adjust="match_rms_adamw", adam_lr=setting(None, float),
             momentum=0.95, nesterov=True, ns_steps=5)
register_option("optim", "adamw", "torch.optim:AdamW")
register_option("optim", "muon", "ablate.train.optimizers.muon:Muon", state_per_param=1)
