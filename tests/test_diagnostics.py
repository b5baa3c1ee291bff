"""Diagnostics computed on hand-made cases: dead units, max attention logit, residual RMS,
per-component gradient norms, update ratios, and the no-side-effects guarantee."""

from __future__ import annotations

import math

import pytest
import torch

from ablate.model.ffn import dead_fraction
from ablate.train.diagnostics import (activation_stats, grad_norms, grad_profile, role_groups,
                                update_ratios)
from ablate.model.spec import ModelSpec
from ablate.model.transformer import build_model


def model(seed=0, **kw):
    base = dict(vocab_size=64, d_model=16, n_layers=2, n_heads=2, n_kv_heads=2, d_ff=32, max_seq_len=16)
    torch.manual_seed(seed)
    return build_model(ModelSpec(**{**base, **kw}))


def tokens(B=3, T=10, seed=1):
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(0, 64, (B, T + 1), generator=g)
    return w[:, :-1], w[:, 1:]


def test_dead_fraction_on_a_hand_made_tensor():
    h = torch.zeros(2, 3, 4)  # (B, T, d_ff)
    h[0, 1, 0] = 0.3  # unit 0 fires once
    h[1, 2, 3] = 2.0  # unit 3 fires once
    assert dead_fraction(h).item() == pytest.approx(0.5)  # units 1 and 2 never fire
    assert dead_fraction(torch.ones(5, 7)).item() == 0.0


@pytest.mark.parametrize("act", ["relu", "reglu"])
def test_dead_ffn_units_counted_through_the_model(act):
    m = model(act=act, n_layers=1)
    ffn = m.blocks[0].ffn
    d_ff = 32
    with torch.no_grad():  # units with a huge negative pre-activation bias never fire
        first = ffn.up if act == "relu" else ffn.gate_up
        bias = torch.full((d_ff,), 100.0)
        bias[: d_ff // 4] = -100.0
        first.bias[:d_ff].copy_(bias)
    x, _ = tokens()
    stats = activation_stats(m, x)
    assert stats["dead_ffn_frac/block0"].item() == pytest.approx(0.25)


def test_no_dead_unit_key_for_smooth_activations():
    stats = activation_stats(model(act="gelu"), tokens()[0])
    assert not any(k.startswith("dead_ffn_frac") for k in stats)
    assert {"resid_rms/block0", "resid_rms/block1", "max_attn_logit/block0"} <= set(stats)


def test_max_attn_logit_and_resid_rms_match_a_manual_forward():
    m = model(n_layers=1, pos="nope")
    with torch.no_grad():
        m.blocks[0].attn.qkv.weight.mul_(30.0)  # large logits so the max is not trivially ~0
    x, _ = tokens()
    stats = activation_stats(m, x)
    blk = m.blocks[0]
    with torch.no_grad():
        e = m.tok_emb(x)
        q, k, _ = blk.attn.qkv(blk.norm1(e)).split(blk.attn.split, dim=-1)
        B, T, _ = q.shape
        q = q.view(B, T, 2, 8).transpose(1, 2)
        k = k.view(B, T, 2, 8).transpose(1, 2)
        s = (q @ k.transpose(-2, -1)) / math.sqrt(8)
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        want_logit = s.masked_fill(future, float("-inf")).amax()
        out = blk(e, m.pos.context(T, x.device, e.dtype))
        want_rms = out.pow(2).mean().sqrt()
    torch.testing.assert_close(stats["max_attn_logit/block0"], want_logit)
    torch.testing.assert_close(stats["resid_rms/block0"], want_rms)
    logits = m(x).logits
    torch.testing.assert_close(stats["mean_log_z"], torch.logsumexp(logits, -1).mean())


def test_activation_pass_has_no_side_effects():
    m = model(dropout=0.1)
    m.train()
    x, _ = tokens()
    rng = torch.get_rng_state()
    activation_stats(m, x)
    assert torch.equal(rng, torch.get_rng_state())  # no random numbers drawn (dropout is off)
    assert m.training
    for b in m.blocks:
        assert not b.attn.record_max_logit and b.attn.max_logit is None
        assert not b._forward_hooks and not b.ffn._forward_hooks


def test_grad_norms_by_component_match_the_definition():
    m = model(tied=False)
    x, y = tokens()
    m(x, y).loss.backward()
    norms = grad_norms(m)

    def norm(params):
        return torch.sqrt(sum(p.grad.pow(2).sum() for p in params if p.grad is not None))

    for i, b in enumerate(m.blocks):
        torch.testing.assert_close(norms[f"block{i}.attn"], norm(b.attn.parameters()))
        torch.testing.assert_close(norms[f"block{i}.ffn"], norm(b.ffn.parameters()))
        torch.testing.assert_close(norms[f"block{i}"], norm(b.parameters()))
    torch.testing.assert_close(norms["head"], norm(m.lm_head.parameters()))
    torch.testing.assert_close(norms["embedding"],
                               norm(list(m.tok_emb.parameters()) + list(m.pos.parameters())))
    # The profile reports the same block norms, first block to last.
    prof = grad_profile(m, x, y)
    assert [r["layer"] for r in prof] == [0, 1]
    assert prof[1]["grad_norm"] == pytest.approx(norms["block1"].item(), rel=1e-5)


def test_update_ratio_is_delta_norm_over_weight_norm():
    m = model()
    groups = role_groups(m)
    assert {"embedding", "input", "output", "gain", "bias"} <= set(groups)
    before = {k: [p.detach().clone() for p in ps] for k, ps in groups.items()}
    with torch.no_grad():
        for p in groups["output"]:
            p.mul_(1.1)  # ||dW|| / ||W|| = 0.1 exactly
    r = update_ratios(groups, before)
    assert r["output"].item() == pytest.approx(0.1, rel=1e-5)
    assert r["input"].item() == 0.0
    assert math.isnan(r["bias"].item())  # all-zero biases at init: no ratio (not logged)
