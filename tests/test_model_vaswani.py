"""arch=vaswani is the 2017 recipe as far as a decoder-only LM goes: tensor2tensor's init
(model.init=xavier: Glorot-uniform matrices with q, k, v each its own d x d matrix, N(0, d^-1/2)
embeddings times sqrt(d)), dropout 0.1 on the embedding sum and sublayer outputs only (none on
attention probabilities: dropout.attn=0), and the raw sin/cos table."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch

from ablate.errors import ConfigError
from ablate.model.positions import sinusoidal_table
from ablate.model.roles import param_seed
from ablate.model.spec import ModelSpec, count_params
from ablate.model.transformer import Transformer
from conftest import TINY, compose, find_run_dirs, read_jsonl, run_ablate

BASE = ModelSpec(vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, d_ff=256,
                 max_seq_len=32, init="xavier", depth_scaled_init=False)


def glorot(fan_in: int, fan_out: int) -> float:
    return math.sqrt(6.0 / (fan_in + fan_out))


def assert_uniform(w: torch.Tensor, bound: float, name: str):
    """U(-bound, bound): no value outside, the extremes reached, std bound / sqrt(3)."""
    assert w.abs().max().item() <= bound * (1 + 1e-6), name
    assert w.abs().max().item() > 0.97 * bound, name
    assert w.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.06), name


def test_xavier_draws_q_k_v_as_separate_d_by_d_matrices():
    torch.manual_seed(0)
    m = Transformer(BASE)
    d = BASE.d_model
    for i, block in enumerate(m.blocks):
        qkv = block.attn.qkv.weight  # (3d, d), rows [q; k; v]
        for part, w in zip("qkv", qkv.split(d)):
            assert_uniform(w, glorot(d, d), f"blocks.{i}.{part}")
        # not the fused (3d, d) matrix's own bound sqrt(6 / 4d): that would start q.k 2x smaller
        assert qkv.std().item() == pytest.approx(glorot(d, d) / math.sqrt(3), rel=0.05)
        assert_uniform(block.attn.proj.weight, glorot(d, d), f"blocks.{i}.proj")
        assert_uniform(block.ffn.up.weight, glorot(d, BASE.d_ff), f"blocks.{i}.up")
        assert_uniform(block.ffn.down.weight, glorot(BASE.d_ff, d), f"blocks.{i}.down")


def test_xavier_splits_grouped_kv_and_gated_ffn_by_their_own_shapes():
    spec = dataclasses.replace(BASE, attn="gqa", n_kv_heads=2, act="swiglu", d_ff=160)
    torch.manual_seed(0)
    block = Transformer(spec).blocks[0]
    d, kv = spec.d_model, 2 * spec.head_dim
    q, k, v = block.attn.qkv.weight.split([d, kv, kv])
    assert_uniform(q, glorot(d, d), "q")
    assert_uniform(k, glorot(d, kv), "k")  # fan_out = the KV heads' width
    assert_uniform(v, glorot(d, kv), "v")
    gate, up = block.ffn.gate_up.weight.chunk(2)
    assert_uniform(gate, glorot(d, spec.d_ff), "gate")
    assert_uniform(up, glorot(d, spec.d_ff), "up")


def test_xavier_tables_are_normal_with_std_d_to_the_minus_half():
    spec = dataclasses.replace(BASE, tied=False, vocab_size=512)  # learned positions, untied head
    torch.manual_seed(0)
    m = Transformer(spec)
    for name, w in (("tok_emb", m.tok_emb.weight), ("pos", m.pos.emb.weight), ("head", m.lm_head.weight)):
        assert w.mean().abs().item() < 0.01, name
        assert w.std().item() == pytest.approx(spec.d_model ** -0.5, rel=0.05), name
        assert w.abs().max().item() > 3 * spec.d_model ** -0.5, name  # normal tails, not uniform


def test_xavier_depth_scaling_divides_the_residual_outputs_only():
    torch.manual_seed(0)
    flat = Transformer(BASE)
    scaled = Transformer(dataclasses.replace(BASE, depth_scaled_init=True))
    d, div = BASE.d_model, math.sqrt(2 * BASE.n_layers)
    assert_uniform(scaled.blocks[0].attn.proj.weight, glorot(d, d) / div, "proj")
    assert_uniform(scaled.blocks[0].ffn.down.weight, glorot(BASE.d_ff, d) / div, "down")
    # same generator per name: the scaled matrix is the flat one divided
    torch.testing.assert_close(scaled.blocks[0].attn.proj.weight, flat.blocks[0].attn.proj.weight / div)
    torch.testing.assert_close(scaled.blocks[0].attn.qkv.weight, flat.blocks[0].attn.qkv.weight)


def test_normal_init_is_unchanged_by_the_new_scheme():
    """init=normal (the default) still draws N(0, init_std) everywhere: values keyed by name."""
    spec = dataclasses.replace(BASE, init="normal", depth_scaled_init=True)
    m = Transformer(spec, seed=5)
    assert m.blocks[0].attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert m.tok_emb.weight.std().item() == pytest.approx(0.02, rel=0.05)
    g = torch.Generator().manual_seed(param_seed(5, "tok_emb.weight"))
    torch.testing.assert_close(m.tok_emb.weight, torch.empty(64, 64).normal_(0.0, 0.02, generator=g))


# ---- the preset ---------------------------------------------------------------------------------
def vaswani_spec(*extra: str) -> ModelSpec:
    return ModelSpec.from_config(compose(["arch=vaswani", "logger=none", *extra]))


def test_vaswani_preset_is_the_paper_recipe():
    spec = vaswani_spec()
    assert (spec.init, spec.depth_scaled_init, spec.emb_scale) == ("xavier", False, True)
    assert (spec.dropout, spec.attn_dropout_rate) == (0.1, 0.0)
    torch.manual_seed(0)
    m = Transformer(spec)
    idx = torch.arange(spec.vocab_size)[None]
    emb = m.tok_emb(idx) * m.emb_multiplier
    assert emb.pow(2).mean().sqrt().item() == pytest.approx(1.0, rel=0.05)  # unit-sized embeddings
    # so the position table is the paper's, unscaled
    torch.testing.assert_close(m.pos.table, sinusoidal_table(spec.max_seq_len, spec.d_model))


def test_vaswani_keys_yield_to_the_command_line():
    assert vaswani_spec("dropout.attn=0.1").attn_dropout_rate == 0.1
    assert vaswani_spec("dropout.attn=null").attn_dropout_rate == 0.1  # null: the residual rate
    assert vaswani_spec("model.init=normal").init == "normal"
    off = vaswani_spec("dropout=off")  # the preset's attn 0.0 is no dropout either: allowed
    assert (off.dropout, off.attn_dropout_rate) == (0.0, 0.0)


def test_vaswani_has_no_attention_probability_dropout_but_residual_dropout():
    spec = dataclasses.replace(vaswani_spec("model.d_model=32", "model.n_layers=2"), dropout=0.5)
    torch.manual_seed(0)
    m = Transformer(spec).train()
    x = torch.randn(2, 16, spec.d_model)
    ctx = m.pos.context(16, x.device, x.dtype)
    attn = m.blocks[0].attn
    residual = attn(x, ctx)
    assert (residual == 0).float().mean() > 0.3  # the sublayer output is dropped before the add
    attn.resid_drop.eval()  # what remains is the attention itself: deterministic in train mode
    torch.testing.assert_close(attn(x, ctx), attn(x, ctx))
    same_rate = Transformer(dataclasses.replace(spec, attn_dropout=None)).train()
    a = same_rate.blocks[0].attn
    a.resid_drop.eval()
    assert not torch.allclose(a(x, ctx), a(x, ctx))  # dropout.attn=null: probabilities dropped
    idx = torch.randint(0, 64, (2, 16))
    assert not torch.allclose(m(idx).logits, m(idx).logits)  # the model as a whole still drops


@pytest.mark.parametrize("args, message", [
    (["dropout.attn=0.1"], "dropout.attn=0.1 has no effect with dropout=off"),
    (["dropout=on", "dropout.attn=1.5"], "dropout.attn must be in [0, 1)"),
    (["model.init=kaiming"], "unknown model.init option 'kaiming'; valid options: normal, xavier"),
])
def test_bad_init_and_attention_dropout_are_refused(args, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        compose(args)


def test_vaswani_param_counts_are_unchanged_by_the_recipe():
    """init and dropout change values, not shapes: inspect reports what the built model has."""
    from ablate.measure.inspect import inspect_config

    cfg = compose(["arch=vaswani", "logger=none"])
    recipe_free = compose(["arch=vaswani", "logger=none", "model.init=normal",
                           "model.depth_scaled_init=true", "dropout.attn=null"])
    report = inspect_config(cfg)
    assert report["params"] == inspect_config(recipe_free)["params"]
    built = Transformer(ModelSpec.from_config(cfg), seed=0)
    assert report["params"]["total"] == sum(p.numel() for p in built.parameters())
    assert report["params"]["total"] == count_params(ModelSpec.from_config(compose(["logger=none"])))["total"] - 33_024


def test_ablate_run_arch_vaswani_trains(tmp_path):
    r = run_ablate("run", "arch=vaswani", *TINY, "train.steps=12", f"out_dir={tmp_path}")
    assert r.returncode == 0, r.stderr[-2000:]
    (run,) = find_run_dirs(tmp_path)
    losses = [row["train_loss"] for row in read_jsonl(run / "metrics.jsonl") if "train_loss" in row]
    assert len(losses) == 12 and all(math.isfinite(x) for x in losses)
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.2, losses
