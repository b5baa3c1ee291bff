"""Multi-head Latent Attention (attn=mla) against DeepSeek-V2's equations (section 2.1), written
out here in float64 from the weight matrices, and its shapes, counts and costs (ablate/model/latent.py)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from ablate.errors import ConfigError
from ablate.model.latent import LatentShape
from ablate.model.mla import MultiHeadLatentAttention
from ablate.model.positions import AttnContext, alibi_bias, alibi_slopes, rope_tables
from ablate.model.spec import ModelSpec

D, H = 32, 4  # head_dim 8


def make_spec(**kw) -> ModelSpec:
    base = dict(vocab_size=64, d_model=D, n_layers=1, n_heads=H, n_kv_heads=H, d_ff=48, max_seq_len=64,
                norm="rmsnorm", pos="rope", bias=False)
    return ModelSpec(**{**base, **kw})


def sharpened(module: torch.nn.Module, std: float = 0.5) -> torch.nn.Module:
    """Large random weights (gains and biases moved off 1 and 0), so attention is far from
    uniform: a wrong softmax scale or a misplaced key cannot hide in an average."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * std if p.ndim > 1 else 1.0 + 0.3 * torch.randn_like(p))
    return module


def rope_ref(x: torch.Tensor, base: float) -> torch.Tensor:
    """RoPE in the half-split layout: dims i and i + r/2 of the vector at position p turn by
    p * base^(-2i/r). x: (T, r)."""
    T, r = x.shape
    half = r // 2
    theta = base ** (-2.0 * torch.arange(half, dtype=torch.float64) / r)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * theta  # (T, r/2)
    a, b = x[:, :half], x[:, half:]
    return torch.cat([a * ang.cos() - b * ang.sin(), a * ang.sin() + b * ang.cos()], dim=-1)


def rms(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-6) * g


def paper_mla(m: MultiHeadLatentAttention, x: torch.Tensor, base: float, scale: float,
              alibi: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V2 eqs. 9-19 for one sequence x (T, d), in float64, head by head; the matrices
    read from the module's documented layout (latent.py). Returns (output (T, d), the attention
    probabilities (H, T, T))."""
    s = m.shape
    f = {name: p.detach().double() for name, p in m.named_parameters()}
    x = x.double()
    T, hd, r, c = x.shape[0], s.head_dim, s.rope_dim, s.kv_rank
    W_DKV, W_KR = f["kv_a.weight"][:c], f["kv_a.weight"][c:]
    W_UK, W_UV = f["kv_b.weight"][:H * hd], f["kv_b.weight"][H * hd:]
    if s.q_rank is None:
        W_Q, q_in = f["q.weight"], x
    else:
        W_Q = f["q_b.weight"]
        q_in = rms(x @ f["q_a.weight"].T + f.get("q_a.bias", 0), f["q_norm.weight"])  # c_q, eq. 12
    W_UQ, W_QR = W_Q[:H * hd], W_Q[H * hd:]
    c_kv = rms(x @ W_DKV.T + f.get("kv_a.bias", torch.zeros(c + r))[:c], f["kv_norm.weight"])  # eq. 9
    k_R = x @ W_KR.T + f.get("kv_a.bias", torch.zeros(c + r))[c:]  # eq. 15 (before RoPE)
    if r:
        k_R = rope_ref(k_R, base)
    slopes = alibi_slopes(H).double()
    outs, probs = [], []
    for h in range(H):
        rows = slice(h * hd, (h + 1) * hd)
        q_C, k_C, v_C = q_in @ W_UQ[rows].T, c_kv @ W_UK[rows].T, c_kv @ W_UV[rows].T  # eqs. 10, 11, 13
        score = q_C @ k_C.T
        if r:
            q_R = rope_ref(q_in @ W_QR[h * r:(h + 1) * r].T, base)  # eq. 14
            score = score + q_R @ k_R.T  # eqs. 16-17: [q_C; q_R] . [k_C; k_R]
        score = score * scale
        dist = torch.arange(T)[None, :] - torch.arange(T)[:, None]  # s - t
        if alibi:
            score = score + slopes[h] * dist
        p = score.masked_fill(dist > 0, float("-inf")).softmax(-1)
        outs.append(p @ v_C)  # eq. 18
        probs.append(p)
    return torch.cat(outs, -1) @ f["proj.weight"].T + f.get("proj.bias", 0), torch.stack(probs)  # eq. 19


def ctx_for(m: MultiHeadLatentAttention, spec: ModelSpec, T: int) -> AttnContext:
    if spec.pos == "alibi":
        return AttnContext(bias=alibi_bias(H, T), alibi_slopes=alibi_slopes(H))
    if spec.pos != "rope":
        return AttnContext()
    return AttnContext(rope=rope_tables(T, m.shape.rope_dim, spec.rope_base, None))


@pytest.mark.parametrize("case", [
    dict(settings={}),  # derived ranks: kv_rank 32, rope_dim 4, plain query
    dict(settings=dict(q_rank=12, kv_rank=10, rope_dim=6), bias=True, rope_base=100.0),
    dict(settings=dict(kv_rank=12), pos="alibi"),  # no rope part: the ALiBi bias on the scores
    dict(settings=dict(q_rank=8), pos="nope"),
])
def test_mla_is_deepseek_v2s_equations(case):
    case = dict(case)
    settings = case.pop("settings")
    spec = make_spec(**case)
    m = sharpened(MultiHeadLatentAttention(spec, **settings)).eval()
    s = m.shape
    assert s.rope_dim == (settings.get("rope_dim", 4) if spec.pos == "rope" else 0)
    T = 24
    x = torch.randn(1, T, D)
    with torch.no_grad():
        ours = m(x, ctx_for(m, spec, T))[0]
    ref, probs = paper_mla(m, x[0], spec.rope_base, 1 / math.sqrt(s.head_dim + s.rope_dim), spec.pos == "alibi")
    # far from uniform over many keys: the late queries put most of their weight on few of their 16+ keys
    assert probs[:, 16:].amax(-1).mean() > 0.5
    torch.testing.assert_close(ours.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    # and the test sees a softmax-scale bug: 1/sqrt(head_dim), the plain-attention habit, differs
    wrong, _ = paper_mla(m, x[0], spec.rope_base, 1 / math.sqrt(s.head_dim), spec.pos == "alibi")
    if s.rope_dim:
        assert (wrong - ref).abs().max() > 100 * 1e-5 * ref.abs().max()


def test_derived_ranks_follow_head_dim_in_deepseek_v2s_proportions():
    """DeepSeek-V2: d_h = 128, d_c = 512 = 4 d_h, d_h^R = 64 = d_h / 2; q_rank null: plain query."""
    s = LatentShape.of(make_spec(d_model=1024, n_heads=8))  # head_dim 128
    assert (s.head_dim, s.kv_rank, s.rope_dim, s.q_rank) == (128, 512, 64, None)
    assert s.cache_width == 576  # DeepSeek-V2's 576 numbers per layer per token
    assert LatentShape.of(make_spec(d_model=24, n_heads=4)).rope_dim == 2  # head_dim 6: 3 is odd, rounded down
    assert LatentShape.of(make_spec(pos="learned")).rope_dim == 0
    assert LatentShape.of(make_spec(), kv_rank=7, q_rank=5, rope_dim=2).cache_width == 9


@pytest.mark.parametrize("settings,bias", [({}, False), (dict(q_rank=12, kv_rank=10, rope_dim=6), True)])
def test_parameters_by_projection_are_the_modules(settings, bias):
    m = MultiHeadLatentAttention(make_spec(bias=bias), **settings)
    built = {name: sum(p.numel() for p in mod.parameters()) for name, mod in m.named_children()
             if any(True for _ in mod.parameters())}
    assert m.shape.projections() == built
    assert m.shape.params() == sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("key,value,message", [
    ("kv_rank", 0, r"attn.kv_rank=0 must be a positive integer or null"),
    ("q_rank", -3, r"attn.q_rank=-3 must be a positive integer or null"),
    ("rope_dim", 0, r"attn.rope_dim=0 must be a positive integer or null"),
    ("rope_dim", 5, r"attn.rope_dim=5 must be even"),
])
def test_bad_ranks_are_refused_in_one_line(key, value, message):
    with pytest.raises(ConfigError, match=message):
        LatentShape.of(make_spec(), **{key: value})


def test_a_rope_dim_without_rope_is_refused():
    with pytest.raises(ConfigError, match=r"attn.rope_dim=8 .* needs pos=rope; with pos=nope"):
        LatentShape.of(make_spec(pos="nope"), rope_dim=8)


def counted_flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("settings", [{}, dict(q_rank=12)])
def test_training_flops_are_the_counted_matmuls(settings):
    """6 x weights + 6 * H * (2 hd + r) * T per token, against torch's FLOP counter over a
    forward and backward pass (it counts the full T x T score matrix, as the convention does);
    the formula's 6 x weights includes the norm gains, which are not matmuls."""
    spec = make_spec()
    m = MultiHeadLatentAttention(spec, **settings)
    T = 16
    x = torch.randn(2, T, D, requires_grad=True)
    ctx = ctx_for(m, spec, T)
    counted = counted_flops(lambda: m(x, ctx).sum().backward()) / (2 * T)
    gains = m.shape.kv_rank + (m.shape.q_rank or 0)
    # the input's own gradient is not a weight's: torch counts dL/dx of the first projections too,
    # which the convention's 6N (2N forward, 4N backward) already holds; so they agree exactly
    assert counted == m.shape.train_flops(T) - 6 * gains


@pytest.mark.parametrize("mode", ["absorbed", "plain"])
def test_decode_flops_are_the_counted_matmuls(mode):
    """One decode step attending to S positions, against torch's FLOP counter."""
    from ablate.model.mla import decode_mode

    spec = make_spec()
    m = MultiHeadLatentAttention(spec).eval()
    S = 20

    class Held:  # a cache already holding S - 1 positions
        length = S - 1

        def append(self, latent):
            return {"latent": torch.cat([torch.randn(1, 1, S - 1, latent.shape[-1]), latent], dim=2)}

    m.kv_cache = Held()
    ctx = AttnContext(rope=tuple(t[-1:] for t in rope_tables(S, m.shape.rope_dim, spec.rope_base, None)))
    with torch.no_grad(), decode_mode(m, mode):
        counted = counted_flops(lambda: m(torch.randn(1, 1, D), ctx))
    assert counted == m.shape.decode_flops(S, absorbed=mode == "absorbed")


@pytest.mark.parametrize("q_rank,bias", [(None, False), (12, True)])
def test_a_layer_equals_hf_deepseek_v3_attention_with_copied_weights(q_rank, bias):
    """HF's DeepseekV3Attention (rope_interleave=False: the half-split layout) given our weights,
    rows reordered to its per-head layout (ablate/hf/weights.py: per_head_rows)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_ds

    from ablate.hf.weights import per_head_rows

    spec = make_spec(bias=bias, rope_base=500.0)
    m = sharpened(MultiHeadLatentAttention(spec, q_rank=q_rank), std=0.3).eval()
    s = m.shape
    config = transformers.DeepseekV3Config(
        hidden_size=D, num_attention_heads=H, num_key_value_heads=H, kv_lora_rank=s.kv_rank, q_lora_rank=q_rank,
        qk_rope_head_dim=s.rope_dim, qk_nope_head_dim=s.head_dim, v_head_dim=s.head_dim, rope_interleave=False,
        attention_bias=bias, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    config._attn_implementation = "eager"
    theirs = hf_ds.DeepseekV3Attention(config, layer_idx=0).eval()
    q_rows, kv_rows = list(per_head_rows(H, (s.head_dim, s.rope_dim))), list(per_head_rows(H, (s.head_dim,) * 2))
    state = {"kv_a_proj_with_mqa.weight": m.kv_a.weight, "kv_a_layernorm.weight": m.kv_norm.weight,
             "kv_b_proj.weight": m.kv_b.weight[kv_rows], "o_proj.weight": m.proj.weight}
    if q_rank is None:
        state["q_proj.weight"] = m.q.weight[q_rows]
    else:
        state.update({"q_a_proj.weight": m.q_a.weight, "q_a_layernorm.weight": m.q_norm.weight,
                      "q_b_proj.weight": m.q_b.weight[q_rows]})
    if bias:
        state.update({"q_a_proj.bias": m.q_a.bias, "kv_a_proj_with_mqa.bias": m.kv_a.bias, "o_proj.bias": m.proj.bias})
    theirs.load_state_dict(state, strict=True)
    T = 12
    x = torch.randn(2, T, D)
    cos_sin = hf_ds.DeepseekV3RotaryEmbedding(config)(x, torch.arange(T)[None])
    causal = torch.full((T, T), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        torch.testing.assert_close(m(x, ctx_for(m, spec, T)), theirs(x, cos_sin, causal)[0], rtol=1e-5, atol=1e-5)
