"""Sliding windows against Hugging Face `transformers` with copied weights, at T > W: a uniform
window (Mistral), local:global layers on the llama block (Ministral; Qwen 3 with
use_sliding_window and explicit layer_types), Gemma 2's alternation and Gemma 3's block with two
RoPE bases. Logits of a forward pass and greedy generation (theirs through HF's sliding cache,
ours through the ring buffer) agree."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from ablate import hf  # noqa: E402
from ablate.evaluation.sample import SampleOptions, generate  # noqa: E402
from ablate.model.sliding import layer_windows  # noqa: E402
from ablate.model.spec import ModelSpec  # noqa: E402
from ablate.model.transformer import Transformer  # noqa: E402
from test_sliding_window import sharp, slide  # noqa: E402

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


def hf_config(name: str, spec: ModelSpec, global_every, local_base):
    """The HF config of our windowed model: its family's, with the window and layer types."""
    windows = layer_windows(W, global_every, spec.n_layers)
    types = ["sliding_attention" if w else "full_attention" for w in windows]
    family = {"mistral": "llama", "ministral": "llama", "gemma3": "gemma3_text"}.get(name, name)
    kw = hf.FAMILIES.get(family).config_from_spec(spec).to_dict()
    kw = {k: v for k, v in kw.items() if k not in ("model_type", "transformers_version", "architectures")}
    kw.update(sliding_window=W, layer_types=types)
    if name == "qwen3":
        kw.update(use_sliding_window=True, max_window_layers=0)
    if name == "gemma3":
        kw["rope_parameters"] = {"full_attention": {"rope_type": "default", "rope_theta": spec.rope_base},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": local_base}}
    cls = {"mistral": "MistralConfig", "ministral": "MinistralConfig", "qwen3": "Qwen3Config",
           "gemma2": "Gemma2Config", "gemma3": "Gemma3TextConfig"}[name]
    if name == "mistral":
        kw.pop("layer_types")  # Mistral ignores it: one window for every layer
    config = getattr(transformers, cls)(**kw)
    config._attn_implementation = "eager"
    return config


@pytest.mark.parametrize("name", CASES)
def test_windowed_model_matches_hf_with_copied_weights(name):
    cls, fields, n_layers, global_every, local_base = CASES[name]
    spec = ModelSpec(**fields, n_layers=n_layers)
    ours = slide(sharp(Transformer(spec)), W, global_every, local_base)
    _, state = hf.to_hf(ours)
    ref = getattr(transformers, cls)(hf_config(name, spec, global_every, local_base)).eval()
    missing, unexpected = ref.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in k for k in missing)
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
