"""Stability options: soft-capping, z-loss, multi-token prediction, reordered norms, activation
clamp, embedding scale, depth-scaled init. Each checked against its formula on small models."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from ablate.errors import ConfigError
from ablate.model.attention import CausalSelfAttention
from ablate.model.blocks import ReorderedBlock
from ablate.model.options import norm_factory
from ablate.model.positions import AttnContext
from ablate.model.spec import ModelSpec, count_params
from ablate.model.transformer import build_model
from ablate.train.evaluate import evaluate

BASE = dict(vocab_size=64, d_model=16, n_layers=2, n_heads=2, n_kv_heads=2, d_ff=32, max_seq_len=16)


def spec(**kw) -> ModelSpec:
    return ModelSpec(**{**BASE, **kw})


def model(seed=0, **kw):
    torch.manual_seed(seed)
    return build_model(spec(**kw))


def batch(seed=1, B=3, T=12, V=64):
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(0, V, (B, T + 1), generator=g)
    return w[:, :-1], w[:, 1:]


@pytest.mark.parametrize("cap", [0.5, 3.0, 30.0])
def test_logit_softcap_bounds_logits_for_any_weights(cap):
    # Property: whatever the weights (scaled up to force huge raw logits), |logits| <= cap.
    for seed in range(5):
        m = model(seed, logit_softcap=cap)
        with torch.no_grad():
            for p in m.parameters():
                p.mul_(1.0 + 20.0 * seed)
        x, _ = batch(seed)
        logits = m(x).logits
        assert torch.isfinite(logits).all()
        assert logits.abs().max() <= cap + 1e-5
    # and it is exactly c * tanh(raw / c)
    raw = model(0)(x).logits
    capped = model(0, logit_softcap=cap)(x).logits
    torch.testing.assert_close(capped, cap * torch.tanh(raw / cap))


def test_attn_softcap_caps_the_scores_before_softmax():
    cap = 2.0
    s = spec(attn_softcap=cap)
    torch.manual_seed(0)
    attn = CausalSelfAttention(s)
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        scale = 10.0 ** seed  # from mild to huge raw logits
        q, k, v = (torch.randn(2, 2, 6, 8, generator=g) * scale for _ in range(3))
        y = attn._explicit(q, k, v, None, 0.0)
        scores = cap * torch.tanh((q @ k.transpose(-2, -1)) / math.sqrt(8) / cap)
        assert scores.abs().max() <= cap
        mask = torch.ones(6, 6, dtype=torch.bool).triu(1)
        want = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        torch.testing.assert_close(y, want)
    # The capped layer is still causal: changing the future leaves the past unchanged.
    x = torch.randn(1, 6, 16)
    x2 = x.clone()
    x2[:, 4:] += 5.0
    ctx = AttnContext()
    torch.testing.assert_close(attn(x, ctx)[:, :4], attn(x2, ctx)[:, :4])


def test_z_loss_equals_its_formula():
    w = 1e-2
    m = model(0, z_loss=w)
    x, y = batch()
    out = m(x, y)
    logits = out.logits.float()
    ce = F.cross_entropy(logits.reshape(-1, 64), y.reshape(-1))
    z = torch.logsumexp(logits, dim=-1)  # log Z per position
    torch.testing.assert_close(out.lm_loss, ce)
    torch.testing.assert_close(out.loss, ce + w * (z ** 2).mean())
    assert out.loss > out.lm_loss  # log Z != 0 at init, so the penalty is visible


def test_mtp_zero_heads_is_the_plain_model():
    plain, k0 = model(0), model(0, mtp_heads=0)
    assert len(k0.mtp) == 0
    sd_plain, sd_k0 = plain.state_dict(), k0.state_dict()
    assert sd_plain.keys() == sd_k0.keys()
    for key in sd_plain:
        assert torch.equal(sd_plain[key], sd_k0[key])
    x, y = batch()
    a, b = plain(x, y), k0(x, y)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.loss, b.loss)
    assert torch.equal(b.loss, b.lm_loss)


def test_mtp_heads_add_their_loss_but_leave_next_token_predictions_alone():
    k, w = 2, 0.5
    plain, mtp = model(0), model(0, mtp_heads=k, mtp_weight=w)
    # Heads are registered (and initialized) after the trunk: the trunk is the plain model's.
    trunk = {n: t for n, t in mtp.state_dict().items() if not n.startswith("mtp.")}
    assert trunk.keys() == plain.state_dict().keys()
    for n, t in trunk.items():
        assert torch.equal(t, plain.state_dict()[n])
    real = sum(p.numel() for p in mtp.parameters())
    assert count_params(mtp.spec)["total"] == real
    x, y = batch()
    out, ref = mtp(x, y), plain(x, y)
    assert torch.equal(out.logits, ref.logits)
    torch.testing.assert_close(out.lm_loss, ref.loss)  # reported next-token loss is comparable
    h = mtp.hidden_states(x)
    extra = sum(F.cross_entropy(mtp.unembed(mtp.mtp[j - 1](h[:, :-j])).reshape(-1, 64),
                                y[:, j:].reshape(-1)) for j in range(1, k + 1))
    torch.testing.assert_close(out.loss, out.lm_loss + w * extra / k)  # lambda * mean over depths
    # Evaluation reads next-token logits only: the same val_loss as the plain model.
    import numpy as np

    tokens = np.random.default_rng(0).integers(0, 64, 200).astype(np.uint16)
    windows = [(s, 12) for s in range(0, 180, 12)]
    lengths = np.ones(64, dtype=np.int64)
    ev = [evaluate(mm, tokens, windows, lengths, torch.device("cpu"), 4) for mm in (mtp, plain)]
    assert ev[0]["val_loss"] == pytest.approx(ev[1]["val_loss"], rel=1e-6)


def test_mtp_head_k_predicts_the_token_k_plus_1_ahead_position_by_position():
    """Written from the paper's definition on the raw token stream w (no shifted targets): the
    head k state at position t is scored against w[t + 1 + k], for every t that has one."""
    k, wt = 2, 1.0
    m = model(0, mtp_heads=k, mtp_weight=wt)
    g = torch.Generator().manual_seed(3)
    w = torch.randint(0, 64, (2, 13), generator=g)  # (B, T + 1)
    x, T = w[:, :-1], 12
    out = m(x, w[:, 1:])
    h = m.hidden_states(x)  # (B, T, d)
    nll = []
    for j in range(1, k + 1):
        terms = [F.cross_entropy(m.unembed(m.mtp[j - 1](h[:, t])), w[:, t + 1 + j], reduction="none")
                 for t in range(T) if t + 1 + j <= T]
        assert len(terms) == T - j  # the last j positions have no token that far ahead
        nll.append(torch.stack(terms).mean())
    torch.testing.assert_close(out.loss - out.lm_loss, wt * sum(nll) / k)


def test_mtp_total_weight_does_not_grow_with_the_head_count():
    """DeepSeek-V3: L = L_main + lambda * mean_k L_k. Force every head to the same loss (all its
    weights zero: uniform logits, loss log V) and the auxiliary term is lambda * log V for any k."""
    w = 0.3
    x, y = batch()
    extras = []
    for k in (1, 2, 4):
        m = model(0, mtp_heads=k, mtp_weight=w)
        with torch.no_grad():
            for head in m.mtp:
                head[1].weight.zero_()
        out = m(x, y)
        extras.append((out.loss - out.lm_loss).item())
    assert extras == pytest.approx([w * math.log(64)] * 3, rel=1e-5)


def test_reordered_block_matches_its_formula_on_a_hand_example():
    s = spec(norm="rmsnorm", norm_pos="reordered", bias=False, d_model=4, n_heads=1, n_kv_heads=1,
             d_ff=8)
    torch.manual_seed(0)
    block = ReorderedBlock(s, norm_factory(s))
    with torch.no_grad():
        block.norm1.weight.copy_(torch.tensor([1.0, 2.0, 0.5, -1.0]))
        block.norm2.weight.copy_(torch.tensor([0.25, 1.0, 3.0, 1.0]))
    x = torch.tensor([[[1.0, -2.0, 0.5, 3.0], [0.0, 1.0, -1.0, 2.0], [4.0, 0.0, 1.0, -1.0]]])
    ctx = AttnContext()

    eps = 1e-6 * 0.02 ** 2  # min(norm.eps, OLMo 2's 1e-6) * init_std^2 (blocks.output_norm_eps)

    def rms(v, g):  # written out: v / sqrt(mean(v^2) + eps) * g
        return v / torch.sqrt((v ** 2).mean(-1, keepdim=True) + eps) * g

    h = x + rms(block.attn(x, ctx), block.norm1.weight)  # norm on the sublayer output, then add
    want = h + rms(block.ffn(h), block.norm2.weight)
    torch.testing.assert_close(block(x, ctx), want)
    # and the sublayers read the raw residual stream (no norm in front of them)
    assert not torch.allclose(block(x, ctx), x + block.norm1(block.attn(block.norm1(x), ctx)))


@pytest.mark.parametrize("d_model", [128, 384])
def test_reordered_block0_output_norms_are_not_eps_limited_at_init(d_model):
    """Block 0's sublayers read the raw embeddings (RMS 0.02), so their outputs are tiny at init
    (attention mean square ~1e-8 at d=128). With eps 1e-5 the norm returned RMS 0.03 instead of
    ~1 (measured), so block 0 started nearly off; now both normed outputs are near unit RMS."""
    torch.manual_seed(0)
    m = build_model(spec(norm="rmsnorm", norm_pos="reordered", bias=False, d_model=d_model,
                         n_heads=4, n_kv_heads=4, d_ff=4 * d_model, n_layers=4, vocab_size=256,
                         max_seq_len=128)).eval()
    idx = torch.randint(0, 256, (4, 128))
    with torch.no_grad():
        x = m.pos.add_to_embeddings(m.tok_emb(idx))
        blk = m.blocks[0]
        a = blk.attn(x, m.pos.context(128, x.device, x.dtype))
        f = blk.ffn(x + blk.norm1(a))
        assert a.pow(2).mean() < 1e-5  # the regime: raw output far below norm.eps
        for raw, norm in ((a, blk.norm1), (f, blk.norm2)):
            assert norm(raw).pow(2).mean().sqrt() > 0.8


def test_reordered_model_has_a_final_norm_and_trains_a_step():
    m = model(0, norm="rmsnorm", norm_pos="reordered")
    assert not isinstance(m.final_norm, torch.nn.Identity)
    x, y = batch()
    m(x, y).loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


def test_act_clamp_bounds_the_gated_activation_and_needs_a_gated_ffn():
    c = 0.05
    m = model(0, act="swiglu", act_clamp=c)
    with torch.no_grad():
        m.blocks[0].ffn.gate_up.weight.mul_(100.0)
    x = torch.randn(2, 5, 16)
    h = m.blocks[0].ffn.hidden(x)
    assert h.abs().max() <= c and (h.abs() == c).any()
    with pytest.raises(ConfigError, match="act_clamp"):
        spec(act="gelu", act_clamp=1.0)


def test_emb_scale_multiplies_token_embeddings_by_sqrt_d():
    m = model(0, emb_scale=True, pos="nope")
    seen = {}
    m.blocks[0].register_forward_pre_hook(lambda mod, args: seen.update(x=args[0]))
    x, _ = batch()
    m(x)
    torch.testing.assert_close(seen["x"], m.tok_emb(x) * math.sqrt(16))


@pytest.mark.parametrize("scaled", [True, False])
def test_depth_scaled_init_scales_residual_output_projections(scaled):
    L, std = 8, 0.02
    m = model(0, n_layers=L, d_model=64, d_ff=256, n_heads=2, n_kv_heads=2, depth_scaled_init=scaled)
    outs = torch.cat([torch.cat([b.attn.proj.weight.flatten(), b.ffn.down.weight.flatten()])
                      for b in m.blocks])
    ins = torch.cat([b.attn.qkv.weight.flatten() for b in m.blocks])
    want = std / math.sqrt(2 * L) if scaled else std
    assert outs.std().item() == pytest.approx(want, rel=0.05)
    assert ins.std().item() == pytest.approx(std, rel=0.05)


def test_invalid_stability_values_are_refused():
    for kw in (dict(z_loss=-1.0), dict(mtp_weight=-0.1), dict(logit_softcap=0.0),
               dict(attn_softcap=-2.0), dict(mtp_heads=-1)):
        with pytest.raises(ConfigError):
            spec(**kw)
    assert dataclasses.replace(spec(), z_loss=1e-4).z_loss == 1e-4
