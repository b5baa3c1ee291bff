"""Which HF tensor each of our tensors is, per family, as data: one entry per tensor name, with
`{i}` for every layer and `{p}` for the weight (and the bias, where the model has biases).

Layout differences the entries carry:
  - GPT-2 stores linear weights as Conv1D, (in, out): transposed on the way (`transpose`).
  - Our attention has one fused `qkv` Linear with rows [q; k; v] (GPT-2's c_attn has the same
    order); Llama-style models have q_proj, k_proj, v_proj (`split="qkv"`).
  - Our gated FFN has one fused `gate_up` Linear with rows [gate; up] (`split="gate_up"`).
  - Gemma's RMSNorm multiplies by (1 + w): its stored gain is ours minus 1 (`gain`, with the
    family's gain offset).
  - RoPE: both sides use the half-split (rotate_half) layout, so q/k rows need no permutation.
  - ffn=moe: the experts are 3-D banks as HF's Mixtral / Qwen3-MoE hold them (gate_up_proj
    (E, 2h, d) with rows [gate; up], down_proj (E, d, h)), the router is their `gate`; a layer
    holds its entries by kind (`layers`: "dense" FFN layers, "moe" layers; the dense_first ones
    are Qwen3-MoE's mlp_only_layers).
  - DeepseekV3's MoE layers (ffn=moe): the same banks and router, the choice bias as the router's
    `e_score_correction_bias`, the shared experts as one MLP of width shared * d_expert
    (`split="shared_gate_up"`).
  - MLA's query and kv_b projections hold each part for all heads in turn ([q_C of every head;
    q_R of every head], [keys of every head; values of every head]: kv_b's two matrices stay
    whole), DeepseekV3 each head's parts in turn: their rows are reordered (`heads`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from ablate.model.latent import LatentShape
from ablate.model.moe_spec import MoESettings, expert_width, is_moe_layer
from ablate.model.spec import ModelSpec

EMBEDDING = "tok_emb.weight"  # a tied head is the embedding: HF keeps it in its state dict too


@dataclass(frozen=True)
class TensorMap:
    """One of our tensors <-> one or more HF tensors (concatenated along dim 0 on our side)."""

    ours: str
    theirs: tuple[str, ...]
    sizes: Optional[tuple[int, ...]] = None  # row counts of the parts when theirs has several
    transpose: bool = False  # HF Conv1D: (in, out)
    offset: float = 0.0  # HF value = ours - offset (Gemma's 1 + w gains)
    rows: Optional[tuple[int, ...]] = None  # HF row i is our row rows[i] (per-head layouts)


@dataclass(frozen=True)
class W:
    """One entry of a family's weight map (see the module's docstring)."""

    ours: str
    theirs: tuple[str, ...]
    split: str = ""  # "qkv" | "gate_up": the HF tensors are row blocks of ours
    transpose: bool = False
    gain: bool = False  # a norm gain: the family's gain offset applies
    when: str = ""  # "untied" | "qk_norm" | "pre" | "sandwich" | "q_plain" | "q_latent": only in such models
    layers: str = ""  # "dense" | "moe": only in the layers whose FFN is of that kind
    heads: str = ""  # "q" | "kv_b": our rows are parts x heads, HF's heads x parts (per_head_rows)


WHEN: dict[str, Callable[[ModelSpec], bool]] = {
    "": lambda s: True, "untied": lambda s: not s.tied, "qk_norm": lambda s: s.qk_norm,
    "pre": lambda s: s.norm_pos == "pre", "sandwich": lambda s: s.norm_pos == "sandwich",
    "q_plain": lambda s: LatentShape.for_spec(s).q_rank is None,
    "q_latent": lambda s: LatentShape.for_spec(s).q_rank is not None}
LAYERS: dict[str, Callable[[ModelSpec, int], bool]] = {
    "": lambda s, i: True, "dense": lambda s, i: not is_moe_layer(s, i), "moe": is_moe_layer}


def _shared_width(spec: ModelSpec) -> int:
    m = MoESettings.of(spec.ffn)
    return m.shared * expert_width(spec, m)


SPLITS: dict[str, Callable[[ModelSpec], tuple[int, ...]]] = {
    "qkv": lambda s: (s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim, s.n_kv_heads * s.head_dim),
    "gate_up": lambda s: (s.d_ff, s.d_ff),
    "shared_gate_up": lambda s: (_shared_width(s),) * 2}
HEADS: dict[str, Callable[[ModelSpec], tuple[int, tuple[int, ...]]]] = {  # (heads, each head's parts' widths)
    "q": lambda s: (s.n_heads, (s.head_dim, LatentShape.for_spec(s).rope_dim)),  # q_C, q_R
    "kv_b": lambda s: (s.n_heads, (s.head_dim, s.head_dim))}  # keys, values


def per_head_rows(n_heads: int, widths: tuple[int, ...]) -> tuple[int, ...]:
    """The row order taking our layout, part by part ([part 0 of every head; part 1 of every
    head; ...], each part n_heads x width rows), to one head after another ([head 0's parts;
    head 1's parts; ...]): row i of the latter is row rows[i] of ours."""
    starts = [n_heads * sum(widths[:p]) for p in range(len(widths))]
    return tuple(starts[p] + h * w + j for h in range(n_heads) for p, w in enumerate(widths) for j in range(w))

_H = "transformer.h.{i}."
GPT2 = (
    W("tok_emb.weight", ("transformer.wte.weight",)),
    W("pos.emb.weight", ("transformer.wpe.weight",)),
    W("final_norm.{p}", ("transformer.ln_f.{p}",)),
    W("lm_head.weight", ("lm_head.weight",), when="untied"),
    W("blocks.{i}.norm1.{p}", (_H + "ln_1.{p}",)),
    W("blocks.{i}.norm2.{p}", (_H + "ln_2.{p}",)),
    W("blocks.{i}.attn.qkv.{p}", (_H + "attn.c_attn.{p}",), transpose=True),
    W("blocks.{i}.attn.proj.{p}", (_H + "attn.c_proj.{p}",), transpose=True),
    W("blocks.{i}.ffn.up.{p}", (_H + "mlp.c_fc.{p}",), transpose=True),
    W("blocks.{i}.ffn.down.{p}", (_H + "mlp.c_proj.{p}",), transpose=True),
)

_L = "model.layers.{i}."
ROPE = (  # Llama, Qwen 3, Gemma 2
    W("tok_emb.weight", ("model.embed_tokens.weight",)),
    W("final_norm.weight", ("model.norm.weight",), gain=True),
    W("lm_head.weight", ("lm_head.weight",), when="untied"),
    W("blocks.{i}.attn.qkv.{p}", tuple(_L + f"self_attn.{x}_proj.{{p}}" for x in "qkv"), split="qkv"),
    W("blocks.{i}.attn.proj.{p}", (_L + "self_attn.o_proj.{p}",)),
    W("blocks.{i}.ffn.gate_up.{p}", (_L + "mlp.gate_proj.{p}", _L + "mlp.up_proj.{p}"), split="gate_up",
      layers="dense"),
    W("blocks.{i}.ffn.down.{p}", (_L + "mlp.down_proj.{p}",), layers="dense"),
    W("blocks.{i}.ffn.router.weight", (_L + "mlp.gate.weight",), layers="moe"),
    W("blocks.{i}.ffn.w_in", (_L + "mlp.experts.gate_up_proj",), layers="moe"),
    W("blocks.{i}.ffn.w_out", (_L + "mlp.experts.down_proj",), layers="moe"),
    W("blocks.{i}.norm1.weight", (_L + "input_layernorm.weight",), gain=True, when="pre"),
    W("blocks.{i}.norm2.weight", (_L + "post_attention_layernorm.weight",), gain=True, when="pre"),
    W("blocks.{i}.pre_attn_norm.weight", (_L + "input_layernorm.weight",), gain=True, when="sandwich"),
    W("blocks.{i}.post_attn_norm.weight", (_L + "post_attention_layernorm.weight",), gain=True,
      when="sandwich"),
    W("blocks.{i}.pre_ffn_norm.weight", (_L + "pre_feedforward_layernorm.weight",), gain=True,
      when="sandwich"),
    W("blocks.{i}.post_ffn_norm.weight", (_L + "post_feedforward_layernorm.weight",), gain=True,
      when="sandwich"),
    W("blocks.{i}.attn.q_norm.weight", (_L + "self_attn.q_norm.weight",), gain=True, when="qk_norm"),
    W("blocks.{i}.attn.k_norm.weight", (_L + "self_attn.k_norm.weight",), gain=True, when="qk_norm"),
)

_A = _L + "self_attn."
DEEPSEEK_V3 = tuple(e for e in ROPE if ".attn." not in e.ours) + (  # dense MLPs, pre-norm, MLA
    W("blocks.{i}.attn.q.weight", (_A + "q_proj.weight",), heads="q", when="q_plain"),
    W("blocks.{i}.attn.q_a.{p}", (_A + "q_a_proj.{p}",), when="q_latent"),
    W("blocks.{i}.attn.q_norm.weight", (_A + "q_a_layernorm.weight",), when="q_latent"),
    W("blocks.{i}.attn.q_b.weight", (_A + "q_b_proj.weight",), heads="q", when="q_latent"),
    W("blocks.{i}.attn.kv_a.{p}", (_A + "kv_a_proj_with_mqa.{p}",)),
    W("blocks.{i}.attn.kv_norm.weight", (_A + "kv_a_layernorm.weight",)),
    W("blocks.{i}.attn.kv_b.weight", (_A + "kv_b_proj.weight",), heads="kv_b"),
    W("blocks.{i}.attn.proj.{p}", (_A + "o_proj.{p}",)),
    # MoE layers: the router's choice bias and the shared experts
    W("blocks.{i}.ffn.choice_bias", (_L + "mlp.gate.e_score_correction_bias",), layers="moe"),
    W("blocks.{i}.ffn.shared.gate_up.weight", (_L + "mlp.shared_experts.gate_proj.weight",
                                               _L + "mlp.shared_experts.up_proj.weight"), split="shared_gate_up",
      layers="moe"),
    W("blocks.{i}.ffn.shared.down.weight", (_L + "mlp.shared_experts.down_proj.weight",), layers="moe"),
)


def tensor_maps(entries: tuple[W, ...], spec: ModelSpec, gain_offset: float = 0.0) -> list[TensorMap]:
    """A family's entries for one model: every layer, the bias where it has biases, and only the
    entries that hold for it."""
    params = ["weight"] + (["bias"] if spec.bias else [])
    out = []
    for e in entries:
        if not WHEN[e.when](spec):
            continue
        layers = [i for i in range(spec.n_layers) if LAYERS[e.layers](spec, i)] if "{i}" in e.ours else [None]
        for i in layers:
            for p in params if "{p}" in e.ours else ["weight"]:
                out.append(TensorMap(e.ours.format(i=i, p=p), tuple(t.format(i=i, p=p) for t in e.theirs),
                                     SPLITS[e.split](spec) if e.split else None, e.transpose,
                                     gain_offset if e.gain else 0.0,
                                     per_head_rows(*HEADS[e.heads](spec)) if e.heads else None))
    return out
