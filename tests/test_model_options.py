"""Every option of every axis: analytic params == real, causality, a few training steps,
and init / weight decay by role (an axis changes only what it owns)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ablate.model import options
from ablate.model.roles import param_groups, role_of
from ablate.model.spec import ModelSpec, count_params, non_embedding_params
from ablate.model.transformer import Transformer, built_counts

BASE = ModelSpec(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, d_ff=64, max_seq_len=16)
# (axis, option) -> the ModelSpec fields that option sets, for every declared option
SETS = {
    "norm": lambda o: dict(norm=o.name),
    "norm_pos": lambda o: dict(norm_pos=o.name),
    "act": lambda o: dict(act=o.name, d_ff=48 if o.gated else 64),
    "pos": lambda o: dict(pos=o.name),
    "attn": lambda o: dict(attn=o.name, n_kv_heads=o.n_kv_heads(4, 2)),
    "ffn": lambda o: dict(ffn=o.name),
    "tie": lambda o: dict(tied=o.value),
    "bias": lambda o: dict(bias=o.value),
    "dropout": lambda o: dict(dropout=0.1 if o.value else 0.0),
    "qk_norm": lambda o: dict(qk_norm=o.value),
    "param": lambda o: dict(param=o.name),
    "optim": lambda o: {},  # the trainer's axis: the same model under every option
}
VARIANTS = {(axis, o.name): SETS[axis](o) for axis in options.AXES for o in options.declared(axis)}
COMBOS = {  # options interact in the counts: a few mixed variants
    "llama-like": dict(norm="rmsnorm", act="swiglu", d_ff=48, pos="rope", attn="mqa", n_kv_heads=1, tied=False,
                       bias=False),
    "sandwich-layernorm-nobias": dict(norm_pos="sandwich", bias=False, qk_norm=True),
    "parallel": dict(parallel_block=True, act="geglu", d_ff=48),
    "post-untied-sinusoidal": dict(norm_pos="post", tied=False, pos="sinusoidal", emb_scale=True),
}
ALL = {**{f"{a}={o}": kw for (a, o), kw in VARIANTS.items()}, **COMBOS}


def spec_of(kw) -> ModelSpec:
    return dataclasses.replace(BASE, **kw)


def test_every_registered_option_is_covered():
    axes = {a for a, _ in VARIANTS}
    assert axes == {"norm", "norm_pos", "act", "pos", "attn", "ffn", "tie", "bias", "dropout", "qk_norm", "param",
                    "optim"}


@pytest.mark.parametrize("variant", list(ALL))
def test_analytic_params_equal_real(variant):
    spec = spec_of(ALL[variant])
    model = Transformer(spec)
    p = count_params(spec)
    assert p["total"] == sum(t.numel() for t in model.parameters())
    # the breakdown `ablate inspect` prints, module by module
    real = built_counts(model)
    assert p == real
    assert non_embedding_params(spec) == real["attention"] + real["ffn"] + real["norm"]


def test_gated_ffn_is_size_matched_by_default():
    from conftest import compose

    for act in ("gelu", "swiglu"):
        cfg = compose([f"act={act}", "model.d_model=96", "model.ffn_multiple_of=8"])
        spec = ModelSpec.from_config(cfg)
        assert spec.d_ff == (256 if act == "swiglu" else 384)  # 2/3 * 4 * 96 = 256
    gelu = count_params(ModelSpec.from_config(compose(["act=gelu", "model.d_model=96", "model.ffn_multiple_of=8"])))
    swiglu = count_params(ModelSpec.from_config(compose(["act=swiglu", "model.d_model=96", "model.ffn_multiple_of=8"])))
    # weights equal (2 * 96 * 384 == 3 * 96 * 256); only the biases differ, in each of 4 layers
    assert gelu["ffn"] - swiglu["ffn"] == 4 * ((384 + 96) - (2 * 256 + 96))
    explicit = ModelSpec.from_config(compose(["act=swiglu", "model.d_ff=100"]))
    assert explicit.d_ff == 100


@pytest.mark.parametrize("d_model, multiple, bias", [(128, 16, True), (128, 16, False), (96, 8, True),
                                                     (768, 64, True), (200, 32, False), (64, 256, True)])
def test_gated_width_is_the_nearest_in_parameters(d_model, multiple, bias):
    """Among all multiples of model.ffn_multiple_of, the gated d_ff minimises |params - plain|."""
    from ablate.model.spec import ffn_layer_params
    from conftest import compose

    cfg = compose(["act=swiglu", f"model.d_model={d_model}", "model.n_heads=4",
                   f"model.ffn_multiple_of={multiple}", f"bias={'on' if bias else 'off'}"])
    width = ModelSpec.from_config(cfg).d_ff
    assert width % multiple == 0
    plain = ffn_layer_params(d_model, 4 * d_model, False, bias)
    best = min(abs(ffn_layer_params(d_model, w, True, bias) - plain)
               for w in range(multiple, 8 * d_model + multiple, multiple))  # brute force
    assert abs(ffn_layer_params(d_model, width, True, bias) - plain) == best


@pytest.mark.parametrize("pos", options.names("pos"))
def test_causal_mask_holds(pos):
    """Changing a future token never changes earlier logits (and does change its own)."""
    torch.manual_seed(0)
    model = Transformer(spec_of(dict(pos=pos))).eval()
    idx = torch.randint(0, 64, (2, 12))
    changed = idx.clone()
    changed[:, 7] = (idx[:, 7] + 1) % 64
    with torch.no_grad():
        a, b = model(idx).logits, model(changed).logits
    torch.testing.assert_close(a[:, :7], b[:, :7], rtol=0, atol=0)
    assert not torch.allclose(a[:, 7:], b[:, 7:])


@pytest.mark.parametrize("variant", list(ALL))
def test_every_option_trains(variant):
    """A few AdamW steps on a fixed batch: finite loss, falling."""
    torch.manual_seed(0)
    model = Transformer(spec_of(ALL[variant]))
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 64, (4, 17), generator=g)
    losses = []
    for _ in range(20):  # sandwich/reordered start slower: norms on outputs of tiny branches
        loss = model(idx[:, :-1], idx[:, 1:]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-3:]) / 3 < 0.9 * sum(losses[:3]) / 3, losses


# ---- init and weight decay by role ---------------------------------------------------------------
def roles_and_std(spec: ModelSpec) -> dict[str, tuple]:
    torch.manual_seed(0)
    model = Transformer(spec)
    decayed = {id(p) for p in param_groups(model, 0.1)[0]["params"]}
    out = {}
    for name, p in model.named_parameters():
        std = round(p.std().item(), 3) if p.numel() > 1000 else None  # big matrices: std is stable
        out[name] = (role_of(p), id(p) in decayed, std, p.ndim == 1 and bool((p == p.flatten()[0]).all()))
    return out


@pytest.mark.parametrize("change", [dict(bias=False), dict(norm="rmsnorm"), dict(act="swiglu", d_ff=48),
                                    dict(tied=False), dict(qk_norm=True), dict(pos="rope")])
def test_an_axis_changes_only_its_own_parameters(change):
    base = dict(d_model=64, d_ff=128, n_layers=4)
    a, b = roles_and_std(spec_of(base)), roles_and_std(spec_of({**base, **change}))
    shared = set(a) & set(b)
    assert len(shared) > 10
    for name in shared:
        role_a, decay_a, std_a, const_a = a[name]
        role_b, decay_b, std_b, const_b = b[name]
        assert (role_a, decay_a, const_a) == (role_b, decay_b, const_b), name
        if std_a is not None and std_b is not None:
            assert std_b == pytest.approx(std_a, rel=0.1), name


def test_decay_and_init_rules_by_role():
    spec = spec_of(dict(d_model=64, d_ff=256, n_layers=8, tied=False))
    torch.manual_seed(0)
    model = Transformer(spec)
    no_decay = {id(p) for p in param_groups(model, 0.1)[1]["params"]}
    for name, p in model.named_parameters():
        assert (id(p) in no_decay) == (p.ndim == 1), name  # gains and biases only
    # residual output projections: init_std / sqrt(2 * n_layers) (GPT-2)
    assert model.blocks[0].attn.proj.weight.std().item() == pytest.approx(0.02 / 4, rel=0.1)
    assert model.blocks[0].ffn.down.weight.std().item() == pytest.approx(0.02 / 4, rel=0.1)
    assert model.blocks[0].ffn.up.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert model.lm_head.weight.std().item() == pytest.approx(0.02, rel=0.1)
    flat = Transformer(dataclasses.replace(spec, depth_scaled_init=False))
    assert flat.blocks[0].attn.proj.weight.std().item() == pytest.approx(0.02, rel=0.1)


@pytest.mark.parametrize("n_heads, kv_group, n_kv", [
    (4, 4, 2), (6, 4, 2), (8, 4, 2), (12, 4, 3), (14, 4, 2), (16, 4, 4), (32, 4, 8), (9, 4, 3),
    (8, 2, 4), (12, 2, 6), (16, 8, 2), (12, 8, 2),
])
def test_gqa_is_always_grouped_never_mha_or_mqa(n_heads, kv_group, n_kv):
    """n_kv_heads: the largest divisor of n_heads in [2, max(2, n_heads / kv_group)], below n_heads
    (the old n_heads // kv_group made gqa on 4 heads one KV head: MQA)."""
    assert options.gqa_kv_heads(n_heads, kv_group) == n_kv
    assert 1 < n_kv < n_heads and n_heads % n_kv == 0


@pytest.mark.parametrize("n_heads", [1, 2, 3, 7, 13])
def test_gqa_refuses_a_head_count_without_a_group_size(n_heads):
    from ablate.errors import ConfigError

    with pytest.raises(ConfigError, match=f"attn=gqa needs .*model.n_heads={n_heads} has none"):
        options.gqa_kv_heads(n_heads, 4)


@pytest.mark.parametrize("attn, n_kv, fits", [("mha", 2, "gqa"), ("mha", 1, "mqa"), ("mqa", 8, "mha"),
                                               ("mqa", 4, "gqa"), ("gqa", 1, "mqa"), ("gqa", 8, "mha")])
def test_an_explicit_n_kv_heads_must_mean_the_attn_option(attn, n_kv, fits):
    from ablate.errors import ConfigError

    with pytest.raises(ConfigError, match=f"model.n_kv_heads={n_kv} contradicts attn={attn}.*use attn={fits}"):
        options.check_kv_heads(attn, 8, n_kv)
    options.check_kv_heads(fits, 8, n_kv)  # the option it names accepts it


# ---- declared counts: what a plugin's option gets without params=, and with a wrong one -------
def without_declared_count(monkeypatch, axis: str, name: str, **changes) -> None:
    from ablate.model import axis as declarations

    option = options.get(axis, name)
    monkeypatch.setitem(declarations._OPTIONS[axis], name, dataclasses.replace(option, **changes))


@pytest.mark.parametrize("variant", ["norm=layernorm", "norm=rmsnorm", "norm_pos=sandwich", "norm_pos=post",
                                     "pos=learned", "pos=rope", "parallel", "sandwich-layernorm-nobias"])
def test_an_option_without_params_is_counted_on_its_class(monkeypatch, variant):
    """Built-ins declare their count (torch-free); a plugin may leave it out: the class, built on
    the meta device, gives the same numbers."""
    spec = spec_of(ALL[variant])
    declared = count_params(spec)
    for axis, name in (("norm", spec.norm), ("norm_pos", spec.norm_pos), ("pos", spec.pos)):
        without_declared_count(monkeypatch, axis, name, params=None, impl=options.get(axis, name).load())
    assert count_params(spec) == declared == built_counts(Transformer(spec))


def test_a_wrong_declared_count_is_refused_before_training(monkeypatch):
    """summary.json, FLOPs and MFU report the declared count: a model that disagrees is not built."""
    from ablate.errors import ConfigError
    from ablate.model.transformer import build_model

    without_declared_count(monkeypatch, "norm", "rmsnorm", params=lambda spec, d: 2 * d)  # no beta
    with pytest.raises(ConfigError, match=r"analytic parameter count disagrees with the built model: "
                                          r"\{'total': \(19712, 19552\), 'norm': \(320, 160\)\}.*params="):
        build_model(spec_of(dict(norm="rmsnorm")))


@pytest.mark.parametrize("call, message", [
    (("nope", "x", None), "register_option: unknown axis 'nope'; axes: norm, norm_pos, act"),
    (("norm", "x", None, {"gated": True}), "norm option 'x' got 'gated'; norm takes normalizes, params and config keys eps"),
    (("act", "x", None, {"config": {"eps": 1e-6}}), "act option 'x' got 'eps'"),
    (("norm", "rmsnorm", None), "norm: option 'rmsnorm' registered twice"),
])
def test_register_option_refuses_what_its_axis_does_not_take(call, message):
    axis, name, impl, *kw = call
    with pytest.raises(ValueError, match=message):
        options.register_option(axis, name, impl, **(kw[0] if kw else {}))
