"""Sliding-window attention (ablate/model/sliding.py): a query sees the W keys ending at itself on
every path (SDPA's mask, the explicit path diagnostics and coord-check use, FlexAttention's block
mask, decode's ring buffer), with every position option and head sharing, against a masked
softmax written here; W >= T is full attention bit for bit; the ring buffer keeps min(T, W)
positions and its logits equal the band-masked forward's at every position, with a prompt
longer than W, chunks that wrap it and generation far past it."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from ablate.errors import ConfigError
from ablate.model import flex, options
from ablate.model.attention import CausalSelfAttention
from ablate.model.component import kv_layout
from ablate.model.kv_cache import KVCache, LayerCache
from ablate.model.positions import RopeScaling, alibi_slopes, rope_tables
from ablate.model.sliding import attended_keys, check_window, layer_windows
from ablate.model.spec import ModelSpec
from ablate.model.transformer import Transformer

BASE = dict(vocab_size=64, d_model=32, n_heads=4, d_ff=64, max_seq_len=64)
HEAD_SHARING = {"mha": 4, "gqa": 2, "mqa": 1}


pytestmark = pytest.mark.usefixtures("one_thread")


def sharp(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Weights large enough that attention is far from uniform (init's 0.02 is not), so a key
    let in or left out moves the output."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.ndim > 1:
                p.normal_(0, p.shape[-1] ** -0.5)
            else:
                p.add_(0.1 * torch.randn_like(p))
    return module.eval()


def spec_of(n_layers=2, window=None, global_every=None, local_rope_base=None, **fields) -> ModelSpec:
    """A spec with the sliding settings as the config gives them (attn.window, ...)."""
    slide = dict(window=window, global_every=global_every, local_rope_base=local_rope_base)
    return ModelSpec(**{**BASE, "n_layers": n_layers, **fields}, settings={"attn": slide})


def model_of(n_layers=2, **fields) -> Transformer:
    """Built from spec_of(...); `sharp` gives every model of one shape the same weights."""
    return sharp(Transformer(spec_of(n_layers, **fields)))


def layer_of(window, **fields) -> CausalSelfAttention:
    """One attention layer built as the attn option builds it, with `window`."""
    spec = spec_of(1, window, **fields)
    torch.manual_seed(0)  # nn.Linear's own bias init: the same for every window
    return sharp(options.get("attn", spec.attn).build(spec, 0))


def reference_attention(q, k, v, window, q_pos, k_pos, scale, slopes=None, softcap=None):
    """Query by query: softmax over the keys j with q - W < j <= q, of q.k * scale (capped, plus
    ALiBi's slope * (j - i)). q (B, H, T, hd); k, v (B, KV, S, hd); positions as lists."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    out = torch.zeros_like(q)
    for t, i in enumerate(q_pos):
        seen = [s for s, j in enumerate(k_pos) if i - window < j <= i]
        logits = torch.einsum("bhd,bhsd->bhs", q[:, :, t], k[:, :, seen]) * scale
        if softcap is not None:
            logits = softcap * torch.tanh(logits / softcap)
        if slopes is not None:
            logits = logits + slopes[None, :, None] * torch.tensor([k_pos[s] - i for s in seen], dtype=q.dtype)
        out[:, :, t] = torch.einsum("bhs,bhsd->bhd", logits.softmax(-1), v[:, :, seen])
    return out


def projections(attn, ctx, x, offset=0):
    """q (B, H, T, hd), k, v (B, KV, T, hd) of x as the layer makes them (RoPE at its base)."""
    B, T, _ = x.shape
    q, k, v = attn.qkv(x).split(attn.split, dim=-1)
    q = q.view(B, T, attn.n_heads, -1).transpose(1, 2)
    k, v = (t.view(B, T, attn.n_kv_heads, -1).transpose(1, 2) for t in (k, v))
    rope = ctx.local_rope if ctx.local_rope is not None else ctx.rope
    if rope is not None:
        from ablate.model.positions import apply_rope

        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    return q, k, v


PATHS = ["sdpa", "explicit", "softcap", "decode"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("sharing", HEAD_SHARING)
@pytest.mark.parametrize("pos", ["rope", "alibi", "nope"])
def test_each_path_attends_to_the_window_as_a_masked_softmax(pos, sharing, path):
    """1 < W < T: the training forward (SDPA), the explicit path diagnostics and coord-check take,
    soft-capping's, and decoding through the ring buffer in chunks, against the reference."""
    W, T = 3, 11
    attn = layer_of(W, n_kv_heads=HEAD_SHARING[sharing], pos=pos, attn_softcap=2.0 if path == "softcap" else None)
    spec = spec_of(1, W, n_kv_heads=HEAD_SHARING[sharing], pos=pos)
    pos_module = options.get("pos", pos).build(spec)
    x = torch.randn(2, T, spec.d_model)
    ctx = pos_module.context(T, x.device, x.dtype)
    with torch.no_grad():
        q, k, v = projections(attn, ctx, x)
        want = reference_attention(q, k, v, W, list(range(T)), list(range(T)), spec.head_dim ** -0.5,
                                   alibi_slopes(4) if pos == "alibi" else None, attn.softcap)
        want = attn.proj(want.transpose(1, 2).reshape(2, T, -1))
        if path == "decode":
            attn.kv_cache = LayerCache(kv_layout(spec.n_kv_heads, spec.head_dim, W), 2, T, torch.float32, "cpu")
            got, start = [], 0
            for n in (5, 1, 1, 3, 1):  # a prompt past W, steps, a chunk that wraps the ring
                got.append(attn(x[:, start:start + n], pos_module.context(n, x.device, x.dtype, offset=start)))
                start += n
            got = torch.cat(got, dim=1)
            assert attn.kv_cache.k.shape[2] == W
        else:
            attn.record_max_logit = path == "explicit"
            got = attn(x, ctx)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if path == "explicit":  # diagnostics' logit statistics: over the entries in the window only
        rep = spec.n_heads // spec.n_kv_heads
        logits = q @ k.repeat_interleave(rep, 1).transpose(-2, -1) * spec.head_dim ** -0.5  # (B, H, T, T)
        seen = torch.tensor([[0 <= i - j < W for j in range(T)] for i in range(T)])
        torch.testing.assert_close(attn.max_logit, logits[..., seen].max())
        torch.testing.assert_close(attn.mean_abs_logit, logits[..., seen].abs().mean())


def test_the_window_counts_the_query_itself():
    """W keys, no more, no fewer (HF's kv_idx > q_idx - W): the key W - 1 behind a query moves its
    output, the key W behind does not; W = 1 attends to itself only (its own value)."""
    W, T, t = 4, 12, 9
    spec = spec_of(1, n_kv_heads=4, pos="rope")
    ctx = options.get("pos", "rope").build(spec).context(T, "cpu", torch.float32)
    x = torch.randn(1, T, spec.d_model)
    layers = {w: layer_of(w, n_kv_heads=4, pos="rope") for w in (1, W)}  # the same weights
    attn = layers[W]

    def out_at_t(x, window):
        with torch.no_grad():
            return layers[window](x, ctx)[0, t]

    for behind, moves in ((W - 1, True), (W, False)):
        x2 = x.clone()
        x2[0, t - behind] += 1.0
        assert (out_at_t(x2, W) - out_at_t(x, W)).abs().max().item() > 1e-3 if moves else \
            torch.equal(out_at_t(x2, W), out_at_t(x, W))
    with torch.no_grad():
        _, _, v = projections(attn, ctx, x)
        own = attn.proj(v.transpose(1, 2).reshape(1, T, -1))[0, t]
    torch.testing.assert_close(out_at_t(x, 1), own, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope", "alibi", "nope"])
def test_training_logits_differ_past_the_window_and_a_window_of_T_is_full_attention(pos):
    """Positions < W see every key either way; from W on the window hides keys (it reached the
    kernel); W >= T: full causal attention, bit for bit (soft-capping and ALiBi's mask included)."""
    W, T = 5, 16
    fields = dict(pos=pos, n_kv_heads=2, attn_softcap=4.0 if pos == "alibi" else None)
    idx = torch.randint(0, 64, (2, T))
    with torch.no_grad():
        want = model_of(**fields)(idx).logits
        got = model_of(window=W, **fields)(idx).logits
        torch.testing.assert_close(got[:, :W], want[:, :W], rtol=1e-5, atol=1e-5)
        assert ((got[:, W:] - want[:, W:]).abs().amax(dim=-1) > 1e-4).all()
        for wide in (T, T + 7):
            assert torch.equal(model_of(window=wide, **fields)(idx).logits, want)


def band_forward(model: Transformer, idx: torch.Tensor) -> torch.Tensor:
    """The band-masked full forward: every position at once, no cache."""
    return model(idx).logits


@pytest.mark.parametrize("pos, sharing", [("rope", "gqa"), ("alibi", "mha"), ("alibi", "mqa"),
                                          ("learned", "mqa"), ("nope", "gqa"), ("sinusoidal", "mha")])
def test_cached_decoding_far_past_the_window_equals_the_band_masked_forward(pos, sharing):
    """A prompt longer than W, chunks that wrap the ring (each attends over the kept keys and its
    own before it overwrites), then one token at a time to 8 windows: every position's logits
    equal the forward's. Sliding layers keep W positions, the full layer (global_every=3) all."""
    W, chunks = 6, [9, 1, 1, 4, 1, 7, 1, 1, 11] + [1] * 12
    T = sum(chunks)
    model = model_of(n_layers=3, pos=pos, n_kv_heads=HEAD_SHARING[sharing], window=W, global_every=3)
    idx = torch.randint(0, 64, (2, T))
    with torch.no_grad():
        want = band_forward(model, idx)
        cache = KVCache.for_model(model, batch=2, capacity=T)
        got, start = [], 0
        for n in chunks:
            got.append(model.decode(idx[:, start:start + n], cache))
            start += n
    torch.testing.assert_close(torch.cat(got, dim=1), want, rtol=1e-5, atol=1e-5)
    assert [layer.k.shape[2] for layer in cache.layers] == [W, W, T]


def test_a_sliding_cache_stops_growing_at_its_window():
    model = model_of(n_layers=2, n_kv_heads=2, window=8)
    sizes = {cap: KVCache.for_model(model, batch=1, capacity=cap).bytes() for cap in (5, 8, 100, 5000)}
    per_position = 2 * 2 * 2 * 8 * 4  # layers x (k, v) x n_kv_heads x head_dim x fp32 bytes
    assert sizes == {5: 5 * per_position, 8: 8 * per_position, 100: 8 * per_position, 5000: 8 * per_position}
    mixed = model_of(n_layers=2, n_kv_heads=2, window=8, global_every=2)  # layer 1 full
    assert KVCache.for_model(mixed, batch=1, capacity=100).bytes() == (8 + 100) * per_position // 2


def test_a_sliding_cache_refuses_positions_past_its_capacity():
    layer = LayerCache(kv_layout(1, 2, window=3), 1, 5, torch.float32, "cpu")
    layer.append(k=torch.zeros(1, 1, 5, 2), v=torch.zeros(1, 1, 5, 2))
    with pytest.raises(ValueError, match="capacity of 5"):
        layer.append(k=torch.zeros(1, 1, 1, 2), v=torch.zeros(1, 1, 1, 2))


def test_flex_block_mask_of_the_window_matches_the_explicit_band():
    """The CUDA path's band (FlexAttention's eager forward runs on CPU; the compiled kernel is
    the cuda tier's) equals the explicit path's, with GQA, ALiBi and soft-capping."""
    W, T = 5, 16
    q, k, v = torch.randn(2, 4, T, 8), torch.randn(2, 2, T, 8), torch.randn(2, 2, T, 8)
    slopes = alibi_slopes(4)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex warns that it is the slow reference path
        got = flex.flex_attend(q, k, v, 3.0, slopes, compiled=False, window=W)
    want = reference_attention(q, k, v, W, list(range(T)), list(range(T)), 8 ** -0.5, slopes, 3.0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_sliding_layers_rotate_at_the_local_base_and_scaling_stretches_the_global_one():
    """attn.local_rope_base: the sliding layers' RoPE base (Gemma 3); eval's --rope-scaling
    changes the full layers' tables only."""
    model = model_of(n_layers=2, n_kv_heads=4, pos="rope", rope_base=1e6, window=4, global_every=2,
                     local_rope_base=100.0)
    spec = model.spec
    ctx = model.pos.context(10, "cpu", torch.float32)
    for got, base in ((ctx.rope, 1e6), (ctx.local_rope, 100.0)):
        for a, b in zip(got, rope_tables(10, spec.head_dim, base)):
            assert torch.equal(a, b)
    model.pos.scaling = RopeScaling.parse("ntk:4")
    scaled = model.pos.context(10, "cpu", torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(scaled.local_rope, ctx.local_rope))
    assert not torch.equal(scaled.rope[1], ctx.rope[1])
    model.pos.scaling = None
    # the sliding layer takes the local tables, the full one the global: each as a layer given
    # only those tables as its RoPE
    x = torch.randn(1, 10, spec.d_model)
    from ablate.model.positions import AttnContext

    with torch.no_grad():
        for block, tables in ((model.blocks[0], ctx.local_rope), (model.blocks[1], ctx.rope)):
            assert torch.equal(block.attn(x, ctx), block.attn(x, AttnContext(rope=tables)))


def test_layer_pattern_and_accounting():
    """global_every=N: layers N-1, 2N-1, ... full (Gemma 3's 5:1 is 6; Gemma 2's alternation 2);
    a sliding layer attends over min(W, T) keys."""
    assert layer_windows(1024, 6, 12) == [1024] * 5 + [None] + [1024] * 5 + [None]
    assert layer_windows(8, 2, 4) == [8, None, 8, None]
    assert layer_windows(8, None, 3) == [8, 8, 8] and layer_windows(None, None, 2) == [None, None]
    assert [attended_keys(w, 16) for w in (None, 1, 8, 16, 64)] == [16, 1, 8, 16, 16]


@pytest.mark.parametrize("settings, message", [
    (dict(window=0), "attn.window must be a positive integer"),
    (dict(window=-3), "attn.window must be a positive integer"),
    (dict(window=2.5), "attn.window must be a positive integer"),
    (dict(window=True), "attn.window must be a positive integer"),
    (dict(window=8, global_every=0), "attn.global_every must be an integer >= 1"),
    (dict(global_every=2), "attn.global_every=2 needs attn.window"),
    (dict(window=8, global_every=6), "attn.global_every=6 leaves no full layer in a 4-layer model"),
    (dict(window=8, global_every=1), "attn.global_every=1 makes every layer full"),
    (dict(local_rope_base=1e4), "attn.local_rope_base=10000.0 is the RoPE base of sliding layers"),
    (dict(window=8, global_every=2, local_rope_base=1e4, pos="alibi"), "needs pos=rope"),
    (dict(window=8, global_every=2, local_rope_base=0.0), "must be positive"),
    (dict(window=8, local_rope_base=1e4), "leaves pos.base unused"),
])
def test_bad_window_settings_are_refused_in_one_line(settings, message):
    kw = dict(window=None, global_every=None, local_rope_base=None, n_layers=4, pos="rope")
    with pytest.raises(ConfigError, match=message) as e:
        check_window(**{**kw, **settings})
    assert "\n" not in str(e.value)
    check_window(**{**kw, "window": 8, "global_every": 4, "local_rope_base": 1e4})  # 3 slide, 1 full


def test_window_of_the_whole_context_needs_no_mask():
    """Where the window hides nothing the layer takes the causal path (nothing extra computed)."""
    attn = layer_of(8, n_kv_heads=4)
    assert attn._band(8, 8, 0, None, "cpu") is None
    band = attn._band(1, 9, 8, None, "cpu")
    assert band.hidden.tolist() == [[True] + [False] * 8]
    assert math.isclose(band.q_pos.item(), 8)
