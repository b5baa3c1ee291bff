"""Each option against its paper formula, written out independently of the model code."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from ablate.model import options
from ablate.model.attention import CausalSelfAttention
from ablate.model.ffn import build_ffn
from ablate.model.norms import DyT, LayerNorm, RMSNorm
from ablate.model.options import norm_factory
from ablate.model.positions import (alibi_bias, alibi_slopes, apply_rope, rope_tables,
                                    sinusoidal_table)
from ablate.model.spec import ModelSpec
from ablate.model.transformer import Transformer


def make_spec(**kw) -> ModelSpec:
    base = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, d_ff=48, max_seq_len=16)
    return ModelSpec(**{**base, **kw})


def randomize_(module: nn.Module) -> nn.Module:
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.ndim > 1 else 1.0) + (1.0 if p.ndim == 1 else 0.0))
    return module


# ---- norms ---------------------------------------------------------------------------------------
def test_rmsnorm_formula():
    torch.manual_seed(0)
    norm = randomize_(RMSNorm(8, eps=1e-5))
    x = torch.randn(3, 5, 8) * 4 + 1
    expected = x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    torch.testing.assert_close(norm(x), expected)
    assert [n for n, _ in norm.named_parameters()] == ["weight"]  # no beta, no mean


def test_layernorm_formula_with_and_without_beta():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 8) * 4 + 1
    mu, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    for bias in (True, False):
        norm = randomize_(LayerNorm(8, eps=1e-5, bias=bias))
        expected = (x - mu) / torch.sqrt(var + 1e-5) * norm.weight + (norm.bias if bias else 0)
        torch.testing.assert_close(norm(x), expected)
        assert (norm.bias is not None) == bias


def test_dyt_formula_with_and_without_beta():
    """Zhu et al. 2025: y = gamma * tanh(alpha * x) + beta, alpha one scalar; written out in
    float64 NumPy, and alpha's gradient from its derivative sum(gamma * x * (1 - tanh^2))."""
    import numpy as np

    torch.manual_seed(0)
    x = torch.randn(3, 5, 8) * 3
    for bias in (True, False):
        norm = randomize_(DyT(8, bias=bias, alpha0=0.7))
        a, g = norm.alpha.item(), norm.weight.detach().double().numpy()
        b = norm.bias.detach().double().numpy() if bias else 0.0
        t = np.tanh(a * x.double().numpy())
        y = norm(x)
        np.testing.assert_allclose(y.detach().double().numpy(), g * t + b, rtol=1e-5, atol=1e-6)
        y.sum().backward()
        expected = (g * x.double().numpy() * (1 - t ** 2)).sum()
        assert norm.alpha.grad.item() == pytest.approx(expected, rel=1e-4)
        assert norm.alpha.shape == (1,) and (norm.bias is not None) == bias
    assert DyT(8, alpha0=0.7).alpha.item() == pytest.approx(0.7)  # built alone, alpha is alpha0


@pytest.mark.parametrize("norm", options.names("norm"))
def test_norm_computes_in_fp32_for_bf16_inputs(norm):
    torch.manual_seed(0)
    norm = norm_factory(make_spec(norm=norm))(64)
    x = (torch.randn(4, 64) * 100 + 300).to(torch.bfloat16)  # a large mean stresses bf16 stats
    y = norm(x)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, norm(x.float()).to(torch.bfloat16), rtol=0, atol=0)


def test_norm_eps_is_the_configured_one():
    x = torch.full((1, 4), 1e-3)  # mean(x^2) = 1e-6: eps decides the result
    for eps in (1e-6, 1e-2):
        expected = 1e-3 / math.sqrt(1e-6 + eps)
        norm = norm_factory(make_spec(norm="rmsnorm", bias=False), eps=eps)(4)
        torch.testing.assert_close(norm(x), torch.full((1, 4), expected))


# ---- feed-forward --------------------------------------------------------------------------------
def gelu_tanh_formula(x):  # Hendrycks & Gimpel 2016, the approximation GPT-2 uses
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


PLAIN = {"relu": lambda x: torch.maximum(x, torch.zeros_like(x)), "gelu": gelu_tanh_formula,
         "silu": lambda x: x / (1 + torch.exp(-x))}
GLU = {"swiglu": PLAIN["silu"], "geglu": gelu_tanh_formula, "reglu": PLAIN["relu"]}


@pytest.mark.parametrize("act", list(PLAIN))
@pytest.mark.parametrize("bias", [True, False])
def test_plain_ffn_formula(act, bias):
    torch.manual_seed(0)
    ffn = randomize_(build_ffn(make_spec(act=act, bias=bias)))
    x = torch.randn(2, 3, 32)
    h = x @ ffn.up.weight.T + (ffn.up.bias if bias else 0)  # (B, T, d_ff)
    expected = PLAIN[act](h) @ ffn.down.weight.T + (ffn.down.bias if bias else 0)
    torch.testing.assert_close(ffn(x), expected, rtol=1e-4, atol=1e-5)
    assert ffn.up.weight.shape == (48, 32)


@pytest.mark.parametrize("act", list(GLU))
def test_glu_variant_formula(act):
    """Shazeer 2020: FFN_GLU-variant(x) = (act(x W) * (x V)) W2, W and V the rows [gate; up]."""
    torch.manual_seed(0)
    ffn = randomize_(build_ffn(make_spec(act=act, bias=False)))
    W, V = ffn.gate_up.weight[:48], ffn.gate_up.weight[48:]
    x = torch.randn(2, 3, 32)
    expected = (GLU[act](x @ W.T) * (x @ V.T)) @ ffn.down.weight.T
    torch.testing.assert_close(ffn(x), expected, rtol=1e-4, atol=1e-5)


# ---- positions -----------------------------------------------------------------------------------
def test_sinusoidal_table_formula():
    T, d = 12, 10
    table = sinusoidal_table(T, d)
    for p in range(T):
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            assert table[p, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[p, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoidal_is_added_to_embeddings_and_has_no_parameters():
    spec = make_spec(pos="sinusoidal")
    pos = options.get("pos", "sinusoidal").build(spec)
    x = torch.zeros(2, 5, 32)
    # scaled by the token embeddings' init RMS (init_std): the paper's token:position proportion
    scaled = spec.init_std * sinusoidal_table(5, 32)
    torch.testing.assert_close(pos.add_to_embeddings(x), scaled.expand(2, 5, 32))
    assert sum(p.numel() for p in pos.parameters()) == 0


@pytest.mark.parametrize("pos", options.names("pos"))
def test_positions_at_an_offset_are_those_of_the_longer_window(pos):
    """T tokens at offset k get what the last T of a (k + T)-token window get: the embeddings'
    rows k .. k + T - 1, and the attention context's query rows over all k + T keys."""
    spec = make_spec(pos=pos)
    module = options.get("pos", pos).build(spec)
    randomize_(module)
    cpu, T, k = torch.device("cpu"), 5, 3
    x = torch.randn(2, k + T, 32)
    at_k = module.add_to_embeddings(x[:, k:], offset=k)
    torch.testing.assert_close(at_k, module.add_to_embeddings(x)[:, k:])
    at, full = module.context(T, cpu, torch.float32, offset=k), module.context(k + T, cpu, torch.float32)
    if full.rope is not None:
        for part_at, part_full in zip(at.rope, full.rope):
            torch.testing.assert_close(part_at, part_full[k:])
    if full.bias is not None:
        torch.testing.assert_close(at.bias, full.bias[:, k:, :])  # (H, T, k + T)
    assert (at.rope is None, at.bias is None) == (full.rope is None, full.bias is None)


def rope_complex(x: torch.Tensor, pos: int, base: float) -> torch.Tensor:
    """RoFormer eq. 34 in complex form, half-split pairs (x_i, x_{i+d/2}) as x_i + i*x_{i+d/2}."""
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    z = torch.complex(x[..., : d // 2].double(), x[..., d // 2:].double()) * torch.exp(1j * pos * theta)
    return torch.cat([z.real, z.imag], dim=-1).float()


def test_rope_matches_the_complex_rotation():
    torch.manual_seed(0)
    x = torch.randn(1, 1, 8, 16)  # (B, H, T, hd)
    cos, sin = rope_tables(8, 16, base=500.0)
    y = apply_rope(x, cos, sin)
    for p in range(8):
        torch.testing.assert_close(y[0, 0, p], rope_complex(x[0, 0, p], p, 500.0), rtol=1e-5, atol=1e-5)


def test_rope_scores_depend_only_on_the_offset():
    torch.manual_seed(0)
    q, k = torch.randn(16), torch.randn(16)
    T = 40
    cos, sin = rope_tables(T, 16, base=10000.0)
    qs = apply_rope(q.expand(1, 1, T, 16), cos, sin)[0, 0]  # q placed at every position
    ks = apply_rope(k.expand(1, 1, T, 16), cos, sin)[0, 0]
    scores = qs @ ks.T  # (T, T): q at m, k at n
    for offset in (0, 1, 5, 17):
        diag = torch.diagonal(scores, offset=-offset)  # m - n = offset
        torch.testing.assert_close(diag, diag[0].expand_as(diag), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(torch.diagonal(scores, -1)[0], torch.diagonal(scores, -5)[0])


def test_alibi_slopes_paper_values():
    # Press et al.: n heads -> 2^(-8/n), 2^(-16/n), ...; 6 heads: the 4-head slopes + odd 8-head ones
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -i for i in range(1, 9)]))
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([2.0 ** -i for i in (2, 4, 6, 8)]))
    torch.testing.assert_close(alibi_slopes(6), torch.tensor([2.0 ** -i for i in (2, 4, 6, 8, 1, 3)]))
    torch.testing.assert_close(alibi_slopes(12)[:8], torch.tensor([2.0 ** -i for i in range(1, 9)]))
    torch.testing.assert_close(alibi_slopes(12)[8:], torch.tensor([2.0 ** -(i / 2) for i in (1, 3, 5, 7)]))


def test_alibi_bias_values_and_causal_mask():
    bias = alibi_bias(4, 5)  # (H, T, T)
    slopes = alibi_slopes(4)
    for h in range(4):
        for i in range(5):
            for j in range(5):
                if j > i:
                    assert bias[h, i, j] == float("-inf")
                else:
                    assert bias[h, i, j].item() == pytest.approx(-slopes[h].item() * (i - j))


# ---- attention -----------------------------------------------------------------------------------
@pytest.mark.parametrize("n_kv_heads", [2, 1])
@pytest.mark.parametrize("pos", ["nope", "rope", "alibi"])
def test_gqa_equals_mha_with_repeated_kv_heads(n_kv_heads, pos):
    torch.manual_seed(0)
    gqa = randomize_(CausalSelfAttention(make_spec(n_kv_heads=n_kv_heads, pos=pos)))
    mha = CausalSelfAttention(make_spec(n_kv_heads=4, pos=pos))
    d, hd, rep = 32, 8, 4 // n_kv_heads
    q, k, v = gqa.qkv.weight.split([d, n_kv_heads * hd, n_kv_heads * hd])
    qb, kb, vb = gqa.qkv.bias.split([d, n_kv_heads * hd, n_kv_heads * hd])
    # query head h reads KV head h // rep: repeat each KV head's rows rep times
    rep_rows = lambda w: w.view(n_kv_heads, hd, *w.shape[1:]).repeat_interleave(rep, 0).reshape(d, *w.shape[1:])
    with torch.no_grad():
        mha.qkv.weight.copy_(torch.cat([q, rep_rows(k), rep_rows(v)]))
        mha.qkv.bias.copy_(torch.cat([qb, rep_rows(kb), rep_rows(vb)]))
        mha.proj.load_state_dict(gqa.proj.state_dict())
    spec = make_spec(pos=pos)
    ctx = options.get("pos", pos).build(spec).context(10, torch.device("cpu"), torch.float32)
    x = torch.randn(2, 10, 32)
    torch.testing.assert_close(gqa(x, ctx), mha(x, ctx), rtol=1e-5, atol=1e-5)
    assert gqa.qkv.weight.shape[0] == d + 2 * n_kv_heads * hd


def test_attention_matches_explicit_softmax_formula():
    torch.manual_seed(0)
    attn = randomize_(CausalSelfAttention(make_spec(bias=False)))
    x = torch.randn(1, 6, 32)
    q, k, v = (t.view(1, 6, 4, 8).transpose(1, 2) for t in (x @ attn.qkv.weight.T).split(32, -1))
    scores = q @ k.transpose(-1, -2) / math.sqrt(8) + torch.full((6, 6), float("-inf")).triu(1)
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(1, 6, 32) @ attn.proj.weight.T
    torch.testing.assert_close(attn(x, options.get("pos", "nope").build(make_spec()).context(6, None, None)), y,
                               rtol=1e-5, atol=1e-5)


def test_qk_norm_normalizes_each_head():
    """Per-head RMSNorm on q and k: scaling a head's q or k projection changes nothing."""
    torch.manual_seed(0)
    attn = randomize_(CausalSelfAttention(make_spec(qk_norm=True, norm_eps=1e-8)))
    assert attn.q_norm.weight.shape == attn.k_norm.weight.shape == (8,)
    ctx = options.get("pos", "rope").build(make_spec(pos="rope")).context(6, torch.device("cpu"), torch.float32)
    x = torch.randn(2, 6, 32)
    before = attn(x, ctx)
    with torch.no_grad():
        attn.qkv.weight[8:16] *= 7.0  # query head 1
        attn.qkv.bias[8:16] *= 7.0
        attn.qkv.weight[32:40] *= 0.1  # key head 0
        attn.qkv.bias[32:40] *= 0.1
    torch.testing.assert_close(attn(x, ctx), before, rtol=1e-4, atol=1e-5)
    plain = CausalSelfAttention(make_spec(qk_norm=False))
    assert plain.q_norm is None


# ---- norm position: a hand example ---------------------------------------------------------------
class Double(nn.Module):
    def forward(self, x, ctx=None):
        return 2 * x


class PlusOne(nn.Module):
    def forward(self, x):
        return x + 1


def _ln(x):  # unit-gain LayerNorm by hand
    return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)


def _rms(x):
    return x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-5)


@pytest.mark.parametrize("norm_pos, norm, expected", [
    ("pre", "layernorm", lambda x: (lambda y: y + _ln(y) + 1)(x + 2 * _ln(x))),
    ("post", "layernorm", lambda x: (lambda y: _ln(y + y + 1))(_ln(x + 2 * x))),
    ("sandwich", "rmsnorm", lambda x: (lambda y: y + _rms(_rms(y) + 1))(x + _rms(2 * _rms(x)))),
    ("reordered", "rmsnorm", lambda x: (lambda y: y + _rms(y + 1))(x + _rms(2 * x))),
])
def test_norm_position_ordering(norm_pos, norm, expected):
    """attn(x) = 2x, ffn(x) = x + 1: the block's output follows its diagram."""
    spec = make_spec(norm_pos=norm_pos, norm=norm)
    block = options.get("norm_pos", norm_pos).build(spec, norm_factory(spec))
    block.attn, block.ffn = Double(), PlusOne()
    x = torch.tensor([[[1.0, -2.0, 0.5, 3.0] * 8]])
    torch.testing.assert_close(block(x, None), expected(x))


class Zero(nn.Module):
    def forward(self, x, ctx=None):
        return torch.zeros_like(x)


@pytest.mark.parametrize("norm_pos", options.names("norm_pos"))
def test_every_block_scales_its_branches_by_the_multiplier(norm_pos):
    """At branch_multiplier 0 no sublayer reaches the block's output (it is the same with
    sublayers that output nothing); at 1 they do."""
    spec = make_spec(norm_pos=norm_pos)
    block = randomize_(options.get("norm_pos", norm_pos).build(spec, norm_factory(spec)))
    x = torch.randn(2, 4, 32)
    outputs = {}
    for m in (0.0, 1.0):
        for sub in ("zero", "active"):
            block.attn, block.ffn = (Zero(), Zero()) if sub == "zero" else (Double(), PlusOne())
            block.branch_multiplier = m
            outputs[m, sub] = block(x, None)
    torch.testing.assert_close(outputs[0.0, "active"], outputs[0.0, "zero"])
    assert not torch.allclose(outputs[1.0, "active"], outputs[1.0, "zero"])


def test_pre_norm_branches_are_scaled_by_the_multiplier():
    spec = make_spec(norm_pos="pre")
    block = options.get("norm_pos", "pre").build(spec, norm_factory(spec))
    block.attn, block.ffn, block.branch_multiplier = Double(), PlusOne(), 0.5
    x = torch.tensor([[[1.0, -2.0, 0.5, 3.0] * 8]])
    y = x + 0.5 * 2 * _ln(x)
    torch.testing.assert_close(block(x, None), y + 0.5 * (_ln(y) + 1))


def test_only_post_norm_drops_the_final_norm():
    for norm_pos in options.names("norm_pos"):
        model = Transformer(make_spec(norm_pos=norm_pos))
        assert isinstance(model.final_norm, nn.Identity) == (norm_pos == "post")


def test_parallel_block_reads_one_norm():
    spec = make_spec(parallel_block=True)
    block = options.get("norm_pos", "pre").build(spec, norm_factory(spec))
    block.attn, block.ffn = Double(), PlusOne()
    x = torch.tensor([[[1.0, -2.0, 0.5, 3.0] * 8]])
    torch.testing.assert_close(block(x, None), x + 2 * _ln(x) + _ln(x) + 1)


# ---- embeddings, bias, dropout -------------------------------------------------------------------
def test_tied_head_shares_storage_untied_does_not():
    tied = Transformer(make_spec(tied=True))
    assert tied.lm_head is None
    h = torch.randn(1, 3, 32)
    torch.testing.assert_close(tied.unembed(h), h @ tied.tok_emb.weight.T)
    untied = Transformer(make_spec(tied=False))
    assert untied.lm_head.weight.data_ptr() != untied.tok_emb.weight.data_ptr()
    torch.testing.assert_close(untied.unembed(h), h @ untied.lm_head.weight.T)
    assert (sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in tied.parameters())
            == 64 * 32)


def test_tied_head_gradient_reaches_unseen_embedding_rows():
    """Rows of tokens never in the input still get gradient through the (shared) head."""
    model = Transformer(make_spec(tied=True))
    idx = torch.zeros(1, 5, dtype=torch.long)  # only token 0 is ever an input
    model(idx, idx).loss.backward()
    assert model.tok_emb.weight.grad[1:].abs().sum() > 0
    untied = Transformer(make_spec(tied=False))
    untied(idx, idx).loss.backward()
    assert untied.tok_emb.weight.grad[1:].abs().sum() == 0


def test_bias_off_has_no_bias_parameters():
    for norm in ("layernorm", "rmsnorm"):
        model = Transformer(make_spec(bias=False, norm=norm))
        assert not [n for n, _ in model.named_parameters() if n.endswith("bias")]
        assert all(m.bias is None for m in model.modules() if isinstance(m, (nn.Linear, LayerNorm)))
    on = Transformer(make_spec(bias=True))
    assert all(m.bias is not None for m in on.modules() if isinstance(m, nn.Linear) and m is not on.lm_head)


def test_dropout_only_in_train_mode():
    torch.manual_seed(0)
    idx = torch.randint(0, 64, (2, 12))
    model = Transformer(make_spec(dropout=0.1))
    model.train()
    assert not torch.allclose(model(idx).logits, model(idx).logits)
    model.eval()
    torch.testing.assert_close(model(idx).logits, model(idx).logits)
    no_drop = Transformer(make_spec(dropout=0.0))
    no_drop.load_state_dict(model.state_dict())
    no_drop.train()
    torch.testing.assert_close(no_drop(idx).logits, model(idx).logits)  # eval == no dropout


@pytest.mark.parametrize("where", ["attn", "ffn"])
def test_dropout_hits_both_residual_branches(where):
    torch.manual_seed(0)
    spec = make_spec(dropout=0.5)
    block = options.get("norm_pos", "pre").build(spec, norm_factory(spec)).train()
    sub = getattr(block, where)
    x = torch.randn(2, 8, 32)
    ctx = options.get("pos", "learned").build(make_spec()).context(8, torch.device("cpu"), torch.float32)
    out = sub(x, ctx) if where == "attn" else sub(x)
    assert (out == 0).float().mean() > 0.3  # about half the outputs dropped


def test_emb_scale_multiplies_embeddings_by_sqrt_d():
    torch.manual_seed(0)
    plain, scaled = Transformer(make_spec(pos="nope")), Transformer(make_spec(pos="nope", emb_scale=True))
    scaled.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 64, (1, 4))
    # with the blocks removed, the hidden state is the (normed) embedding: compare before the norm
    plain.blocks, scaled.blocks = nn.ModuleList(), nn.ModuleList()
    plain.final_norm = scaled.final_norm = nn.Identity()
    torch.testing.assert_close(scaled.hidden_states(idx), plain.hidden_states(idx) * math.sqrt(32))
