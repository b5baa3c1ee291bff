"""The `param` axis's rules (ablate/model/parametrization.py), checked against the formulas of the
`mup` package (MuAdam(W), MuReadout, mup.init.normal_) and of Dey et al. 2025 (CompleteP, alpha = 1)
computed here from the shapes, at several widths and depths; and at the base shape mup and
completep train exactly as sp."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import completed_trainer, loss_curve

from ablate.model.spec import ModelSpec
from ablate.model.transformer import Transformer
from ablate.train.optimizer import set_lr

BASE = ModelSpec(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, d_ff=128, max_seq_len=16,
                 base_width=32, base_depth=2, param="mup")


def at(width: int = 32, depth: int = 2, **kw) -> ModelSpec:
    """The base model's family at another width / depth (d_ff = 4 x width, heads fixed)."""
    return dataclasses.replace(BASE, d_model=width, d_ff=4 * width, n_layers=depth, base_d_ff=None, **kw)


def optimizer_of(model, lr=1e-2, wd=0.1):
    from omegaconf import OmegaConf

    from ablate.train.optimizer import build_optimizer

    cfg = OmegaConf.create(dict(lr=lr, weight_decay=wd, beta1=0.9, beta2=0.95, compile_optimizer=False))
    return build_optimizer(model, cfg, torch.device("cpu"))


def group_of(opt, param):
    return next(g for g in opt.param_groups if any(p is param for p in g["params"]))


# ---- at the base shape: exactly sp --------------------------------------------------------------
def test_mup_trains_exactly_as_sp_at_the_base_shape(tmp_path):
    sp = completed_trainer(tmp_path / "sp")
    mup = completed_trainer(tmp_path / "mup", "param=mup")
    assert loss_curve(mup, grad_norm=True) == loss_curve(sp, grad_norm=True)  # bit for bit


def test_completep_trains_as_sp_without_the_depth_scaled_init_at_the_base_shape(tmp_path):
    sp = completed_trainer(tmp_path / "sp", "model.depth_scaled_init=false")
    completep = completed_trainer(tmp_path / "cp", "param=completep")
    assert loss_curve(completep, grad_norm=True) == loss_curve(sp, grad_norm=True)
    default_sp = completed_trainer(tmp_path / "sp2")  # the 1/sqrt(2L) init does change the curve
    assert loss_curve(default_sp) != loss_curve(completep)


# ---- mup: per hidden matrix, from its own fan-in and the base model's ----------------------------
HIDDEN = {  # hidden matrix -> (its fan-in, the base's) as a function of width w and base width b
    "attn.qkv.weight": lambda w, b: (w, b), "attn.proj.weight": lambda w, b: (w, b),
    "ffn.up.weight": lambda w, b: (w, b), "ffn.down.weight": lambda w, b: (4 * w, 4 * b),
}


@pytest.mark.parametrize("width", [16, 64, 128, 256])
def test_mup_hidden_matrices_init_lr_and_decay_follow_fan_in(width):
    """mup.init.normal_: std / sqrt(fan_in / base_fan_in); MuAdamW (decoupled_wd=False): LR /
    width_mult and weight decay x width_mult, so lr x wd stays the base's."""
    torch.manual_seed(0)
    spec = at(width, depth_scaled_init=False)
    model = Transformer(spec, seed=0)
    lr, wd = 1e-2, 0.1
    opt = optimizer_of(model, lr, wd)
    set_lr(opt, 0.5 * lr)  # a scheduled LR keeps each group's multiplier
    named = dict(model.named_parameters())
    for name, p in named.items():
        suffix = name.split(".", 2)[-1]
        group = group_of(opt, p)
        if suffix in HIDDEN:
            fan_in, base_fan_in = HIDDEN[suffix](width, 32)
            width_mult = fan_in / base_fan_in
            assert model.param_rules[name].fan_in == fan_in == p.shape[1]
            assert p.std().item() == pytest.approx(0.02 / math.sqrt(width_mult), rel=0.08)
            assert group["lr"] == pytest.approx(0.5 * lr / width_mult, rel=1e-12)
            assert group["weight_decay"] == pytest.approx(wd * width_mult, rel=1e-12)
            assert group["lr"] * group["weight_decay"] == pytest.approx(0.5 * lr * wd, rel=1e-12)
        else:  # embeddings, positions, biases, gains: the base LR (and init: embeddings N(0, 0.02))
            assert group["lr"] == 0.5 * lr, name
        if name in ("tok_emb.weight", "pos.emb.weight"):
            assert p.std().item() == pytest.approx(0.02, rel=0.08)


@pytest.mark.parametrize("width", [64, 128])
def test_an_explicit_and_a_gated_ffn_width_take_their_own_fan_in(width):
    """d_ff not 4 x width (a GLU's rounded width): the down projection's multiplier is the base
    model's d_ff over this one's, not the width ratio."""
    spec = dataclasses.replace(at(width), act="swiglu", d_ff=3 * width - 16, base_d_ff=None)
    model = Transformer(spec, seed=0)
    down = model.param_rules["blocks.0.ffn.down.weight"]
    base_d_ff = round((3 * width - 16) * 32 / width)
    assert (down.fan_in, down.base_fan_in) == (3 * width - 16, base_d_ff)
    assert down.lr_mult == pytest.approx(base_d_ff / (3 * width - 16))
    gate_up = model.param_rules["blocks.0.ffn.gate_up.weight"]
    assert gate_up.lr_mult == pytest.approx(32 / width)


@pytest.mark.parametrize("width", [64, 128, 256])
@pytest.mark.parametrize("tied", [True, False])
def test_mup_logits_are_scaled_on_every_path_before_soft_capping(width, tied):
    """MuReadout: the readout's input x base_width / width (LR and init unchanged), wherever
    logits are made: forward, the fused cross-entropy, the MTP heads, decoding; soft-capped after."""
    from ablate.model.kv_cache import KVCache

    spec = at(width, tied=tied, logit_softcap=2.0, mtp_heads=1)
    model = Transformer(spec, seed=0).eval()
    with torch.no_grad():  # a readout large enough for the cap to bite
        model.unembedding().normal_(0, 1.0)
    idx = torch.randint(0, 64, (2, 12))
    h = model.hidden_states(idx)
    raw = F.linear(h, model.unembedding())
    expected = 2.0 * torch.tanh(raw * (32 / width) / 2.0)
    logits = model(idx).logits
    assert torch.allclose(logits, expected, atol=1e-5)
    assert not torch.allclose(logits, 2.0 * torch.tanh(raw / 2.0), atol=1e-3)
    plain = model(idx, idx)
    model.fused_ce = True
    fused = model(idx, idx)
    assert fused.loss.item() == pytest.approx(plain.loss.item(), rel=1e-5)  # MTP head included
    mtp = F.linear(model.mtp[0](h[:, :-1]), model.unembedding()) * (32 / width)
    assert torch.allclose(model.unembed(model.mtp[0](h[:, :-1])), 2.0 * torch.tanh(mtp / 2.0), atol=1e-5)
    cache = KVCache.for_model(model, batch=2, capacity=12)
    assert torch.allclose(model.decode(idx[:, :8], cache), logits[:, :8], atol=1e-5)
    assert torch.allclose(model.decode(idx[:, 8:], cache), logits[:, 8:], atol=1e-5)


def manual_attention(q, k, v, scale):
    scores = (q @ k.transpose(-2, -1)) * scale
    T = q.shape[2]
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("width", [32, 64, 128, 256])
def test_mup_attention_scale_is_one_over_head_dim_matched_at_the_base(width):
    """scale = sqrt(base_head_dim) / head_dim (heads fixed, so head_dim grows with the width):
    1/sqrt(head_dim) at the base; SDPA and the explicit path (diagnostics) agree with it."""
    from ablate.model.positions import AttnContext

    model = Transformer(at(width), seed=0)
    attn = model.blocks[0].attn
    hd, base_hd = width // 4, 32 // 4
    expected = math.sqrt(base_hd) / hd
    assert (attn.scale or hd ** -0.5) == pytest.approx(expected, rel=1e-12)
    q, k, v = (torch.randn(2, 4, 10, hd) for _ in range(3))
    ref = manual_attention(q, k, v, expected)
    assert torch.allclose(attn._attend(q, k, v, AttnContext()), ref, atol=1e-5)
    attn.record_max_logit = True
    assert torch.allclose(attn._attend(q, k, v, AttnContext()), ref, atol=1e-5)
    logits = (q @ k.transpose(-2, -1)) * expected
    causal = ~torch.ones(10, 10, dtype=torch.bool).triu(1)
    assert attn.max_logit.item() == pytest.approx(logits[..., causal].max().item(), rel=1e-5)
    assert attn.mean_abs_logit.item() == pytest.approx(logits[..., causal].abs().mean().item(), rel=1e-5)


# ---- against the mup package itself (recorded by scripts/mup_reference.py) -----------------------
def reference_script():
    """scripts/mup_reference.py as a module: its setting, batches and ablate's side of the check
    (the mup package itself is imported only where the script records the golden file)."""
    import importlib.util

    from conftest import ROOT

    loader = importlib.util.spec_from_file_location("mup_reference", ROOT / "scripts" / "mup_reference.py")
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return module, json.loads(module.GOLDEN.read_text())


@pytest.mark.parametrize("tied", [True, False])
def test_mup_rules_are_the_mup_packages(tied):
    """Per parameter, at width 128 against base 32: mup.init.normal_'s factor on the std,
    MuAdamW's LR and weight-decay multipliers; MuReadout's (MuSharedReadout's) logit multiplier."""
    script, golden = reference_script()
    ref = golden["models"]["tied" if tied else "untied"]
    model = Transformer(script.ablate_spec(tied), seed=0)
    lr, wd = golden["setting"]["lr"], golden["setting"]["weight_decay"]
    opt = optimizer_of(model, lr, wd)
    named = dict(model.named_parameters())
    assert sorted(named) == sorted(ref["params"])
    for name, want in ref["params"].items():
        group = group_of(opt, named[name])
        assert model.param_rules[name].init_mult == pytest.approx(want["init_scale"], rel=1e-6), name
        assert group["lr"] / lr == pytest.approx(want["lr_mult"], rel=1e-12), name
        assert group["weight_decay"] / wd == pytest.approx(want["wd_mult"] or 0.0, rel=1e-12), name
    assert model.logit_mult == pytest.approx(ref["logit_mult"], rel=1e-6)


@pytest.mark.parametrize("tied", [True, False])
def test_mup_trains_as_the_mup_package(tied):
    """Five AdamW steps of ablate's model against MuAdamW steps of the package's model started
    from the same weights: the same losses and, per parameter, the same final norm."""
    script, golden = reference_script()
    ref = golden["models"]["tied" if tied else "untied"]
    losses, norms = script.ablate_trajectory(tied)
    assert losses == pytest.approx(ref["losses"], rel=1e-5)
    assert norms == pytest.approx(ref["final_norms"], rel=2e-4)


# ---- completep: depth -----------------------------------------------------------------------------
@pytest.mark.parametrize("depth", [4, 8])
@pytest.mark.parametrize("norm_pos", ["pre", "post", "sandwich", "reordered"])
def test_completep_scales_branches_eps_and_keeps_the_hidden_lr_at_depth(depth, norm_pos):
    """Dey et al. 2025 at alpha = 1: every block's branches x base_depth / L, the hidden LR's
    depth factor L^(alpha - 1) = 1, AdamW eps x 1 / (width_mult x depth_mult), no 1/sqrt(2L)."""
    width = 64
    spec = at(width, depth, param="completep", norm_pos=norm_pos)
    model = Transformer(spec, seed=0)
    assert [b.branch_multiplier for b in model.blocks] == [pytest.approx(2 / depth)] * depth
    opt = optimizer_of(model)
    assert [g["eps"] for g in opt.param_groups] == [pytest.approx(1e-8 / ((width / 32) * (depth / 2)))] * \
        len(opt.param_groups)
    proj = model.blocks[-1].attn.proj.weight
    assert group_of(opt, proj)["lr"] == pytest.approx(1e-2 * 32 / width)  # mup's, no depth factor
    assert proj.std().item() == pytest.approx(0.02 * math.sqrt(32 / width), rel=0.1)  # no / sqrt(2L)
    gain = model.final_norm.weight if norm_pos != "post" else model.blocks[-1].norm2.weight
    assert group_of(opt, gain)["lr"] == 1e-2  # norms and biases: depth factor 1 at alpha = 1


def test_completep_branch_multiplier_changes_the_residual_sum():
    """The multiplier is applied: x + m * branch, against the same weights with m = 1."""
    spec = at(32, 4, param="completep")
    model = Transformer(spec, seed=0).eval()
    idx = torch.randint(0, 64, (1, 8))
    scaled = model(idx).logits
    for b in model.blocks:
        b.branch_multiplier = 1.0
    assert not torch.allclose(scaled, model(idx).logits)


# ---- the optimizer keeps each group's multiplier through a checkpoint ------------------------------
def test_group_multipliers_survive_a_checkpoint_round_trip():
    from omegaconf import OmegaConf

    from ablate.train.optimizer import restore_implementation

    model = Transformer(at(128), seed=0)
    opt = optimizer_of(model)
    loss = model(torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))).loss
    loss.backward()
    opt.step()
    fresh = optimizer_of(Transformer(at(128), seed=1))
    fresh.load_state_dict(opt.state_dict())
    restore_implementation(fresh, OmegaConf.create(dict(compile_optimizer=False)), torch.device("cpu"))
    set_lr(fresh, 3e-3)
    set_lr(opt, 3e-3)
    assert [g["lr"] for g in fresh.param_groups] == [g["lr"] for g in opt.param_groups]
    assert sorted({g["lr"] for g in fresh.param_groups}) == [pytest.approx(3e-3 / 4), 3e-3]


def test_sp_keeps_its_two_groups():
    """Checkpoints of sp runs (two groups, decay and no_decay) still load."""
    opt = optimizer_of(Transformer(dataclasses.replace(at(128), param="sp"), seed=0))
    assert [g["name"] for g in opt.param_groups] == ["decay", "no_decay"]
    assert [g["lr"] for g in opt.param_groups] == [1e-2, 1e-2]


def test_a_parameter_without_a_role_is_refused_under_mup_only():
    from torch import nn

    from ablate.errors import ConfigError
    from ablate.model.parametrization import param_rules

    model = Transformer(at(64), seed=0)
    model.blocks[0].extra = nn.Parameter(torch.zeros(64, 64))  # a plugin that forgot tag()
    with pytest.raises(ConfigError, match=r"blocks\.0\.extra .* has no role.*param=mup"):
        param_rules(model)
