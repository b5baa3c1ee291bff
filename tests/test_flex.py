"""The FlexAttention path (ablate/model/flex.py, CUDA only) computes the same attention as the
explicit path; on CPU the model never takes it (FlexAttention has no CPU backward). The CUDA kernels
cannot run here, so the score modification is checked through flex's eager forward on CPU."""

from __future__ import annotations

import warnings

import pytest
import torch

from ablate.model import flex
from ablate.model.attention import CausalSelfAttention
from ablate.model.positions import alibi_bias, alibi_slopes
from ablate.model.spec import ModelSpec


def spec(**kw):
    base = dict(vocab_size=64, d_model=32, n_layers=1, n_heads=4, n_kv_heads=4, d_ff=64, max_seq_len=32)
    return ModelSpec(**{**base, **kw})


@pytest.mark.parametrize("softcap, alibi, n_kv", [(5.0, False, 4), (None, True, 4), (3.0, True, 2)])
def test_flex_score_mod_matches_explicit_attention(softcap, alibi, n_kv):
    torch.manual_seed(0)
    attn = CausalSelfAttention(spec(attn_softcap=softcap, n_kv_heads=n_kv)).eval()
    B, H, T, hd = 2, 4, 16, 8
    q = torch.randn(B, H, T, hd)
    k, v = torch.randn(B, n_kv, T, hd), torch.randn(B, n_kv, T, hd)
    slopes = alibi_slopes(H) if alibi else None
    bias = alibi_bias(H, T) if alibi else None
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex warns that it is the slow reference path
        got = flex.flex_attend(q, k, v, softcap, slopes, compiled=False)
        rep = H // n_kv
        want = attn._explicit(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), bias, 0.0)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_cpu_training_never_takes_the_flex_path(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("flex_attend called on CPU")

    monkeypatch.setattr("ablate.model.attention.flex_attend", boom)
    from ablate.model.transformer import build_model

    model = build_model(spec(pos="alibi", attn_softcap=4.0))
    idx = torch.randint(0, 64, (2, 16))
    out = model(idx, idx)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert not flex.flex_supported(idx.float(), 0.0)


@pytest.mark.parametrize("pos", ["learned", "rope", "alibi"])
@pytest.mark.parametrize("n_kv", [1, 2, 4])
def test_sdpa_path_with_native_gqa_matches_explicit_attention(pos, n_kv):
    """The fast path (SDPA, enable_gqa, ALiBi as a float mask) equals the explicit one."""
    from ablate.model import options

    s = spec(pos=pos, n_kv_heads=n_kv)
    torch.manual_seed(0)
    attn = CausalSelfAttention(s)
    ctx = options.get("pos", pos).build(s).context(16, torch.device("cpu"), torch.float32)
    x = torch.randn(2, 16, 32)
    fast = attn(x, ctx)
    attn.record_max_logit = True  # forces the explicit path
    torch.testing.assert_close(fast, attn(x, ctx), atol=1e-5, rtol=1e-5)
