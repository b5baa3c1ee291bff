"""Import and export Hugging Face `transformers` checkpoints, so ablated models can be evaluated
with HF tooling and HF models can be loaded into the ablation trainer.

    to_hf(model)          -> (hf_config, state_dict)   our Transformer as an HF family
    to_hf_model(model)    -> an HF *ForCausalLM with our weights
    from_hf(hf_model)     -> Transformer                ModelSpec derived from the HF config
    export(run_dir, out_dir)                            a run's checkpoint -> save_pretrained folder,
                                                        special tokens and tokenizer files of the
                                                        run's tokenizer, a generation smoke test
                                                        (`ablate export RUN_DIR OUT_DIR`)

Families (keyed by the HF config's `model_type`): `gpt2` (GPT2LMHeadModel: arch=gpt2, MHA only),
`llama` (LlamaForCausalLM: arch=llama, any n_kv_heads), `qwen3` (Qwen3ForCausalLM: arch=llama
qk_norm=on) and `gemma2` (Gemma2ForCausalLM: rmsnorm, sandwich norm, geglu, rope, tied,
emb_scale, soft-caps). A spec field a family cannot represent (model.act_clamp, MTP heads: none
can) blocks that family, so an export is exact or refused. Needs transformers >= 5.
Layout differences handled here:
  - GPT-2 stores linear weights as Conv1D, (in, out): transposed on the way.
  - Our attention has one fused `qkv` Linear with rows [q; k; v] (GPT-2's c_attn has the same
    order); Llama-style models have q_proj, k_proj, v_proj.
  - Our gated FFN has one fused `gate_up` Linear with rows [gate; up].
  - Gemma's RMSNorm multiplies by (1 + w): its stored gain is ours minus 1.
  - RoPE: both sides use the half-split (rotate_half) layout, so q/k rows need no permutation.
Our `gelu` is the tanh approximation, HF's "gelu_new" / "gelu_pytorch_tanh". Dropout is a
training-time setting: Llama-style configs only have attention dropout, so a model trained with
dropout=on exports exactly for inference, and an imported one gets dropout.rate everywhere.
torch and transformers are imported inside the functions (the CLI stays fast).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ablate.errors import AblateError, CheckpointError, ConfigError
from ablate.model.spec import ModelSpec
from ablate.registry import Registry

GELU_TANH = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")


@dataclass(frozen=True)
class TensorMap:
    """One of our tensors <-> one or more HF tensors (concatenated along dim 0 on our side)."""

    ours: str
    theirs: tuple[str, ...]
    sizes: Optional[tuple[int, ...]] = None  # row counts of the parts when theirs has several
    transpose: bool = False  # HF Conv1D: (in, out)
    offset: float = 0.0  # HF value = ours - offset (Gemma's 1 + w gains)


@dataclass(frozen=True)
class Family:
    model_type: str
    model_class: str  # transformers class name of the causal LM
    required: dict  # spec field -> value the family needs (checked on export)
    spec_from_config: Callable[[Any], ModelSpec]
    config_from_spec: Callable[[ModelSpec], Any]
    tensor_maps: Callable[[ModelSpec], list[TensorMap]]
    # (field, what it needs, test) for needs that are not one fixed value
    rules: tuple[tuple[str, str, Callable[[ModelSpec], bool]], ...] = ()

    def mismatches(self, spec: ModelSpec) -> list[str]:
        return [f"{k}={getattr(spec, k)!r} (needs {v!r})" for k, v in self.required.items()
                if getattr(spec, k) != v] + \
               [f"{k}={getattr(spec, k)!r} (needs {need})" for k, need, ok in self.rules if not ok(spec)]

    def describe(self) -> str:
        return ", ".join([f"{k}={v}" for k, v in self.required.items()] + [need for _, need, _ in self.rules])


# What every family lacks: none has the gated FFN's activation clamp or multi-token heads.
NOT_IN_HF = dict(act_clamp=None, mtp_heads=0)
MIN_TRANSFORMERS = 5  # RoPE's base goes in `rope_parameters`, new in transformers v5


def _transformers():
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
def _block_norm_names(spec: ModelSpec) -> list[str]:
    return {"pre": ["norm1", "norm2"], "sandwich": ["pre_attn_norm", "post_attn_norm",
                                                    "pre_ffn_norm", "post_ffn_norm"]}[spec.norm_pos]


def _rope_theta(c: Any) -> float:
    params = getattr(c, "rope_parameters", None) or {}
    if params.get("rope_type", "default") != "default":
        raise ConfigError(f"HF rope_type={params['rope_type']!r} is not supported (only 'default' RoPE)")
    return float(params.get("rope_theta", getattr(c, "rope_theta", 10000.0)))


def _check_head_dim(c: Any) -> None:
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    if head_dim * c.num_attention_heads != c.hidden_size:
        raise ConfigError(
            f"HF model has head_dim={head_dim} with {c.num_attention_heads} heads != hidden_size="
            f"{c.hidden_size}; ablate's head dim is d_model / n_heads")


def _rope_family_maps(spec: ModelSpec, offset: float = 0.0) -> list[TensorMap]:
    """Llama / Qwen 3 / Gemma 2 naming: model.layers.{i}.self_attn.q_proj ..."""
    hd = spec.head_dim
    qkv = (spec.n_heads * hd, spec.n_kv_heads * hd, spec.n_kv_heads * hd)
    hf_norms = {"pre": ["input_layernorm", "post_attention_layernorm"],
                "sandwich": ["input_layernorm", "post_attention_layernorm",
                             "pre_feedforward_layernorm", "post_feedforward_layernorm"]}[spec.norm_pos]
    maps = [TensorMap("tok_emb.weight", ("model.embed_tokens.weight",)),
            TensorMap("final_norm.weight", ("model.norm.weight",), offset=offset)]
    if not spec.tied:
        maps.append(TensorMap("lm_head.weight", ("lm_head.weight",)))
    suffixes = ["weight"] + (["bias"] if spec.bias else [])
    for i in range(spec.n_layers):
        o, t = f"blocks.{i}.", f"model.layers.{i}."
        for s in suffixes:
            maps += [TensorMap(o + f"attn.qkv.{s}", tuple(t + f"self_attn.{p}_proj.{s}" for p in "qkv"), qkv),
                     TensorMap(o + f"attn.proj.{s}", (t + f"self_attn.o_proj.{s}",)),
                     TensorMap(o + f"ffn.gate_up.{s}", (t + f"mlp.gate_proj.{s}", t + f"mlp.up_proj.{s}"),
                               (spec.d_ff, spec.d_ff)),
                     TensorMap(o + f"ffn.down.{s}", (t + f"mlp.down_proj.{s}",))]
        for ours, theirs in zip(_block_norm_names(spec), hf_norms):
            maps.append(TensorMap(o + f"{ours}.weight", (t + f"{theirs}.weight",), offset=offset))
        if spec.qk_norm:
            maps += [TensorMap(o + "attn.q_norm.weight", (t + "self_attn.q_norm.weight",), offset=offset),
                     TensorMap(o + "attn.k_norm.weight", (t + "self_attn.k_norm.weight",), offset=offset)]
    return maps


def _rope_config_kwargs(spec: ModelSpec) -> dict:
    return dict(vocab_size=spec.vocab_size, hidden_size=spec.d_model, intermediate_size=spec.d_ff,
                num_hidden_layers=spec.n_layers, num_attention_heads=spec.n_heads,
                num_key_value_heads=spec.n_kv_heads, head_dim=spec.head_dim,
                max_position_embeddings=spec.max_seq_len, rms_norm_eps=spec.norm_eps,
                tie_word_embeddings=spec.tied, attention_dropout=spec.attn_dropout_rate,
                rope_parameters={"rope_type": "default", "rope_theta": spec.rope_base})


def _rope_spec_kwargs(c: Any) -> dict:
    _check_head_dim(c)
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
    GPT2Config = _transformers().GPT2Config
    return GPT2Config(vocab_size=spec.vocab_size, n_positions=spec.max_seq_len, n_embd=spec.d_model,
                      n_layer=spec.n_layers, n_head=spec.n_heads, n_inner=spec.d_ff,
                      activation_function="gelu_new", resid_pdrop=spec.dropout, embd_pdrop=spec.dropout,
                      attn_pdrop=spec.attn_dropout_rate, layer_norm_epsilon=spec.norm_eps,
                      initializer_range=spec.init_std, tie_word_embeddings=spec.tied,
                      # GPT-2's end-of-text id, where the vocab has it
                      bos_token_id=50256 if spec.vocab_size > 50256 else None,
                      eos_token_id=50256 if spec.vocab_size > 50256 else None)


def _gpt2_maps(spec: ModelSpec) -> list[TensorMap]:
    maps = [TensorMap("tok_emb.weight", ("transformer.wte.weight",)),
            TensorMap("pos.emb.weight", ("transformer.wpe.weight",)),
            TensorMap("final_norm.weight", ("transformer.ln_f.weight",)),
            TensorMap("final_norm.bias", ("transformer.ln_f.bias",))]
    if not spec.tied:
        maps.append(TensorMap("lm_head.weight", ("lm_head.weight",)))
    for i in range(spec.n_layers):
        o, t = f"blocks.{i}.", f"transformer.h.{i}."
        for ours, theirs in (("norm1", "ln_1"), ("norm2", "ln_2")):
            for s in ("weight", "bias"):
                maps.append(TensorMap(o + f"{ours}.{s}", (t + f"{theirs}.{s}",)))
        for ours, theirs in (("attn.qkv", "attn.c_attn"), ("attn.proj", "attn.c_proj"),
                             ("ffn.up", "mlp.c_fc"), ("ffn.down", "mlp.c_proj")):
            maps.append(TensorMap(o + f"{ours}.weight", (t + f"{theirs}.weight",), transpose=True))
            maps.append(TensorMap(o + f"{ours}.bias", (t + f"{theirs}.bias",)))
    return maps


FAMILIES.add("gpt2", Family(
    "gpt2", "GPT2LMHeadModel",
    dict(norm="layernorm", norm_pos="pre", act="gelu", pos="learned", bias=True, qk_norm=False,
         emb_scale=False, parallel_block=False, attn_softcap=None, logit_softcap=None, **NOT_IN_HF),
    _gpt2_spec, _gpt2_config, _gpt2_maps,
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
    LlamaConfig = _transformers().LlamaConfig
    return LlamaConfig(**_rope_config_kwargs(spec), hidden_act="silu", attention_bias=spec.bias,
                       mlp_bias=spec.bias, initializer_range=spec.init_std)


FAMILIES.add("llama", Family(
    "llama", "LlamaForCausalLM",
    dict(norm="rmsnorm", norm_pos="pre", act="swiglu", pos="rope", qk_norm=False, emb_scale=False,
         parallel_block=False, attn_softcap=None, logit_softcap=None, **NOT_IN_HF),
    _llama_spec, _llama_config, _rope_family_maps))


# ---- Qwen 3 (QK-norm) --------------------------------------------------------------------------
def _qwen3_spec(c: Any) -> ModelSpec:
    if c.hidden_act != "silu" or c.attention_bias or c.use_sliding_window:
        raise ConfigError("HF Qwen3 with attention_bias, a sliding window or hidden_act != silu "
                          "is not supported")
    return ModelSpec(**_rope_spec_kwargs(c), norm_pos="pre", act="swiglu", bias=False, qk_norm=True,
                     dropout=float(c.attention_dropout or 0.0))


def _qwen3_config(spec: ModelSpec) -> Any:
    Qwen3Config = _transformers().Qwen3Config
    return Qwen3Config(**_rope_config_kwargs(spec), hidden_act="silu", attention_bias=False,
                       use_sliding_window=False, initializer_range=spec.init_std)


FAMILIES.add("qwen3", Family(
    "qwen3", "Qwen3ForCausalLM",
    dict(norm="rmsnorm", norm_pos="pre", act="swiglu", pos="rope", bias=False, qk_norm=True,
         emb_scale=False, parallel_block=False, attn_softcap=None, logit_softcap=None, **NOT_IN_HF),
    _qwen3_spec, _qwen3_config, _rope_family_maps))


# ---- Gemma 2 (sandwich norm, GeGLU, embedding scale, soft-caps) ---------------------------------
def _gemma2_spec(c: Any) -> ModelSpec:
    if c.hidden_activation not in GELU_TANH or c.attention_bias:
        raise ConfigError("HF Gemma2 with attention_bias or a non-tanh GELU is not supported")
    _check_head_dim(c)
    head_dim = c.hidden_size // c.num_attention_heads
    if c.query_pre_attn_scalar != head_dim:
        raise ConfigError(f"HF Gemma2 query_pre_attn_scalar={c.query_pre_attn_scalar} != head_dim "
                          f"{head_dim}: ablate scales attention by 1/sqrt(head_dim)")
    kw = _rope_spec_kwargs(c)
    # Sliding-window layers equal full attention on sequences no longer than the window.
    if c.sliding_window is not None:
        kw["max_seq_len"] = min(kw["max_seq_len"], c.sliding_window)
    return ModelSpec(**kw, norm_pos="sandwich", act="geglu", bias=False, emb_scale=True,
                     attn_softcap=c.attn_logit_softcapping, logit_softcap=c.final_logit_softcapping,
                     dropout=float(c.attention_dropout or 0.0))


def _gemma2_config(spec: ModelSpec) -> Any:
    Gemma2Config = _transformers().Gemma2Config
    return Gemma2Config(**_rope_config_kwargs(spec), hidden_activation="gelu_pytorch_tanh",
                        attention_bias=False, query_pre_attn_scalar=spec.head_dim,
                        sliding_window=spec.max_seq_len, attn_logit_softcapping=spec.attn_softcap,
                        final_logit_softcapping=spec.logit_softcap, initializer_range=spec.init_std)


FAMILIES.add("gemma2", Family(
    "gemma2", "Gemma2ForCausalLM",
    dict(norm="rmsnorm", norm_pos="sandwich", act="geglu", pos="rope", bias=False, tied=True,
         qk_norm=False, emb_scale=True, parallel_block=False, **NOT_IN_HF),
    _gemma2_spec, _gemma2_config, lambda spec: _rope_family_maps(spec, offset=1.0)))


# ---- conversion --------------------------------------------------------------------------------
def family_for(spec: ModelSpec, name: Optional[str] = None) -> Family:
    """The named family, or the first whose architecture matches the spec."""
    if name is not None:
        fam = FAMILIES.get(name)
        bad = fam.mismatches(spec)
        if bad:
            raise ConfigError(f"cannot export as HF {name}: {', '.join(bad)}")
        return fam
    for n in FAMILIES:
        if not FAMILIES.get(n).mismatches(spec):
            return FAMILIES.get(n)
    raise ConfigError("no Hugging Face family matches this architecture; supported: "
                      + "; ".join(f"{n} ({FAMILIES.get(n).describe()})" for n in FAMILIES))


def to_hf(model, family: Optional[str] = None):
    """Our Transformer -> (HF config, HF state dict). The vocab keeps our (padded) size."""
    spec: ModelSpec = model.spec
    fam = family_for(spec, family)
    ours = model.state_dict()
    out = {}
    for m in fam.tensor_maps(spec):
        t = ours[m.ours].detach() - m.offset
        parts = t.split(list(m.sizes), dim=0) if m.sizes else (t,)
        for key, p in zip(m.theirs, parts):
            out[key] = (p.t() if m.transpose and p.ndim == 2 else p).contiguous().clone()
    if spec.tied:  # HF keeps the (shared) head in its state dict too; maps[0] is the embedding
        out["lm_head.weight"] = out[fam.tensor_maps(spec)[0].theirs[0]]
    return fam.config_from_spec(spec), out


def to_hf_model(model, family: Optional[str] = None):
    """Our Transformer -> an HF *ForCausalLM (eval mode) carrying the same weights."""
    transformers = _transformers()
    config, state = to_hf(model, family)
    config._attn_implementation = "eager"
    hf = getattr(transformers, FAMILIES.get(config.model_type).model_class)(config)
    _load_strict(hf, state)
    return hf.eval()


def _load_strict(module, state: dict) -> None:
    missing, unexpected = module.load_state_dict(state, strict=False)
    # Non-persistent buffers (rotary tables, GPT-2's causal mask) are rebuilt by the module.
    missing = [k for k in missing if not k.endswith((".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq"))]
    if missing or unexpected:
        raise ConfigError(f"state dict mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")


def spec_from_hf_config(config: Any) -> ModelSpec:
    return FAMILIES.get(config.model_type).spec_from_config(config)


def from_hf(hf_model, **spec_changes):
    """An HF causal LM (one of FAMILIES) -> our Transformer with its weights, in eval mode.

    `spec_changes` override ModelSpec fields that do not change the weights' shapes or meaning
    (e.g. dropout=0.1 to fine-tune with dropout)."""
    import torch

    from ablate.model.transformer import Transformer

    spec = spec_from_hf_config(hf_model.config)
    if spec_changes:
        spec = dataclasses.replace(spec, **spec_changes)
    fam = FAMILIES.get(hf_model.config.model_type)
    theirs = hf_model.state_dict()
    state = {}
    for m in fam.tensor_maps(spec):
        parts = [theirs[k].detach() for k in m.theirs]
        parts = [p.t() if m.transpose and p.ndim == 2 else p for p in parts]
        state[m.ours] = torch.cat(parts, dim=0) + m.offset
    model = Transformer(spec)
    _load_strict(model, state)
    return model.eval()


# ---- run directories ---------------------------------------------------------------------------
def load_run_model(run_dir) -> Any:
    """The model of an ablate run directory: its config.yaml and newest usable checkpoint."""
    from omegaconf import OmegaConf

    from ablate.model.transformer import Transformer
    from ablate.plugins import load as load_plugins
    from ablate.train import checkpoint

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise CheckpointError(f"{run_dir}: no config.yaml (not an ablate run directory)")
    cfg = OmegaConf.load(run_dir / "config.yaml")
    load_plugins(cfg.get("plugins") or [])  # a plugin's option builds as it did in the run
    spec = ModelSpec.from_config(cfg)
    state = checkpoint.latest_valid(run_dir)
    if state is None:
        raise CheckpointError(f"{run_dir}: no checkpoint to export")
    model = Transformer(spec)
    model.load_state_dict(state["model"])
    return model.eval()


def run_tokenizer_name(run_dir) -> str:
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(Path(run_dir) / "config.yaml")
    return str(OmegaConf.select(cfg, "tokenizer.name", default="byte"))


# The end-of-text id of each tokenizer (ablate/data/tokenizers.py), for when its encoding files
# are not here: the exported bos/eos/pad ids are the tokenizer's, never Llama's 1/2.
EOT_IDS = {"byte": 256, "gpt2": 50256, "cl100k": 100257}
EOT_TEXT = "<|endoftext|>"


def eot_id(tokenizer_name: str) -> int:
    from ablate.data.tokenizers import build_tokenizer

    try:
        return int(build_tokenizer(tokenizer_name).eot_id)
    except AblateError:
        if tokenizer_name in EOT_IDS:
            return EOT_IDS[tokenizer_name]
        raise


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the ByteLevel alphabet of `tokenizers`)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _tokenizer_from_ranks(ranks: dict, pattern: Optional[str], specials: dict) -> Any:
    """A byte-level BPE `tokenizers` tokenizer equal to tiktoken's ranks: vocab = the ranks, merges
    = for each multi-byte token the splits into two tokens, ordered by rank (how transformers'
    TikTokenConverter converts them). `pattern`: the pre-tokenizing regex (None: whole text)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    table = _bytes_to_unicode()

    def text(b: bytes) -> str:
        return "".join(table[x] for x in b)

    vocab, merges = {}, []
    for token, rank in ranks.items():
        vocab[text(token)] = rank
        if len(token) == 1:
            continue
        local = [(token[:i], token[i:], rank) for i in range(1, len(token))
                 if token[:i] in ranks and token[i:] in ranks]
        local.sort(key=lambda m: (ranks[m[0]], ranks[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: m[2])
    vocab.update(specials)  # at tiktoken's ids (cl100k has holes below them): added tokens find them
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(text(a), text(b)) for a, b, _ in merges],
                               fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.pre_tokenizer = byte_level if pattern is None else pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False), byte_level])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, _ in sorted(specials.items(), key=lambda kv: kv[1])])
    assert all(tok.token_to_id(t) == i for t, i in specials.items())  # ids as tiktoken's
    return tok


def hf_tokenizer(tokenizer_name: str) -> tuple[Any, str]:
    """(a transformers PreTrainedTokenizerFast equal to the run's tokenizer, or None; a note)."""
    if tokenizer_name == "byte":  # 256 bytes, no merges, end-of-text 256: exactly byte-level BPE
        tok = _tokenizer_from_ranks({bytes([b]): b for b in range(256)}, None, {EOT_TEXT: 256})
    else:
        from ablate.data.tokenizers import TiktokenTokenizer, build_tokenizer

        ours = build_tokenizer(tokenizer_name)
        if not isinstance(ours, TiktokenTokenizer):
            return None, f"no Hugging Face tokenizer file: tokenizer={tokenizer_name} has no HF equivalent"
        try:
            enc = ours.enc
        except AblateError as e:
            return None, f"no Hugging Face tokenizer file written: {e}"
        # Oniguruma (tokenizers) reads `{1,3}+` as "one or more runs of 1-3", not possessive:
        # "2026" would be one piece; tiktoken's regex splits it "202" + "6".
        pattern = enc._pat_str.replace("{1,3}+", "{1,3}")
        tok = _tokenizer_from_ranks(enc._mergeable_ranks, pattern, enc._special_tokens)
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOT_TEXT, eos_token=EOT_TEXT,
                                   pad_token=EOT_TEXT)
    return fast, f"tokenizer: {tokenizer_name} as a byte-level BPE tokenizer.json (same ids as ablate's)"


def _greedy_ours(model, prompt: list, n: int) -> list:
    import torch

    idx = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(n):
            nxt = model(idx[:, -model.spec.max_seq_len:]).logits[:, -1].argmax(-1, keepdim=True)
            idx = torch.cat([idx, nxt], dim=1)
    return idx[0, len(prompt):].tolist()


def generation_check(model, out_dir, prompt: list, eos: int, n: int = 8) -> list:
    """Load the saved folder with AutoModelForCausalLM, generate `n` tokens greedily and compare
    them with our model's greedy tokens (HF stops at eos: ours are cut there too)."""
    import torch

    transformers = _transformers()
    hf = transformers.AutoModelForCausalLM.from_pretrained(out_dir).eval()
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    theirs = out[0, len(prompt):].tolist()
    ours = _greedy_ours(model, prompt, n)
    if eos in ours:
        ours = ours[:ours.index(eos) + 1]
    if theirs != ours:
        raise CheckpointError(f"generation smoke test failed: the exported model generates {theirs}, "
                              f"the run's model {ours} (greedy, from {prompt})")
    return theirs


@dataclass
class Export:
    path: Path
    notes: list  # one line each: special tokens, tokenizer, generation check


def export(run_dir, out_dir, family: Optional[str] = None, check: bool = True) -> Export:
    """A run's model as a Hugging Face folder: config.json + safetensors, special tokens from the
    run's tokenizer, its tokenizer files where HF represents it, and (check) a generation smoke
    test of the saved folder. Raises AblateError (nothing is left in out_dir then)."""
    import shutil

    model = load_run_model(run_dir)
    name = run_tokenizer_name(run_dir)
    eos = eot_id(name)
    _transformers().utils.logging.disable_progress_bar()  # our lines, not loading bars
    hf = to_hf_model(model, family)  # refuses an architecture no family represents
    for target in (hf.config, hf.generation_config):
        target.bos_token_id = target.eos_token_id = target.pad_token_id = eos
    tok, tok_note = hf_tokenizer(name)
    out = Path(out_dir)
    existed = out.exists()
    notes = [f"special tokens: bos = eos = pad = {eos} ({name}'s end-of-text)", tok_note]
    try:
        hf.save_pretrained(out)
        if tok is not None:
            tok.save_pretrained(out)
        if check:
            prompt = tok.encode("The") if tok is not None else [eos]
            tokens = generation_check(model, out, prompt, eos)
            notes.append(f"generation check: AutoModelForCausalLM from {out} generates the run's "
                         f"greedy tokens ({len(tokens)} from {prompt})")
    except BaseException:
        if not existed:
            shutil.rmtree(out, ignore_errors=True)  # nothing half-written
        raise
    return Export(out, notes)


def export_run(run_dir, out_dir, family: Optional[str] = None) -> Path:
    """Write a run's model as a Hugging Face folder (see `export`); returns the folder."""
    return export(run_dir, out_dir, family, check=False).path


if __name__ == "__main__":
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m ablate.hf", description=export_run.__doc__)
    ap.add_argument("run_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--family", choices=FAMILIES.names(), default=None)
    args = ap.parse_args()
    try:
        print(export_run(args.run_dir, args.out_dir, args.family))
    except AblateError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
