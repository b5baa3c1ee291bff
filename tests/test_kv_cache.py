"""Decoding with a KV cache gives the logits of a full forward pass, for every option of every
axis, every arch preset and the model keys that change attention or the head; the cache holds
n_kv_heads heads per layer (GQA / MQA: n_heads / n_kv_heads times smaller)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ablate.config.axes import group_options
from ablate.model import options
from ablate.model.blocks import Block
from ablate.model.kv_cache import KVCache
from ablate.model.spec import ModelSpec
from ablate.model.transformer import Transformer
from conftest import PRESET_DEPTH, compose

SIZE = ["model.d_model=32", "model.n_layers=2", "model.n_heads=4", "model.max_seq_len=32", "train.seq_len=16"]
# Model keys that are no axis but change attention or the output head.
MODEL_KEYS = [["model.attn_softcap=5.0"], ["model.logit_softcap=3.0"], ["model.parallel_block=true"],
              ["model.mtp_heads=2"], ["pos=alibi", "model.attn_softcap=5.0"], ["model.emb_scale=true"],
              ["attn=gqa", "pos=rope", "qk_norm=on", "norm_pos=sandwich"],
              ["pos=rope", "attn.window=4", "attn.global_every=2"]]  # chunks wrap the sliding layer's ring
VARIANTS = ([[f"{axis}={o.name}"] for axis in options.AXES if axis != "optim"  # the trainer's: same model
             for o in options.declared(axis)]
            + [[f"arch={arch}", *PRESET_DEPTH.get(arch, [])] for arch in group_options("arch")] + MODEL_KEYS)
CHUNKS = [5, 1, 1, 1, 3, 1, 1]  # a prefill, one token at a time, a chunk of 3 (its mask), more steps


pytestmark = pytest.mark.usefixtures("one_thread")


def model_of(spec: ModelSpec) -> Transformer:
    """Random weights large enough that attention is far from uniform (init's 0.02 is not)."""
    torch.manual_seed(0)
    model = Transformer(spec).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim > 1:
                p.normal_(0, p.shape[-1] ** -0.5)
            else:
                p.add_(0.1 * torch.randn_like(p))
    return model


def cached_logits(model: Transformer, idx: torch.Tensor, chunks=CHUNKS) -> torch.Tensor:
    cache = KVCache.for_model(model, batch=idx.shape[0], capacity=idx.shape[1])
    out, start = [], 0
    for n in chunks:
        out.append(model.decode(idx[:, start:start + n], cache))  # (B, n, V)
        start += n
    assert cache.length == idx.shape[1]
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("overrides", VARIANTS, ids=[" ".join(v) for v in VARIANTS])
def test_cached_decoding_equals_the_full_forward_pass(overrides):
    spec = ModelSpec.from_config(compose([*SIZE, *overrides]))
    model = model_of(spec)
    idx = torch.randint(0, spec.vocab_size, (2, sum(CHUNKS)))
    with torch.no_grad():
        full = model(idx).logits  # (B, T, V)
        torch.testing.assert_close(cached_logits(model, idx), full, rtol=1e-5, atol=1e-5)
        # the cache was the decode's only: a plain forward pass is unchanged after it
        assert all(b.attn.kv_cache is None for b in model.blocks)
        torch.testing.assert_close(model(idx).logits, full, rtol=0, atol=0)


def test_every_axis_and_preset_is_covered():
    axes = {v[0].split("=")[0] for v in VARIANTS}
    assert (set(options.AXES) - {"optim"}) | {"arch"} <= axes  # optim: the trainer's axis
    assert len([v for v in VARIANTS if v[0].startswith("arch=")]) == len(group_options("arch")) >= 3


class ScaledBranchBlock(Block):
    """A plugin's block: pre-norm with the attention branch halved (it reaches the cache
    through self.attn, as every block does)."""

    def __init__(self, spec, make_norm):
        super().__init__(spec, make_norm)
        self.norm1, self.norm2 = make_norm(spec.d_model), make_norm(spec.d_model)

    def forward(self, x, ctx):
        x = x + 0.5 * self.attn(self.norm1(x), ctx)
        return x + self.ffn(self.norm2(x))


class Tanh(nn.Module):
    def __init__(self, d, eps=1e-5, bias=True):
        super().__init__()

    def forward(self, x):
        return torch.tanh(x)


def test_plugin_options_decode_with_the_cache(own_registry):
    options.register_option("norm_pos", "halfattn", ScaledBranchBlock, params=lambda spec, norm: 2 * norm)
    options.register_option("norm", "tanh", Tanh, params=lambda spec, d: 0)
    spec = ModelSpec(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=16,
                     norm_pos="halfattn", norm="tanh", pos="rope")
    model = model_of(spec)
    idx = torch.randint(0, 64, (3, sum(CHUNKS)))
    with torch.no_grad():
        torch.testing.assert_close(cached_logits(model, idx), model(idx).logits, rtol=1e-5, atol=1e-5)


def test_the_cache_holds_kv_heads_only_and_its_bytes_are_its_tensors():
    sizes = {}
    for attn in ("mha", "gqa", "mqa"):  # MLA's cache of latents: tests/test_mla.py
        spec = ModelSpec.from_config(compose([*SIZE, f"attn={attn}"]))
        model = model_of(spec)
        cache = KVCache.for_model(model, batch=3, capacity=10)
        assert [tuple(layer.k.shape) for layer in cache.layers] == [(3, spec.n_kv_heads, 10, 8)] * 2
        assert all(layer.v.shape == layer.k.shape for layer in cache.layers)
        # k and v, 2 layers, 3 sequences, 10 positions, n_kv_heads x head_dim 8, fp32
        assert cache.bytes() == 2 * 2 * 3 * 10 * spec.n_kv_heads * 8 * 4
        assert KVCache.for_model(model, 3, 10, dtype=torch.bfloat16).bytes() == cache.bytes() // 2
        sizes[attn] = (cache.bytes(), spec.n_kv_heads)
    assert sizes["mha"][0] == sizes["gqa"][0] * (4 // sizes["gqa"][1]) == sizes["mqa"][0] * 4


def test_decoding_stops_at_a_learned_table_and_at_the_capacity():
    spec = ModelSpec(vocab_size=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=64, max_seq_len=8)
    model = model_of(spec)
    cache = KVCache.for_model(model, batch=1, capacity=12)
    model.decode(torch.zeros(1, 8, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="position 8 is past the model's 8 positions"):
        model.decode(torch.zeros(1, 1, dtype=torch.long), cache)
    small = KVCache.for_model(model, batch=1, capacity=4)
    with pytest.raises(ValueError, match="KV cache full: 5 positions do not fit its capacity of 4"):
        model.decode(torch.zeros(1, 5, dtype=torch.long), small)
