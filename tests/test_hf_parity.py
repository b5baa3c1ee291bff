"""Parity with Hugging Face `transformers` reference models: copied weights, same logits.

Both directions per family: our random model exported (to_hf_model) and an HF random model
imported (from_hf), on tiny configs. Gains and biases are perturbed away from their 1/0 init
so a misplaced norm or bias cannot hide."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from ablate import hf  # noqa: E402
from ablate.errors import ConfigError  # noqa: E402
from ablate.model.spec import ModelSpec  # noqa: E402
from ablate.model.transformer import Transformer  # noqa: E402

BASE = dict(vocab_size=96, d_model=32, n_layers=2, n_heads=4, d_ff=48, max_seq_len=16)
LLAMA = dict(norm="rmsnorm", act="swiglu", pos="rope", tied=False, bias=False, norm_eps=1e-6)
CASES = {  # name -> (HF family, ModelSpec fields)
    # arch=gpt2
    "gpt2": ("gpt2", dict(n_kv_heads=4, d_ff=64)),
    "gpt2-untied": ("gpt2", dict(n_kv_heads=4, d_ff=64, tied=False)),
    # arch=llama with GQA (4 query heads share 2 KV heads)
    "llama-gqa": ("llama", dict(LLAMA, n_kv_heads=2, rope_base=500000.0)),
    "llama-mqa-bias-tied": ("llama", dict(LLAMA, n_kv_heads=1, bias=True, tied=True)),
    # QK-norm: per-head RMSNorm on q and k
    "qwen3": ("qwen3", dict(LLAMA, n_kv_heads=1, qk_norm=True)),
    # ffn=moe: per-head QK-norm, top-k gates as they are (norm_topk_prob false), the first layer dense
    "qwen3-moe": ("qwen3_moe", dict(LLAMA, n_kv_heads=2, qk_norm=True, ffn="moe", settings={"ffn": dict(
        experts=4, top_k=2, d_expert=24, dense_first=1, z_coef=0.0)})),
    # Mixtral: gates renormalized, every layer routes; d_ff is imported as the experts' width
    "mixtral": ("mixtral", dict(LLAMA, n_kv_heads=2, d_ff=24, ffn="moe", settings={"ffn": dict(
        experts=4, top_k=2, d_expert=24, renorm=True, z_coef=0.0)})),
    # sandwich norm, GeGLU, embedding scale, attention and logit soft-caps
    "gemma2": ("gemma2", dict(n_kv_heads=2, norm="rmsnorm", act="geglu", pos="rope", bias=False,
                              norm_pos="sandwich", emb_scale=True, attn_softcap=5.0, logit_softcap=3.0,
                              norm_eps=1e-6)),
    # Multi-head Latent Attention, dense MLPs: plain query, and compressed query (q_rank)
    "deepseek-mla": ("deepseek_v3", dict(LLAMA, n_kv_heads=4, attn="mla",
                                          settings={"attn": {"kv_rank": 24, "rope_dim": 4}})),
    "deepseek-mla-q-latent": ("deepseek_v3", dict(LLAMA, n_kv_heads=4, attn="mla", tied=True,
                                                   settings={"attn": {"kv_rank": 10, "q_rank": 12, "rope_dim": 6}})),
    # Gemma 2's block with QK-norm ((1 + w) gains on q and k too), a logit soft-cap only
    "gemma3": ("gemma3_text", dict(n_kv_heads=2, norm="rmsnorm", act="geglu", pos="rope", bias=False,
                                   norm_pos="sandwich", emb_scale=True, qk_norm=True, logit_softcap=3.0,
                                   norm_eps=1e-6)),
    # MLA with DeepSeek's MoE: sigmoid router with its choice bias (perturbed), a shared expert,
    # norm_topk_prob from renorm, the first layer dense
    "deepseek-moe": ("deepseek_v3", dict(LLAMA, n_kv_heads=4, attn="mla", ffn="moe", settings={
        "attn": {"kv_rank": 24, "rope_dim": 4}, "ffn": dict(experts=4, top_k=2, d_expert=24, renorm=True,
                                                            router="sigmoid", shared=1, balance="bias", z_coef=0.0,
                                                            dense_first=1)})),
}


def perturb_(module: torch.nn.Module) -> None:
    with torch.no_grad():
        for p in module.parameters():
            if p.ndim == 1:  # gains and biases start at 1 / 0: move them so they matter
                p.add_(torch.randn_like(p) * 0.2)
        for name, b in module.named_buffers():  # a router's choice bias (HF: e_score_correction_bias)
            if name.endswith(("choice_bias", "e_score_correction_bias")):
                b.add_(torch.randn_like(b) * 0.2)


@pytest.mark.parametrize("case", CASES)
def test_export_matches_hf_reference(case):
    family, fields = CASES[case]
    torch.manual_seed(0)
    spec = ModelSpec(**{**BASE, **fields})
    ours = Transformer(spec).eval()
    perturb_(ours)
    ref = hf.to_hf_model(ours)
    assert type(ref).__name__ == hf.FAMILIES.get(family).model_class
    idx = torch.randint(0, spec.vocab_size, (2, spec.max_seq_len))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx).logits, ref(idx).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", CASES)
def test_import_matches_hf_reference(case):
    """An HF model initialised by HF (not by us) imports with identical logits."""
    family, fields = CASES[case]
    torch.manual_seed(1)
    config = hf.FAMILIES.get(family).config_from_spec(ModelSpec(**{**BASE, **fields}))
    config._attn_implementation = "eager" if family.startswith("gemma") else "sdpa"  # soft-caps: eager only
    ref = getattr(transformers, hf.FAMILIES.get(family).model_class)(config).eval()
    perturb_(ref)
    ours = hf.from_hf(ref)
    assert ours.spec == ModelSpec(**{**BASE, **fields})
    idx = torch.randint(0, config.vocab_size, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx).logits, ref(idx).logits, rtol=1e-5, atol=1e-5)
    # and back again: the exported state dict is HF's own (Gemma's 1 + w gains round in fp32)
    _, state = hf.to_hf(ours, family)
    ref_state = ref.state_dict()
    assert set(state) <= set(ref_state)
    for key, value in state.items():
        torch.testing.assert_close(value, ref_state[key], rtol=0, atol=1e-6)


def test_gpt2_conv1d_is_transposed_and_qkv_order_kept():
    torch.manual_seed(0)
    spec = ModelSpec(**{**BASE, **CASES["gpt2"][1]})
    ours = Transformer(spec)
    _, state = hf.to_hf(ours)
    qkv = ours.blocks[0].attn.qkv.weight  # (3d, d): rows [q; k; v]
    c_attn = state["transformer.h.0.attn.c_attn.weight"]  # Conv1D: (d, 3d)
    assert c_attn.shape == (spec.d_model, 3 * spec.d_model)
    torch.testing.assert_close(c_attn[:, spec.d_model:2 * spec.d_model], qkv[spec.d_model:2 * spec.d_model].t())
    # tied: the HF head is the embedding
    assert torch.equal(state["lm_head.weight"], state["transformer.wte.weight"])


def test_export_refuses_an_architecture_no_family_has():
    spec = ModelSpec(**{**BASE, "n_kv_heads": 4, "pos": "alibi"})
    with pytest.raises(ConfigError, match="no Hugging Face family"):
        hf.to_hf(Transformer(spec))
    with pytest.raises(ConfigError, match="pos='alibi'"):
        hf.to_hf(Transformer(spec), family="gpt2")


# Every ModelSpec field, with values that change the model (a field missing here fails the test).
ALTERNATIVES = {
    "vocab_size": [100], "d_model": [48], "n_layers": [3], "n_heads": [8, 2], "n_kv_heads": [4, 2, 1],
    "d_ff": [40], "max_seq_len": [32], "norm": ["layernorm", "rmsnorm", "dyt"], "norm_eps": [0.5],
    "norm_pos": ["pre", "post", "sandwich", "reordered"],
    "act": ["relu", "gelu", "silu", "swiglu", "geglu", "reglu"],
    "pos": ["learned", "sinusoidal", "rope", "alibi", "nope"], "rope_base": [100.0],
    # attn: by default the option n_kv_heads names (the n_kv_heads alternatives); another is refused
    "attn": ["mha", "gqa", "mqa", "mla"], "ffn": ["dense", "moe"], "ffn_multiple_of": [8],
    "tied": [True, False], "bias": [True, False], "dropout": [0.1], "attn_dropout": [0.0, 0.2],
    "qk_norm": [True, False], "init": ["xavier"],
    "init_std": [0.05], "depth_scaled_init": [False], "emb_scale": [True, False],
    "parallel_block": [True], "z_loss": [1e-3], "attn_softcap": [0.5], "logit_softcap": [0.5],
    "act_clamp": [1e-3], "mtp_heads": [1], "mtp_weight": [0.5], "tokenizer_vocab": [90],
    # alpha0 with the families' norms: refused by the spec; attn's: MLA's own ranks (refused by the
    # others), the sliding window (W=8 of the audit's 16 tokens) uniform, every 2nd layer full, and
    # with a second RoPE base for the sliding layers
    "settings": [{"norm": {"alpha0": 1.0}}, {"attn": {"kv_rank": 7, "decode": "plain"}}, {"attn": {"window": 8}},
                 {"attn": {"window": 8, "global_every": 2}},
                 {"attn": {"window": 8, "global_every": 2, "local_rope_base": 100.0}}],
    # sp ignores the base shape (exports exactly); mup and completep are refused by every family
    "param": ["mup", "completep"], "base_width": [16], "base_depth": [1], "base_d_ff": [20],
}


def test_every_field_exports_exactly_or_is_refused_by_each_family():
    """Audit: each field changed alone on each family's spec; a family that accepts the result
    must give our logits (a field it cannot represent, e.g. act_clamp, must block it)."""
    import dataclasses

    assert set(ALTERNATIVES) == {f.name for f in dataclasses.fields(ModelSpec)}
    accepted, wrong = 0, []
    for case, (_, fields) in CASES.items():
        base = {**BASE, **fields}
        for field, values in ALTERNATIVES.items():
            for value in values:
                if value == base.get(field, ModelSpec.__dataclass_fields__[field].default):
                    continue
                try:
                    spec = ModelSpec(**{**base, field: value})
                except ConfigError:
                    continue  # not a valid model
                for family in hf.FAMILIES:
                    try:
                        hf.family_for(spec, family)
                    except ConfigError:
                        continue
                    torch.manual_seed(0)
                    ours = Transformer(spec).eval()
                    perturb_(ours)
                    ref = hf.to_hf_model(ours, family)
                    idx = torch.randint(0, spec.vocab_size, (1, 16))
                    with torch.no_grad():
                        diff = (ours(idx).logits - ref(idx).logits).abs().max().item()
                    accepted += 1
                    if diff > 1e-4:
                        wrong.append(f"{case} {field}={value!r} as {family}: max diff {diff:.3g}")
    assert not wrong, wrong
    assert accepted > 50  # the audit really exported


def test_gpt2_style_with_grouped_kv_heads_is_not_gpt2():
    spec = ModelSpec(**{**BASE, **CASES["gpt2"][1], "n_kv_heads": 2})
    with pytest.raises(ConfigError, match=r"n_kv_heads=2 \(needs n_kv_heads == n_heads\)"):
        hf.to_hf(Transformer(spec), family="gpt2")
    with pytest.raises(ConfigError, match="no Hugging Face family matches"):
        hf.to_hf(Transformer(spec))


def test_a_model_no_family_has_is_refused_by_its_keys():
    """The refusal names what keeps the model out (the closest family's differences, or
    the key no family has), not every family's requirements."""
    spec = ModelSpec(**{**BASE, **CASES["llama-gqa"][1], "norm": "layernorm"})
    with pytest.raises(ConfigError) as e:
        hf.to_hf(Transformer(spec))
    assert str(e.value) == ("no Hugging Face family matches this architecture: the closest, llama, "
                            "differs in norm='layernorm' (needs 'rmsnorm')")


def test_a_norm_no_family_has_is_refused_with_its_settings():
    """DyT (and any option's own settings) has no HF counterpart: refused by its keys."""
    dyt = {"norm": "dyt", "settings": {"norm": {"alpha0": 1.0}}}
    spec = ModelSpec(**{**BASE, **CASES["llama-gqa"][1], **dyt})
    with pytest.raises(ConfigError) as e:
        hf.to_hf(Transformer(spec))
    assert str(e.value) == ("no Hugging Face family matches this architecture: no family has "
                            "norm='dyt', settings={'norm': {'alpha0': 1.0}}")


def test_act_clamp_blocks_every_family():
    spec = ModelSpec(**{**BASE, **CASES["llama-gqa"][1], "act_clamp": 1.0})
    with pytest.raises(ConfigError, match="no Hugging Face family matches"):
        hf.to_hf(Transformer(spec))


@pytest.mark.parametrize("family,settings,words", [
    ("mixtral", dict(renorm=False), "ffn.renorm=true (Mixtral always renormalizes"),
    ("mixtral", dict(renorm=True, dense_first=1), "ffn.dense_first=0"),
    ("llama", dict(), "ffn='moe' (needs one of dense)"),
    ("olmoe", dict(), "OLMoE norms q and k over the whole projection width"),
    # DeepSeek-V3's router is a sigmoid with shared experts; Qwen3-MoE and Mixtral have neither, nor a choice bias
    ("deepseek_v3", dict(), "ffn='moe' (needs ffn.router=sigmoid, ffn.shared >= 1"),
    ("mixtral", dict(renorm=True, shared=1), "ffn.shared=0"),
    ("mixtral", dict(renorm=True, balance="bias"), "ffn.balance other than bias (no choice bias)"),
])
def test_an_moe_export_that_does_not_map_is_refused_in_one_line(family, settings, words):
    spec = ModelSpec(**{**BASE, **CASES["mixtral"][1], "settings": {"ffn": dict(experts=4, **settings)}})
    with pytest.raises(ConfigError, match=r"^cannot export as HF " + family) as e:
        hf.to_hf(Transformer(spec), family=family)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_transformers_older_than_v5_is_refused_in_one_line(monkeypatch):
    """v4 has no rope_parameters: RoPE base 500000 would silently export as 10000."""
    import sys

    # the module, not this file's `transformers`: its lazy loader replaces the sys.modules entry
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "4.46.3")
    spec = ModelSpec(**{**BASE, **CASES["llama-gqa"][1]})
    with pytest.raises(ConfigError, match=r"needs transformers>=5 .*found 4\.46\.3"):
        hf.to_hf_model(Transformer(spec))


def test_mla_with_what_deepseek_v3_cannot_hold_is_refused_by_its_keys():
    spec = ModelSpec(**{**BASE, **CASES["deepseek-mla"][1], "norm": "layernorm"})
    with pytest.raises(ConfigError) as e:
        hf.to_hf(Transformer(spec))
    assert str(e.value) == ("no Hugging Face family matches this architecture: the closest, deepseek_v3, "
                            "differs in norm='layernorm' (needs 'rmsnorm')")


@pytest.mark.parametrize("change,words", [
    (dict(routed_scaling_factor=2.5), "routed_scaling_factor=2.5"),
    (dict(n_group=2, topk_group=1), "n_group=2, topk_group=1"),
    (dict(n_shared_experts=0), "n_shared_experts=0"),
])
def test_a_deepseek_v3_moe_ablate_does_not_route_as_is_refused_on_import(change, words):
    """DeepseekV3Config's own defaults (scaling 2.5, 8 groups of which 4 chosen) route another way."""
    config = hf.FAMILIES.get("deepseek_v3").config_from_spec(ModelSpec(**{**BASE, **CASES["deepseek-moe"][1]}))
    for key, value in change.items():
        setattr(config, key, value)
    with pytest.raises(ConfigError, match=r"^HF DeepseekV3 with ") as e:
        hf.spec_from_hf_config(config)
    assert words in str(e.value) and "\n" not in str(e.value)
