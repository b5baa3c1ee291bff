"""Sliding windows against Hugging Face `transformers` with copied weights, at T > W: a uniform
window (Mistral), local:global layers on the llama block (Ministral; Qwen 3 with
use_sliding_window and explicit layer_types), Gemma 2's alternation and Gemma 3's block with two
RoPE bases. Each model is exported from its spec (hf.to_hf picks the class); logits of a forward
pass and greedy generation (theirs through HF's sliding cache, ours through the ring buffer)
agree, and the HF config imports back to the same spec. An export that would drop the window is
refused in one line."""

from __future__ import annotations

import re

import pytest
import torch

transformers = pytest.importorskip("transformers")

from ablate import hf  # noqa: E402
from ablate.errors import ConfigError  # noqa: E402
from ablate.evaluation.sample import SampleOptions, generate  # noqa: E402
from ablate.model.spec import ModelSpec  # noqa: E402
from ablate.model.transformer import Transformer  # noqa: E402
from test_sliding_window import sharp  # noqa: E402

BASE = dict(vocab_size=96, d_model=32, n_heads=4, n_kv_heads=2, d_ff=48, max_seq_len=64, norm="rmsnorm",
            pos="rope", bias=False, norm_eps=1e-6)
LLAMA = dict(BASE, act="swiglu", tied=False)
GEMMA = dict(BASE, act="geglu", norm_pos="sandwich", emb_scale=True, tied=True)
W = 5
CASES = {  # name -> (HF class, our fields, layers, global_every, local RoPE base)
    "mistral": ("MistralForCausalLM", LLAMA, 2, None, None),
    "ministral": ("MinistralForCausalLM", LLAMA, 3, 3, None),
    "qwen3": ("Qwen3ForCausalLM", dict(LLAMA, qk_norm=True), 4, 2, None),
    "gemma2": ("Gemma2ForCausalLM", dict(GEMMA, attn_softcap=5.0, logit_softcap=3.0), 4, 2, None),
    "gemma3": ("Gemma3ForCausalLM", dict(GEMMA, qk_norm=True, rope_base=1e6), 6, 6, 1e4),
}


def windowed(fields: dict, n_layers: int, global_every=None, local_base=None, window=W) -> ModelSpec:
    slide = {"window": window, "global_every": global_every, "local_rope_base": local_base}
    return ModelSpec(**fields, n_layers=n_layers, settings={"attn": slide})


@pytest.mark.parametrize("name", CASES)
def test_windowed_model_matches_hf_with_copied_weights(name):
    cls, fields, n_layers, global_every, local_base = CASES[name]
    spec = windowed(fields, n_layers, global_every, local_base)
    ours = sharp(Transformer(spec))
    config, state = hf.to_hf(ours)
    assert hf.FAMILIES.get(config.model_type).model_class == cls
    assert config.sliding_window == W
    if name == "qwen3":  # without the flag Qwen3Config would drop the window
        assert config.use_sliding_window
    config._attn_implementation = "eager"
    ref = getattr(transformers, cls)(config).eval()
    missing, unexpected = ref.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in k for k in missing)
    assert hf.spec_from_hf_config(config) == spec  # import reads the window back
    idx = torch.randint(0, spec.vocab_size, (2, 24))  # T = 24 > W = 5
    with torch.no_grad():
        torch.testing.assert_close(ours(idx).logits, ref(idx).logits, rtol=1e-4, atol=1e-4)
        prompt = idx[0, :9].tolist()  # a prompt longer than the window, then 3 windows more
        ids = torch.tensor([prompt])  # every token attended (HF would mask ids equal to its pad id)
        theirs = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, min_new_tokens=16,
                              do_sample=False)[0, len(prompt):].tolist()
    mine = generate(ours, prompt, SampleOptions(max_new_tokens=16, temperature=0), vocab=spec.vocab_size,
                    eot=-1).tokens[0]
    assert mine == theirs


@pytest.mark.parametrize("family, fields, global_every, local_base, message", [
    ("llama", LLAMA, None, None, "attn.window=5 (needs a class with it: HF llama has no sliding window"),
    ("gpt2", dict(BASE, norm="layernorm", pos="learned", act="gelu", bias=True, n_kv_heads=4), None, None,
     "attn.window=5 (needs a class with it: HF gpt2 has no sliding window"),
    ("mistral", LLAMA, 2, None, "attn.global_every=2 (HF mistral has one window on every layer)"),
    ("gemma2", GEMMA, 2, 1e4, "attn.local_rope_base=10000 (HF gemma2 has one RoPE base)"),
])
def test_an_export_that_would_drop_the_window_is_refused(family, fields, global_every, local_base, message):
    ours = Transformer(windowed(fields, 4, global_every, local_base))
    with pytest.raises(ConfigError, match=f"cannot export as HF {family}: .*{re.escape(message)}") as e:
        hf.to_hf(ours, family)
    assert "\n" not in str(e.value)


def test_a_model_whose_window_no_family_holds_is_refused_by_it():
    """Two RoPE bases on the llama block: only Gemma 3 has them, and its block is not this one."""
    with pytest.raises(ConfigError, match="no Hugging Face family matches this architecture: the closest, "
                                          "ministral, differs in attn.local_rope_base=10000"):
        hf.to_hf(Transformer(windowed(LLAMA, 4, 2, 1e4)))


def test_hf_layer_types_that_are_not_every_nth_layer_full_are_refused_on_import():
    config = transformers.MinistralConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                                          num_attention_heads=4, num_key_value_heads=2, sliding_window=5,
                                          layer_types=["full_attention"] + ["sliding_attention"] * 3)
    with pytest.raises(ConfigError, match="are not every Nth layer full"):
        hf.spec_from_hf_config(config)


@pytest.mark.parametrize("arch, cls", [("mistral", "MistralForCausalLM"), ("gemma3", "Gemma3ForCausalLM")])
def test_presets_export_to_their_hf_class_with_the_same_logits(arch, cls):
    from conftest import compose

    spec = ModelSpec.from_config(compose([f"arch={arch}", "logger=none"]))
    ours = sharp(Transformer(spec))
    config, state = hf.to_hf(ours)
    config._attn_implementation = "eager"
    ref = getattr(transformers, cls)(config).eval()
    ref.load_state_dict(state, strict=False)
    idx = torch.randint(0, spec.vocab_size, (1, 48))  # past the presets' window of 32
    with torch.no_grad():
        torch.testing.assert_close(ours(idx).logits, ref(idx).logits, rtol=1e-4, atol=1e-4)
