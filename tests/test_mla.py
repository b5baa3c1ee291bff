"""Multi-head Latent Attention (attn=mla) against DeepSeek-V2's equations (section 2.1), written
out here in float64 from the weight matrices; decoding from its latent cache, absorbed and plain;
its shapes, counts, costs and muP rule (ablate/model/latent.py); its preset and study."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from ablate.model import options
from ablate.model.kv_cache import KVCache, LayerCache
from ablate.model.latent import DECODE_MODES, LatentShape
from ablate.model.mla import MultiHeadLatentAttention
from ablate.model.positions import AttnContext, alibi_slopes
from ablate.model.spec import ModelSpec, kv_cache_bytes_per_token

D, H = 32, 4  # head_dim 8


def make_spec(settings=None, **kw) -> ModelSpec:
    base = dict(vocab_size=64, d_model=D, n_layers=1, n_heads=H, n_kv_heads=H, d_ff=48, max_seq_len=64,
                norm="rmsnorm", pos="rope", bias=False, attn="mla", settings={"attn": settings or {}})
    kw.setdefault("n_kv_heads", kw.get("n_heads", H))  # MLA: every head has its keys and values
    return ModelSpec(**{**base, **kw})


def build(spec: ModelSpec) -> MultiHeadLatentAttention:
    """Layer 0's attention as the model builds it (its settings from the spec)."""
    return options.get("attn", spec.attn).build(spec, 0)


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


def ctx_at(spec: ModelSpec, start: int, T: int) -> AttnContext:
    """What the model's position option gives the layers for T tokens from position `start`."""
    return options.get("pos", spec.pos).build(spec).context(T, torch.device("cpu"), torch.float32, offset=start)


@pytest.mark.parametrize("case", [
    dict(settings={}),  # derived ranks: kv_rank 32, rope_dim 4, plain query
    dict(settings=dict(q_rank=12, kv_rank=10, rope_dim=6), bias=True, rope_base=100.0),
    dict(settings=dict(kv_rank=12), pos="alibi"),  # no rope part: the ALiBi bias on the scores
    dict(settings=dict(q_rank=8), pos="nope"),
])
def test_mla_is_deepseek_v2s_equations(case):
    case = dict(case)
    settings = case.pop("settings")
    spec = make_spec(settings, **case)
    m = sharpened(build(spec)).eval()
    s = m.shape
    assert s.rope_dim == (settings.get("rope_dim", 4) if spec.pos == "rope" else 0)
    T = 24
    x = torch.randn(1, T, D)
    with torch.no_grad():
        ours = m(x, ctx_at(spec, 0, T))[0]
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
    m = build(make_spec(settings, bias=bias))
    built = {name: sum(p.numel() for p in mod.parameters()) for name, mod in m.named_children()
             if any(True for _ in mod.parameters())}
    assert m.shape.projections() == built
    assert m.shape.params() == sum(p.numel() for p in m.parameters())


def counted_flops(fn) -> int:
    """torch's FLOP count of fn, SDPA on its math backend (the counter does not see the fused
    CPU kernel's matmuls)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("settings", [{}, dict(q_rank=12)])
def test_training_flops_are_the_counted_matmuls(settings):
    """6 x weights + 6 * H * (2 hd + r) * T per token, against torch's FLOP counter over a
    forward and backward pass (it counts the full T x T score matrix, as the convention does).
    What the counter sees beside the model's FLOPs: not the norm gains (in the 6 x weights, not
    matmuls), and the values' zero padding to the keys' width (6 * H * r * T: SDPA's fused
    kernels need equal widths)."""
    spec = make_spec(settings)
    m = build(spec)
    s, T = m.shape, 16
    x = torch.randn(2, T, D, requires_grad=True)  # its gradient too: the convention's 6N holds dL/dx
    ctx = ctx_at(spec, 0, T)
    counted = counted_flops(lambda: m(x, ctx).sum().backward()) / (2 * T)
    gains = s.kv_rank + (s.q_rank or 0)
    assert counted == s.train_flops(T) - 6 * gains + 6 * H * s.rope_dim * T


@pytest.mark.parametrize("mode", ["absorbed", "plain"])
def test_decode_flops_are_the_counted_matmuls(mode):
    """One decode step attending to S positions, against torch's FLOP counter (the plain path's
    values padded as in training: 2 * H * r * S more)."""
    spec = make_spec({"decode": mode})
    m = build(spec).eval()
    S = 20

    class Held:  # a cache already holding S - 1 positions
        length = S - 1

        def append(self, latent):
            return {"latent": torch.cat([torch.randn(1, 1, S - 1, latent.shape[-1]), latent], dim=2)}

    m.kv_cache = Held()
    ctx = ctx_at(spec, S - 1, 1)
    with torch.no_grad():
        counted = counted_flops(lambda: m(torch.randn(1, 1, D), ctx))
    padding = 0 if mode == "absorbed" else 2 * H * m.shape.rope_dim * S
    assert counted == m.shape.decode_flops(S, absorbed=mode == "absorbed") + padding


@pytest.mark.parametrize("settings,pos", [({}, "rope"), (dict(q_rank=12, kv_rank=10, rope_dim=6), "rope"),
                                          (dict(kv_rank=12), "alibi")])
def test_decoding_from_the_latent_cache_equals_the_full_forward_pass_and_the_paper(settings, pos):
    """A prefill of 4 positions, then one token per step into the layer's declared cache, which
    holds kv_rank + rope_dim numbers per position: absorbed and plain decoding both give the full
    forward pass, which is the paper's, with attention far from uniform over many keys."""
    spec = make_spec(settings, pos=pos)
    m = sharpened(build(spec)).eval()
    s, T = m.shape, 32
    x = torch.randn(2, T, D)
    layout = options.get("attn", spec.attn).cache_layout(spec, 0)
    assert layout.bytes_per_position(1) == s.kv_rank + s.rope_dim
    with torch.no_grad():
        full = m(x, ctx_at(spec, 0, T))
        for b in range(2):
            ref, probs = paper_mla(m, x[b], spec.rope_base, 1 / math.sqrt(s.qk_dim), pos == "alibi")
            assert probs[:, 16:].amax(-1).mean() > 0.5
            torch.testing.assert_close(full[b].double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
        for mode in DECODE_MODES:
            m.decode = mode
            m.kv_cache = LayerCache(layout, batch=2, capacity=T, dtype=torch.float32, device=torch.device("cpu"))
            steps = [m(x[:, :4], ctx_at(spec, 0, 4))] + [m(x[:, t:t + 1], ctx_at(spec, t, 1)) for t in range(4, T)]
            m.kv_cache = None
            torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5 * full.abs().max().item())


def test_a_models_cache_holds_each_layers_latent_and_rope_key_and_decodes_absorbed_by_default():
    from ablate.model.transformer import build_model

    spec = make_spec(dict(q_rank=12, kv_rank=10, rope_dim=6), n_layers=2, act="swiglu")
    model = build_model(spec, seed=0).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(20.0 if p.ndim == 2 else 1.0)  # sharp attention: std 0.4
    assert {b.attn.decode for b in model.blocks} == {"absorbed"}  # what sample and bench --decode use
    cache = KVCache.for_model(model, batch=2, capacity=12)
    assert [tuple(t.shape) for t in cache.layers[0].tensors.values()] == [(2, 1, 12, 10 + 6)]
    assert cache.bytes() == 2 * 2 * 12 * (10 + 6) * 4 == kv_cache_bytes_per_token(spec, 4) * 2 * 12
    idx = torch.randint(0, spec.vocab_size, (2, 12))
    with torch.no_grad():
        full = model(idx).logits
        steps = [model.decode(idx[:, :3], cache)] + [model.decode(idx[:, t:t + 1], cache) for t in range(3, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5 * full.abs().max().item())


@pytest.mark.parametrize("rope_dim", [None, 4])
def test_under_mup_each_part_of_the_score_and_each_matrix_follows_its_own_width(rope_dim):
    """Width 64 against a base of 32 (head_dim 16 against 8). The content part q_C . k_C takes
    muP's 1/width attention; the rope part the same when rope_dim is derived (it grows with the
    width) and its base scale when rope_dim is fixed. Every matrix gets the fan-in rule: a fixed
    rank is a finite fan-in (sp's init and LR: muP's input-layer rule)."""
    from ablate.model.transformer import Transformer

    settings = {"kv_rank": 24, "rope_dim": rope_dim}
    spec = make_spec(settings, d_model=64, param="mup", base_width=32)
    m = build(spec)
    base_qk = 8 + (4 if rope_dim is None else rope_dim)
    assert m.scale == pytest.approx(base_qk ** -0.5 * 8 / 16)
    rope_scale = base_qk ** -0.5 * (4 / 8 if rope_dim is None else 1.0)
    assert m.scale * m.rope_gain == pytest.approx(rope_scale)
    with torch.device("meta"):
        rules = Transformer(spec).param_rules
    lr = {name.split(".")[3]: rules[name].lr_mult for name in rules if name.startswith("blocks.0.attn.")
          and name.endswith("weight") and rules[name].fan_in is not None}
    assert lr == {"q": 0.5, "kv_a": 0.5, "kv_b": 1.0, "proj": 0.5}  # kv_b reads the fixed kv_rank


def test_the_deepseek_dense_preset_is_the_llama_block_with_mla_and_exports():
    from ablate import hf
    from conftest import compose

    spec = ModelSpec.from_config(compose(["arch=deepseek_dense"]))
    llama = ModelSpec.from_config(compose(["arch=llama"]))
    assert spec.attn == "mla" and LatentShape.for_spec(spec).kv_rank == 4 * spec.head_dim
    assert {k: v for k, v in spec.to_dict().items() if k not in ("attn", "n_kv_heads", "settings")} == \
        {k: v for k, v in llama.to_dict().items() if k not in ("attn", "n_kv_heads", "settings")}
    assert hf.family_for(spec).model_type == "deepseek_v3"


def test_the_equal_kv_bytes_studys_mla_caches_what_gqa_does():
    """conf/study/equal_kv_bytes.yaml: each job composed on the study's preset; MLA's kv_rank +
    rope_dim is GQA's 2 x n_kv_heads x head_dim, MQA's cache is smaller, MHA's larger."""
    from pathlib import Path

    import yaml

    from conftest import compose

    study = yaml.safe_load((Path(__file__).parents[1] / "conf/study/equal_kv_bytes.yaml").read_text())
    preset = [f"{k.removeprefix('override /')}={v}" for d in study["defaults"] for k, v in d.items()]
    kv = {job["name"]: kv_cache_bytes_per_token(ModelSpec.from_config(compose([*preset, *job["overrides"]])))
          for job in study["hydra"]["sweeper"]["jobs"]}
    assert kv["mla"] == kv["gqa"] and kv["mqa"] < kv["gqa"] < kv["mha"]
