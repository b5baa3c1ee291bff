"""The Hugging Face families a model exports to and imports from, keyed by the HF config's
`model_type`: what each requires of our spec, how its config maps to and from our ModelSpec,
and its weight map (weights.py).

`gpt2` (GPT2LMHeadModel: arch=gpt2, MHA only), `llama` (LlamaForCausalLM: arch=llama, any
n_kv_heads), `qwen3` (Qwen3ForCausalLM: arch=llama qk_norm=on), `gemma2` (Gemma2ForCausalLM:
rmsnorm, sandwich norm, geglu, rope, tied, emb_scale, soft-caps), `gemma3_text`
(Gemma3ForCausalLM: Gemma 2's block with QK-norm, whose (1 + w) gains it shares), `mistral`
(MistralForCausalLM: the llama block with one window on every layer), `ministral`
(MinistralForCausalLM: the llama block with sliding and full layers), `qwen3_moe` and `mixtral`
(ffn=moe) and `deepseek_v3` (attn=mla with dense MLPs). A spec field a family cannot
represent (model.act_clamp, MTP heads: none can) blocks that family, so an export is exact or
refused. Our `gelu` is the tanh approximation, HF's "gelu_new" / "gelu_pytorch_tanh". Dropout is
a training-time setting: Llama-style configs only have attention dropout, so a model trained
with dropout=on exports exactly for inference, and an imported one gets dropout.rate everywhere.

Sliding windows (attn.window, attn.global_every, attn.local_rope_base; ablate/model/sliding.py)
go where a class honours them (`Windows`): HF's `sliding_window` is our W (keys counting the
query) and `layer_types` our pattern. gpt2 and llama hold none: a windowed model is refused there
rather than exported as full attention. Mistral holds one window for every layer (it ignores
layer_types); Ministral, Qwen 3 (exported with use_sliding_window=True: without it Qwen3Config
drops the window and every layer is full) and Gemma 2 any pattern; Gemma 3 also a second RoPE
base for its sliding layers. Import reads the same fields back; a pattern that is not every Nth
layer full (attn.global_every) is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Callable, Mapping, Optional

from ablate.errors import ConfigError
from ablate.hf.weights import DEEPSEEK_V3, GPT2, ROPE, TensorMap, tensor_maps
from ablate.model.latent import LatentShape
from ablate.model.moe_spec import MoESettings, expert_width
from ablate.model.sliding import layer_windows, settings_of, spec_windows
from ablate.model.spec import ModelSpec
from ablate.registry import Registry

GELU_TANH = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
# What every family lacks: none has the gated FFN's activation clamp, multi-token heads, or an
# option's own settings but the sliding window's and those of the components a family holds
# (Family.settings_held; DyT's alpha0: no family has its option either).
NOT_IN_HF = dict(act_clamp=None, mtp_heads=0, param="sp")  # param: HF has no muP multipliers
SLIDING_KEYS = ("window", "global_every", "local_rope_base")
SLIDING, FULL = "sliding_attention", "full_attention"  # HF's layer_types


def other_settings(spec: ModelSpec, held: tuple[str, ...] = ()) -> dict:
    """The spec's option settings a family's config has no field for: all but those of the axes
    in `held` (ffn=moe's routing, attn=mla's ranks) and the attention's sliding window (which
    Windows checks)."""
    out = {axis: values for axis, values in spec.settings.to_dict().items() if axis not in held}
    attn = {k: v for k, v in out.pop("attn", {}).items() if k not in SLIDING_KEYS}
    return {**out, **({"attn": attn} if attn else {})}


class Windows(IntEnum):
    """The sliding windows a family's HF class honours, each level holding the ones below."""

    NONE = 0  # every layer attends to every key
    UNIFORM = 1  # one window on every layer (Mistral)
    PATTERN = 2  # sliding and full layers (layer_types)
    TWO_BASES = 3  # and a RoPE base of the sliding layers' own (Gemma 3)

    @classmethod
    def needed(cls, spec: ModelSpec) -> "Windows":
        window, global_every, local_base = settings_of(spec)
        if window is None:
            return cls.NONE
        return cls.TWO_BASES if local_base is not None else cls.PATTERN if global_every else cls.UNIFORM

    def refusal(self, spec: ModelSpec, family: str) -> Optional[str]:
        """Why `family` cannot hold the spec's window (the blocking entry), or None."""
        need = Windows.needed(spec)
        if need <= self:
            return None
        window, global_every, local_base = settings_of(spec)
        if self is Windows.NONE:
            return (f"attn.window={window} (needs a class with it: HF {family} has no sliding window, and "
                    "would attend to every key)")
        if need is Windows.PATTERN:
            return f"attn.global_every={global_every} (HF {family} has one window on every layer)"
        return f"attn.local_rope_base={local_base:g} (HF {family} has one RoPE base)"


def window_config_kwargs(spec: ModelSpec) -> dict:
    """HF's sliding_window and layer_types of the spec. Without a window every layer is full and
    sliding_window, which no layer then reads, is max_seq_len (Ministral builds its sliding mask
    whatever the layer types, and refuses a window of None)."""
    windows = spec_windows(spec)
    return dict(sliding_window=settings_of(spec)[0] or spec.max_seq_len,
                layer_types=[FULL if w is None else SLIDING for w in windows])


def window_spec_kwargs(sliding_window: Optional[int], layer_types: Optional[list]) -> dict:
    """The `settings` of an HF config's window (layer_types None: every layer slides); a pattern
    that attn.global_every cannot hold is refused."""
    types = list(layer_types) if layer_types is not None else None
    if sliding_window is None or (types is not None and SLIDING not in types):
        return {}
    n = len(types) if types is not None else 0
    global_every = None if types is None or FULL not in types else types.index(FULL) + 1
    if types is not None and [FULL if w is None else SLIDING for w in layer_windows(1, global_every, n)] != types:
        raise ConfigError(f"HF layer_types {types} are not every Nth layer full: ablate's attn.global_every "
                          "cannot hold that pattern")
    return {"attn": {"window": int(sliding_window), "global_every": global_every}}


# The attention and FFN components every family here holds: keys and values of n_kv_heads x
# head_dim (the head sharing is n_kv_heads, checked by rules), one dense FFN.
DENSE_COMPONENTS = {"attn": ("mha", "gqa", "mqa"), "ffn": ("dense",)}
MIN_TRANSFORMERS = 5  # RoPE's base goes in `rope_parameters`, new in transformers v5


@dataclass(frozen=True)
class Family:
    model_type: str
    model_class: str  # transformers class name of the causal LM
    required: dict  # spec field -> value the family needs (checked on export)
    spec_from_config: Callable[[Any], ModelSpec]
    config_from_spec: Callable[[ModelSpec], Any]
    weights: tuple  # its weight map (entries of weights.py)
    gain_offset: float = 0.0  # HF norm gain = ours - gain_offset
    # (field, what it needs, test) for needs that are not one fixed value
    rules: tuple[tuple[str, str, Callable[[ModelSpec], bool]], ...] = ()
    # component axis -> the options it holds (ablate/model/component.py): any other, a plugin's
    # attention with a latent cache or a routed FFN, has weights this family has no place for
    components: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(DENSE_COMPONENTS))
    windows: Windows = Windows.NONE  # the sliding windows its class honours
    # component axes whose option's settings its config holds (a routed FFN's, MLA's ranks)
    settings_held: tuple[str, ...] = ()

    def blocking(self, spec: ModelSpec) -> dict[str, str]:
        """The spec's fields this family cannot represent: field -> `field=value (needs ...)`."""
        window = self.windows.refusal(spec, self.model_type)
        held = self.settings_held
        need = "none" if not held else "no option settings but " + " and ".join(
            f"{axis}={'/'.join(self.components[axis])}'s" for axis in held)
        return {**{k: f"{k}={getattr(spec, k)!r} (needs {v!r})" for k, v in self.required.items()
                   if getattr(spec, k) != v},
                **({"settings": f"settings={spec.settings!r} (needs {need})"} if other_settings(spec, held) else {}),
                **{k: f"{k}={getattr(spec, k)!r} (needs one of {', '.join(held)})"
                   for k, held in self.components.items() if getattr(spec, k) not in held},
                **{k: f"{k}={getattr(spec, k)!r} (needs {need})" for k, need, ok in self.rules if not ok(spec)},
                **({"attn.window": window} if window else {})}

    def mismatches(self, spec: ModelSpec) -> list[str]:
        return list(self.blocking(spec).values())

    def tensor_maps(self, spec: ModelSpec) -> list[TensorMap]:
        return tensor_maps(self.weights, spec, self.gain_offset)


def transformers_module():
    """transformers, if new enough: v4 ignores `rope_parameters` and would export RoPE base 10000."""
    try:
        import transformers
    except ImportError:
        raise ConfigError("Hugging Face import/export needs the 'transformers' package: "
                          f"pip install 'transformers>={MIN_TRANSFORMERS}'") from None
    major = transformers.__version__.split(".")[0]
    if not major.isdigit() or int(major) < MIN_TRANSFORMERS:
        raise ConfigError(f"Hugging Face import/export needs transformers>={MIN_TRANSFORMERS} (for "
                          f"rope_parameters); found {transformers.__version__}: "
                          f"pip install -U 'transformers>={MIN_TRANSFORMERS}'")
    return transformers


FAMILIES: Registry[Family] = Registry("hf family")


# ---- shared pieces -------------------------------------------------------------------------------
def _rope_theta(c: Any) -> float:
    params = getattr(c, "rope_parameters", None) or {}
    if params.get("rope_type", "default") != "default":
        raise ConfigError(f"HF rope_type={params['rope_type']!r} is not supported (only 'default' RoPE)")
    return float(params.get("rope_theta", getattr(c, "rope_theta", 10000.0)))


def _check_head_dim(c: Any, head_dim: Optional[int] = None) -> None:
    head_dim = head_dim or getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    if head_dim * c.num_attention_heads != c.hidden_size:
        raise ConfigError(
            f"HF model has head_dim={head_dim} with {c.num_attention_heads} heads != hidden_size="
            f"{c.hidden_size}; ablate's head dim is d_model / n_heads")


def _rope_config_kwargs(spec: ModelSpec) -> dict:
    return dict(vocab_size=spec.vocab_size, hidden_size=spec.d_model, intermediate_size=spec.d_ff,
                num_hidden_layers=spec.n_layers, num_attention_heads=spec.n_heads,
                num_key_value_heads=spec.n_kv_heads, head_dim=spec.head_dim,
                max_position_embeddings=spec.max_seq_len, rms_norm_eps=spec.norm_eps,
                tie_word_embeddings=spec.tied, attention_dropout=spec.attn_dropout_rate,
                rope_parameters={"rope_type": "default", "rope_theta": spec.rope_base})


def _rope_spec_kwargs(c: Any, head_dim: Optional[int] = None) -> dict:
    _check_head_dim(c, head_dim)
    return dict(vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
                n_heads=c.num_attention_heads, n_kv_heads=c.num_key_value_heads or c.num_attention_heads,
                d_ff=c.intermediate_size, max_seq_len=c.max_position_embeddings, norm="rmsnorm",
                norm_eps=float(c.rms_norm_eps), pos="rope", rope_base=_rope_theta(c),
                tied=bool(c.tie_word_embeddings), init_std=float(c.initializer_range))


# ---- GPT-2 -------------------------------------------------------------------------------------
def _gpt2_spec(c: Any) -> ModelSpec:
    if c.activation_function not in GELU_TANH:
        raise ConfigError(f"HF GPT-2 activation {c.activation_function!r} is not supported (tanh GELU only)")
    if c.scale_attn_by_inverse_layer_idx or not c.scale_attn_weights:
        raise ConfigError("HF GPT-2 with non-standard attention scaling is not supported")
    return ModelSpec(vocab_size=c.vocab_size, d_model=c.n_embd, n_layers=c.n_layer, n_heads=c.n_head,
                     n_kv_heads=c.n_head, d_ff=c.n_inner or 4 * c.n_embd, max_seq_len=c.n_positions,
                     norm="layernorm", norm_eps=float(c.layer_norm_epsilon), norm_pos="pre", act="gelu",
                     pos="learned", tied=bool(getattr(c, "tie_word_embeddings", True)), bias=True,
                     dropout=float(c.resid_pdrop), init_std=float(c.initializer_range))


def _gpt2_config(spec: ModelSpec) -> Any:
    GPT2Config = transformers_module().GPT2Config
    return GPT2Config(vocab_size=spec.vocab_size, n_positions=spec.max_seq_len, n_embd=spec.d_model,
                      n_layer=spec.n_layers, n_head=spec.n_heads, n_inner=spec.d_ff,
                      activation_function="gelu_new", resid_pdrop=spec.dropout, embd_pdrop=spec.dropout,
                      attn_pdrop=spec.attn_dropout_rate, layer_norm_epsilon=spec.norm_eps,
                      initializer_range=spec.init_std, tie_word_embeddings=spec.tied,
                      # GPT-2's end-of-text id, where the vocab has it
                      bos_token_id=50256 if spec.vocab_size > 50256 else None,
                      eos_token_id=50256 if spec.vocab_size > 50256 else None)


FAMILIES.add("gpt2", Family(
    "gpt2", "GPT2LMHeadModel",
    dict(norm="layernorm", norm_pos="pre", act="gelu", pos="learned", bias=True, qk_norm=False,
         emb_scale=False, parallel_block=False, attn_softcap=None, logit_softcap=None, **NOT_IN_HF),
    _gpt2_spec, _gpt2_config, GPT2,
    # c_attn holds n_heads K and V heads: GPT-2 has no grouped-query attention
    rules=(("n_kv_heads", "n_kv_heads == n_heads", lambda s: s.n_kv_heads == s.n_heads),)))


# ---- Llama -------------------------------------------------------------------------------------
def _llama_spec(c: Any) -> ModelSpec:
    if c.hidden_act != "silu" or c.attention_bias != c.mlp_bias:
        raise ConfigError(f"HF Llama with hidden_act={c.hidden_act!r}, attention_bias={c.attention_bias}, "
                          f"mlp_bias={c.mlp_bias} is not supported (silu, equal biases)")
    return ModelSpec(**_rope_spec_kwargs(c), norm_pos="pre", act="swiglu", bias=bool(c.attention_bias),
                     dropout=float(c.attention_dropout or 0.0))


def _llama_config(spec: ModelSpec) -> Any:
    LlamaConfig = transformers_module().LlamaConfig
    return LlamaConfig(**_rope_config_kwargs(spec), hidden_act="silu", attention_bias=spec.bias,
                       mlp_bias=spec.bias, initializer_range=spec.init_std)


FAMILIES.add("llama", Family(
    "llama", "LlamaForCausalLM",
    dict(norm="rmsnorm", norm_pos="pre", act="swiglu", pos="rope", qk_norm=False, emb_scale=False,
         parallel_block=False, attn_softcap=None, logit_softcap=None, **NOT_IN_HF),
    _llama_spec, _llama_config, ROPE))


# ---- Qwen 3 (QK-norm) --------------------------------------------------------------------------
def _qwen3_spec(c: Any) -> ModelSpec:
    if c.hidden_act != "silu" or c.attention_bias:
        raise ConfigError("HF Qwen3 with attention_bias or hidden_act != silu is not supported")
    # without use_sliding_window Qwen3Config has set sliding_window to None: every layer full
    return ModelSpec(**_rope_spec_kwargs(c), norm_pos="pre", act="swiglu", bias=False, qk_norm=True,
                     dropout=float(c.attention_dropout or 0.0),
                     settings=window_spec_kwargs(c.sliding_window, c.layer_types))


def _qwen3_config(spec: ModelSpec) -> Any:
    Qwen3Config = transformers_module().Qwen3Config
    return Qwen3Config(**_rope_config_kwargs(spec), **window_config_kwargs(spec), hidden_act="silu",
                       attention_bias=False, use_sliding_window=settings_of(spec)[0] is not None,
                       max_window_layers=0, initializer_range=spec.init_std)


FAMILIES.add("qwen3", Family(
    "qwen3", "Qwen3ForCausalLM",
    dict(norm="rmsnorm", norm_pos="pre", act="swiglu", pos="rope", bias=False, qk_norm=True,
         emb_scale=False, parallel_block=False, attn_softcap=None, logit_softcap=None, **NOT_IN_HF),
    _qwen3_spec, _qwen3_config, ROPE, windows=Windows.PATTERN))


# ---- MoE: Qwen3-MoE (QK-norm, norm_topk_prob, mlp_only_layers) and Mixtral ------------------------
# Their router is a softmax over the experts' logits with no bias, its top-k gates renormalized
# (Mixtral always; Qwen3-MoE when norm_topk_prob), the experts SwiGLU banks; neither has a shared
# expert, a choice bias or a router z-loss. OLMoE norms q and k over the whole projection (no
# ablate option does): refused by name. DeepSeek's (sigmoid, choice bias, shared) is deepseek_v3.
MOE_COMPONENTS = {**DENSE_COMPONENTS, "ffn": ("moe",)}


def _moe_rules(mixtral: bool) -> tuple:
    """What ffn=moe's settings must be: the softmax router without a choice bias or shared
    experts (neither family has a place for them), and Mixtral's limits (it always renormalizes
    the top-k gates, and every layer routes)."""
    def fits(s) -> bool:
        m = MoESettings.of(s.ffn)
        return (m.router == "softmax" and m.balance != "bias" and m.shared == 0
                and (not mixtral or (m.renorm and m.dense_first == 0)))

    need = ("ffn.router=softmax, ffn.balance other than bias (no choice bias), ffn.shared=0"
            + (", ffn.renorm=true (Mixtral always renormalizes the top-k gates) and "
               "ffn.dense_first=0 (every Mixtral layer routes)" if mixtral else ""))
    return (("ffn", need, fits),)


def _moe_spec_settings(c: Any, experts: int, d_expert: int, renorm: bool, dense_first: int) -> dict:
    """ffn=moe's settings of an imported model: its routing; HF's balancing loss is k times ours
    (its coefficient becomes ours times k), and it has no router z-loss."""
    if c.router_aux_loss_coef < 0:
        raise ConfigError(f"HF router_aux_loss_coef={c.router_aux_loss_coef} is negative")
    return {"ffn": dict(experts=experts, top_k=c.num_experts_per_tok, d_expert=d_expert, renorm=renorm,
                        aux_coef=float(c.router_aux_loss_coef) * c.num_experts_per_tok, z_coef=0.0,
                        dense_first=dense_first)}


def _qwen3_moe_spec(c: Any) -> ModelSpec:
    if c.hidden_act != "silu" or c.attention_bias or c.use_sliding_window:
        raise ConfigError("HF Qwen3-MoE with attention_bias, a sliding window or hidden_act != silu is not supported")
    dense = sorted(c.mlp_only_layers or [])
    if c.decoder_sparse_step != 1 or dense != list(range(len(dense))):
        raise ConfigError(f"HF Qwen3-MoE with decoder_sparse_step={c.decoder_sparse_step}, mlp_only_layers={dense} "
                          "is not supported: ablate's dense layers are the first ffn.dense_first ones")
    return ModelSpec(**_rope_spec_kwargs(c), norm_pos="pre", act="swiglu", bias=False, qk_norm=True,
                     dropout=float(c.attention_dropout or 0.0), ffn="moe",
                     settings=_moe_spec_settings(c, c.num_experts, c.moe_intermediate_size, bool(c.norm_topk_prob),
                                                 len(dense)))


def _qwen3_moe_config(spec: ModelSpec) -> Any:
    s = MoESettings.of(spec.ffn)
    return transformers_module().Qwen3MoeConfig(
        **_rope_config_kwargs(spec), hidden_act="silu", attention_bias=False, use_sliding_window=False,
        initializer_range=spec.init_std, decoder_sparse_step=1, moe_intermediate_size=expert_width(spec, s),
        num_experts=s.experts, num_experts_per_tok=s.top_k, norm_topk_prob=s.renorm,
        router_aux_loss_coef=s.aux_coef / s.top_k, mlp_only_layers=list(range(s.dense_first)))


FAMILIES.add("qwen3_moe", Family(
    "qwen3_moe", "Qwen3MoeForCausalLM",
    dict(norm="rmsnorm", norm_pos="pre", act="swiglu", pos="rope", bias=False, qk_norm=True,
         emb_scale=False, parallel_block=False, attn_softcap=None, logit_softcap=None, **NOT_IN_HF),
    _qwen3_moe_spec, _qwen3_moe_config, ROPE, components=MOE_COMPONENTS, settings_held=("ffn",),
    rules=_moe_rules(mixtral=False)))


def _mixtral_spec(c: Any) -> ModelSpec:
    if c.hidden_act != "silu" or c.sliding_window is not None or c.router_jitter_noise:
        raise ConfigError("HF Mixtral with a sliding window, router jitter noise or hidden_act != silu "
                          "is not supported")
    # d_ff: the dense FFN a Mixtral does not have; its experts' width, so the fair rule finds them
    kw = _rope_spec_kwargs(c)
    return ModelSpec(**kw, norm_pos="pre", act="swiglu", bias=False, dropout=float(c.attention_dropout or 0.0),
                     ffn="moe", settings=_moe_spec_settings(c, c.num_local_experts, c.intermediate_size, True, 0))


def _mixtral_config(spec: ModelSpec) -> Any:
    s = MoESettings.of(spec.ffn)
    kw = {**_rope_config_kwargs(spec), "intermediate_size": expert_width(spec, s)}
    return transformers_module().MixtralConfig(
        **kw, hidden_act="silu", initializer_range=spec.init_std, sliding_window=None,
        num_local_experts=s.experts, num_experts_per_tok=s.top_k, router_aux_loss_coef=s.aux_coef / s.top_k,
        router_jitter_noise=0.0)


FAMILIES.add("mixtral", Family(
    "mixtral", "MixtralForCausalLM",
    dict(norm="rmsnorm", norm_pos="pre", act="swiglu", pos="rope", bias=False, qk_norm=False,
         emb_scale=False, parallel_block=False, attn_softcap=None, logit_softcap=None, **NOT_IN_HF),
    _mixtral_spec, _mixtral_config, ROPE, components=MOE_COMPONENTS, settings_held=("ffn",),
    rules=_moe_rules(mixtral=True)))


# ---- Gemma 2 (sandwich norm, GeGLU, embedding scale, soft-caps) ---------------------------------
def _gemma2_spec(c: Any) -> ModelSpec:
    if c.hidden_activation not in GELU_TANH or c.attention_bias:
        raise ConfigError("HF Gemma2 with attention_bias or a non-tanh GELU is not supported")
    _check_head_dim(c)
    head_dim = c.hidden_size // c.num_attention_heads
    if c.query_pre_attn_scalar != head_dim:
        raise ConfigError(f"HF Gemma2 query_pre_attn_scalar={c.query_pre_attn_scalar} != head_dim "
                          f"{head_dim}: ablate scales attention by 1/sqrt(head_dim)")
    return ModelSpec(**_rope_spec_kwargs(c), norm_pos="sandwich", act="geglu", bias=False, emb_scale=True,
                     attn_softcap=c.attn_logit_softcapping, logit_softcap=c.final_logit_softcapping,
                     dropout=float(c.attention_dropout or 0.0),
                     settings=window_spec_kwargs(c.sliding_window, c.layer_types))


def _gemma2_config(spec: ModelSpec) -> Any:
    Gemma2Config = transformers_module().Gemma2Config
    return Gemma2Config(**_rope_config_kwargs(spec), **window_config_kwargs(spec),
                        hidden_activation="gelu_pytorch_tanh", attention_bias=False, query_pre_attn_scalar=spec.head_dim,
                        attn_logit_softcapping=spec.attn_softcap, final_logit_softcapping=spec.logit_softcap,
                        initializer_range=spec.init_std)


FAMILIES.add("gemma2", Family(
    "gemma2", "Gemma2ForCausalLM",
    dict(norm="rmsnorm", norm_pos="sandwich", act="geglu", pos="rope", bias=False, tied=True,
         qk_norm=False, emb_scale=True, parallel_block=False, **NOT_IN_HF),
    _gemma2_spec, _gemma2_config, ROPE, gain_offset=1.0, windows=Windows.PATTERN))


# ---- Gemma 3 (Gemma 2's block with QK-norm; local and global RoPE bases) ------------------------
def _gemma3_spec(c: Any) -> ModelSpec:
    if c.hidden_activation not in GELU_TANH or c.attention_bias or c.use_bidirectional_attention:
        raise ConfigError("HF Gemma3 with attention_bias, bidirectional attention or a non-tanh GELU "
                          "is not supported")
    _check_head_dim(c)
    head_dim = c.hidden_size // c.num_attention_heads
    if c.query_pre_attn_scalar != head_dim:
        raise ConfigError(f"HF Gemma3 query_pre_attn_scalar={c.query_pre_attn_scalar} != head_dim "
                          f"{head_dim}: ablate scales attention by 1/sqrt(head_dim)")
    settings = window_spec_kwargs(c.sliding_window, c.layer_types)
    full, local = (_rope_theta(_one_rope(c, t)) for t in (FULL, SLIDING))
    if settings and settings["attn"]["global_every"] is None:  # every layer slides: its base is the one
        kw = _rope_spec_kwargs(_one_rope(c, SLIDING))
    else:
        kw = _rope_spec_kwargs(_one_rope(c, FULL))
        if settings and local != full:
            settings["attn"]["local_rope_base"] = local
    # attn_logit_softcapping: Gemma3Attention stores it and never applies it (transformers 5.24)
    return ModelSpec(**kw, norm_pos="sandwich", act="geglu", bias=False, emb_scale=True, qk_norm=True,
                     logit_softcap=c.final_logit_softcapping, dropout=float(c.attention_dropout or 0.0),
                     settings=settings)


class _one_rope:
    """A Gemma 3 config seen with one layer type's RoPE parameters (for _rope_spec_kwargs)."""

    def __init__(self, c: Any, layer_type: str):
        self._c, self.rope_parameters = c, c.rope_parameters[layer_type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._c, name)


def _gemma3_config(spec: ModelSpec) -> Any:
    Gemma3TextConfig = transformers_module().Gemma3TextConfig
    kw = _rope_config_kwargs(spec)
    rope = kw.pop("rope_parameters")
    local = settings_of(spec)[2]
    return Gemma3TextConfig(**kw, **window_config_kwargs(spec), hidden_activation="gelu_pytorch_tanh",
                            attention_bias=False, query_pre_attn_scalar=spec.head_dim,
                            rope_parameters={FULL: dict(rope), SLIDING: dict(rope, rope_theta=local or spec.rope_base)},
                            final_logit_softcapping=spec.logit_softcap, initializer_range=spec.init_std)


FAMILIES.add("gemma3_text", Family(
    "gemma3_text", "Gemma3ForCausalLM",  # no attention soft-cap: HF's Gemma 3 would drop it
    dict(norm="rmsnorm", norm_pos="sandwich", act="geglu", pos="rope", bias=False, tied=True,
         qk_norm=True, emb_scale=True, parallel_block=False, attn_softcap=None, **NOT_IN_HF),
    _gemma3_spec, _gemma3_config, ROPE, gain_offset=1.0, windows=Windows.TWO_BASES))


# ---- Mistral and Ministral (the llama block with a window) ------------------------------------
def _mistral_spec(c: Any) -> ModelSpec:
    if c.hidden_act != "silu":
        raise ConfigError(f"HF Mistral with hidden_act={c.hidden_act!r} is not supported (silu)")
    # MistralForCausalLM applies one window to every layer, whatever layer_types it stores
    return ModelSpec(**_rope_spec_kwargs(c), norm_pos="pre", act="swiglu", bias=False,
                     dropout=float(c.attention_dropout or 0.0), settings=window_spec_kwargs(c.sliding_window, None))


def _mistral_config(spec: ModelSpec) -> Any:
    MistralConfig = transformers_module().MistralConfig
    return MistralConfig(**_rope_config_kwargs(spec), hidden_act="silu", sliding_window=settings_of(spec)[0],
                         initializer_range=spec.init_std)


def _ministral_spec(c: Any) -> ModelSpec:
    if c.hidden_act != "silu":
        raise ConfigError(f"HF Ministral with hidden_act={c.hidden_act!r} is not supported (silu)")
    return ModelSpec(**_rope_spec_kwargs(c), norm_pos="pre", act="swiglu", bias=False,
                     dropout=float(c.attention_dropout or 0.0),
                     settings=window_spec_kwargs(c.sliding_window, c.layer_types))


def _ministral_config(spec: ModelSpec) -> Any:
    MinistralConfig = transformers_module().MinistralConfig
    return MinistralConfig(**_rope_config_kwargs(spec), **window_config_kwargs(spec), hidden_act="silu",
                           initializer_range=spec.init_std)


LLAMA_BLOCK = dict(norm="rmsnorm", norm_pos="pre", act="swiglu", pos="rope", bias=False, qk_norm=False,
                   emb_scale=False, parallel_block=False, attn_softcap=None, logit_softcap=None, **NOT_IN_HF)
FAMILIES.add("mistral", Family("mistral", "MistralForCausalLM", LLAMA_BLOCK, _mistral_spec, _mistral_config,
                               ROPE, windows=Windows.UNIFORM))
FAMILIES.add("ministral", Family("ministral", "MinistralForCausalLM", LLAMA_BLOCK, _ministral_spec,
                                 _ministral_config, ROPE, windows=Windows.PATTERN))


# ---- DeepSeek-V3 (attn=mla; dense MLPs, or ffn=moe with its sigmoid router) ------------------------
# Its MoE layers: sigmoid scores, the choice made on scores + e_score_correction_bias (our choice
# bias) within the best topk_group of n_group expert groups, the gates the unbiased scores
# (renormalized with norm_topk_prob) times routed_scaling_factor, plus n_shared_experts shared
# experts as one MLP. Ours is the case n_group = topk_group = 1, routed_scaling_factor = 1.
def _deepseek_v3_moe_settings(c: Any) -> dict:
    why = ("n_group={c.n_group}, topk_group={c.topk_group} (ablate routes over all experts: 1 and 1)"
           if (c.n_group or 1) != 1 or (c.topk_group or 1) != 1 else
           "routed_scaling_factor={c.routed_scaling_factor} (ablate's gates are unscaled: 1.0)"
           if c.routed_scaling_factor != 1.0 else
           "n_shared_experts={c.n_shared_experts} (ablate exports and imports 1 or more)"
           if not c.n_shared_experts else "")
    if why:
        raise ConfigError("HF DeepseekV3 with " + why.format(c=c) + " is not supported")
    return dict(experts=c.n_routed_experts, top_k=c.num_experts_per_tok, d_expert=c.moe_intermediate_size,
                renorm=bool(c.norm_topk_prob), router="sigmoid", shared=c.n_shared_experts, balance="bias",
                z_coef=0.0, dense_first=c.first_k_dense_replace or 0)


def _deepseek_v3_spec(c: Any) -> ModelSpec:
    hd = c.hidden_size // c.num_attention_heads
    moe = c.first_k_dense_replace is None or c.first_k_dense_replace < c.num_hidden_layers
    why = (f"hidden_act={c.hidden_act!r}" if c.hidden_act != "silu" else
           "attention_bias (DeepseekV3's MLPs have none)" if c.attention_bias else
           "rope_interleave=True (ablate's RoPE is the half-split layout)" if c.rope_interleave else
           f"num_key_value_heads={c.num_key_value_heads} != num_attention_heads" if
           c.num_key_value_heads not in (None, c.num_attention_heads) else
           f"qk_nope_head_dim={c.qk_nope_head_dim} / v_head_dim={c.v_head_dim} != hidden_size / heads = {hd}"
           if not c.qk_nope_head_dim == c.v_head_dim == hd else "")
    if why:
        raise ConfigError(f"HF DeepseekV3 with {why} is not supported")
    kw = _rope_spec_kwargs(c, head_dim=hd)  # its config's head_dim is the rope dim
    ffn = {"ffn": "moe"} if moe else {}
    return ModelSpec(**kw, norm_pos="pre", act="swiglu", bias=False, attn="mla", **ffn,
                     settings={"attn": {"kv_rank": c.kv_lora_rank, "q_rank": c.q_lora_rank,
                                        "rope_dim": c.qk_rope_head_dim},
                               **({"ffn": _deepseek_v3_moe_settings(c)} if moe else {})},
                     dropout=float(c.attention_dropout or 0.0))


def _deepseek_v3_config(spec: ModelSpec) -> Any:
    s = LatentShape.for_spec(spec)
    kw = _rope_config_kwargs(spec)
    kw.pop("head_dim")  # DeepseekV3 sets head_dim to qk_rope_head_dim itself
    if spec.ffn == "moe":  # its defaults (scaling 2.5, 8 groups, 4 chosen) would be another model
        m = MoESettings.of(spec.ffn)
        ffn = dict(first_k_dense_replace=m.dense_first, n_routed_experts=m.experts, num_experts_per_tok=m.top_k,
                   moe_intermediate_size=expert_width(spec, m), n_shared_experts=m.shared, norm_topk_prob=m.renorm,
                   routed_scaling_factor=1.0, n_group=1, topk_group=1)
    else:
        ffn = dict(first_k_dense_replace=spec.n_layers)  # every layer's MLP dense
    return transformers_module().DeepseekV3Config(
        **kw, hidden_act="silu", attention_bias=False, initializer_range=spec.init_std,
        kv_lora_rank=s.kv_rank, q_lora_rank=s.q_rank, qk_rope_head_dim=s.rope_dim,
        qk_nope_head_dim=s.head_dim, v_head_dim=s.head_dim, rope_interleave=False, **ffn)


def _deepseek_v3_moe_fits(spec: ModelSpec) -> bool:
    if spec.ffn != "moe":
        return True
    m = MoESettings.of(spec.ffn)
    return m.router == "sigmoid" and m.shared >= 1 and m.experts >= 2


FAMILIES.add("deepseek_v3", Family(
    "deepseek_v3", "DeepseekV3ForCausalLM",
    # bias: DeepseekV3's MLPs have none (its attention_bias covers q_a, kv_a and o_proj only)
    dict(norm="rmsnorm", norm_pos="pre", act="swiglu", pos="rope", bias=False, qk_norm=False, emb_scale=False,
         parallel_block=False, attn_softcap=None, logit_softcap=None, **NOT_IN_HF),
    _deepseek_v3_spec, _deepseek_v3_config, DEEPSEEK_V3,
    rules=(("ffn", "ffn.router=sigmoid, ffn.shared >= 1 and ffn.experts >= 2 (DeepseekV3's MoE: sigmoid scores, "
            "shared experts, a top-2 group score)", _deepseek_v3_moe_fits),),
    # its config holds MLA's ranks and the MoE's routing
    components={"attn": ("mla",), "ffn": ("dense", "moe")}, settings_held=("attn", "ffn")))


# HF families asked for by name that no ablate model maps to, and why.
UNMAPPED = {
    "olmoe": "OLMoE norms q and k over the whole projection width, always (ablate's qk_norm=on norms each "
             "head, as Qwen3-MoE does: export an MoE with qk_norm=on as qwen3_moe)",
}


def family_for(spec: ModelSpec, name: Optional[str] = None) -> Family:
    """The named family, or the first whose architecture matches the spec."""
    if name is not None and name in UNMAPPED and name not in FAMILIES:
        raise ConfigError(f"cannot export as HF {name}: {UNMAPPED[name]}")
    if name is not None:
        fam = FAMILIES.get(name)
        bad = fam.mismatches(spec)
        if bad:
            raise ConfigError(f"cannot export as HF {name}: {', '.join(bad)}")
        return fam
    blocking = {n: FAMILIES.get(n).blocking(spec) for n in FAMILIES}
    for n, fields in blocking.items():
        if not fields:
            return FAMILIES.get(n)
    raise ConfigError(f"no Hugging Face family matches this architecture: {_what_blocks(spec, blocking)}")


def _what_blocks(spec: ModelSpec, blocking: dict[str, dict[str, str]]) -> str:
    """The keys that keep the model out of every family: those no family has, else what the
    closest family (fewest keys apart) needs changed."""
    first = next(iter(blocking.values()))
    everywhere = [k for k in first if all(k in b for b in blocking.values())]
    if everywhere:  # each entry is `key=value (needs ...)`
        return "no family has " + ", ".join(first[k].split(" (")[0] for k in everywhere)
    # with a window, among the closest the one holding the most of it (else llama would say it has none)
    windowed = Windows.needed(spec) > Windows.NONE
    closest = min(blocking, key=lambda n: (len(blocking[n]), -FAMILIES.get(n).windows if windowed else 0))
    return f"the closest, {closest}, differs in {', '.join(blocking[closest].values())}"
