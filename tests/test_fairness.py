"""Every option changes only its axis: built next to the baseline at the same seed, each option
(every axis in `ablate axes`, and the arch presets) differs in size exactly by what `inspect`
reports, starts every tensor both models have (same name and shape) at the same values, and
keeps the signal at init within a stated band of the baseline's.

Your own options are held to the same checks: `ABLATE_TEST_PLUGINS=my_pkg.my_module pytest
tests/test_fairness.py` loads those plugin modules and tests their options beside the built-ins.
"""

from __future__ import annotations

import os

import pytest
import torch

from ablate.config.axes import default_axes, group_options
from ablate.config.schema import AXES
from ablate.model import options
from ablate.model.spec import ModelSpec
from ablate.model.transformer import build_model
from conftest import PRESET_DEPTH, compose

PLUGINS = [m for m in os.environ.get("ABLATE_TEST_PLUGINS", "").split(",") if m]
if PLUGINS:
    from ablate.plugins import load

    load(PLUGINS)
# Tiny dims (4 heads so that attn=gqa has a KV head count, 2 < 4); seq_len within max_seq_len.
DIMS = ["model.d_model=32", "model.n_layers=2", "model.n_heads=4", "model.max_seq_len=64",
        "train.seq_len=32", "logger=none"] + ([f"plugins=[{','.join(PLUGINS)}]"] if PLUGINS else [])
OPTIONS = [(axis, o) for axis in AXES for o in options.names(axis) if o != default_axes()[axis]]
PRESETS = [("arch", o) for o in group_options("arch") if o != "gpt2"]
SEED = 3

# Signal ratios at init (variant RMS / baseline RMS), the bands this test holds every axis
# option to. Measured on these dims: the embedding output (input to block 0) is 0.69 without an
# additive position table (rope, alibi, nope: token embeddings alone, RMS 0.02 vs 0.028 with
# learned positions) and 0.86 for sinusoidal (before its table was scaled: ~25); the head's
# input (after the final norm) and the logits stay within 2%; the residual stream after the last
# block stays within 0.73-1.05 for every option that keeps pre-norm.
BANDS = {"embedding": (0.6, 1.2), "last_block": (0.6, 1.6), "head_input": (0.9, 1.1),
         "logits": (0.9, 1.1)}
# post, sandwich and reordered normalise what they add to (post) or add unit-sized normed
# outputs to the stream (sandwich, reordered): their raw residual stream is 33-66x the pre-norm
# one by construction; what they hand the head (after the final norm) is compared instead.
STREAM_NOT_COMPARABLE = {("norm_pos", "post"), ("norm_pos", "sandwich"), ("norm_pos", "reordered")}
# A norm declared not to normalize (normalizes=False: DyT, ~alpha0 * x near 0) hands the head the
# residual stream's own scale by its definition (DyT: 0.014x LayerNorm's head input and logits):
# those bands hold for normalizing norms; test_norms_declare_whether_they_normalize holds the
# declaration true.
AFTER_FINAL_NORM = ("head_input", "logits")


def build(overrides):
    cfg = compose(DIMS + list(overrides))
    torch.manual_seed(SEED)
    return cfg, build_model(ModelSpec.from_config(cfg)).eval()


@pytest.fixture(scope="module")
def baseline():
    cfg, model = build([])
    return cfg, model, signals(build([])[1])


def signals(model) -> dict[str, float]:
    seen = {}
    model.blocks[0].register_forward_pre_hook(lambda m, args: seen.__setitem__("embedding", args[0]))
    model.blocks[-1].register_forward_hook(lambda m, args, out: seen.__setitem__("last_block", out))
    idx = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        h = model.hidden_states(idx)
        seen["head_input"], seen["logits"] = h, model.unembed(h)
    return {k: v.float().pow(2).mean().sqrt().item() for k, v in seen.items()}


@pytest.mark.parametrize("axis, option", OPTIONS + PRESETS, ids=lambda v: str(v))
def test_option_changes_only_its_axis(baseline, axis, option, capsys):
    from ablate.measure.inspect import inspect_config
    from cli.inspect import _print_report

    _, base, base_signals = baseline
    depth = PRESET_DEPTH.get(option, []) if axis == "arch" else []  # held to a baseline of its depth
    cfg, variant = build([f"{axis}={option}", *depth])
    if depth:
        base = build(depth)[1]
    # 1. the size change is exactly what inspect reports, and it is printed
    real_delta = sum(p.numel() for p in variant.parameters()) - sum(p.numel() for p in base.parameters())
    report = inspect_config(cfg)
    assert report["vs_baseline"]["delta"] == real_delta
    _print_report(report)
    printed = " ".join(capsys.readouterr().out.split())
    assert f"{real_delta:+,} params" in printed
    # 2. every tensor both have (same name and shape) starts equal. A preset may choose another
    # init scheme (arch=vaswani: the paper's xavier); it is held to a baseline with the same one.
    init = init_keys(cfg)
    if init != init_keys(baseline[0]):
        base = build([f"{k}={v}" for k, v in init.items()])[1]
    a, b = base.state_dict(), variant.state_dict()
    common = [k for k in a if k in b and a[k].shape == b[k].shape]
    assert common, "no shared tensors: the comparison below would be empty"
    differ = [k for k in common if not torch.equal(a[k], b[k])]
    assert not differ, f"{axis}={option} changes the init of shared tensors: {differ}"
    # 3. the signal at init stays within the bands (presets change several axes at once)
    if axis == "arch":
        return
    ratios = {k: v / base_signals[k] for k, v in signals(variant).items()}
    normalizes = options.get("norm", cfg.norm.name).normalizes
    for key, (lo, hi) in BANDS.items():
        if key == "last_block" and (axis, option) in STREAM_NOT_COMPARABLE:
            continue
        if key in AFTER_FINAL_NORM and not normalizes:
            continue
        assert lo <= ratios[key] <= hi, f"{axis}={option}: {key} RMS ratio {ratios[key]:.3f}"


@pytest.mark.parametrize("norm", options.names("norm"))
def test_norms_declare_whether_they_normalize(norm):
    """normalizes=True: the output's RMS is the same for an input 10x smaller; False: it is
    about 10x smaller too (DyT is nearly linear near 0), as the bands above assume."""
    cfg, model = build([f"norm={norm}"])
    x = torch.randn(4, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ratio = (model.final_norm(x / 10).pow(2).mean() / model.final_norm(x).pow(2).mean()).sqrt().item()
    declared = options.get("norm", norm).normalizes
    assert ratio == (pytest.approx(1.0, rel=0.01) if declared else pytest.approx(0.1, rel=0.5)), ratio


def init_keys(cfg) -> dict:
    """The model keys that choose how weights are drawn (not which weights exist); the depth
    scaling as the parametrization applies it (param=completep draws without it)."""
    from ablate.model.parametrization import Parametrization

    m = cfg.model
    depth_scaled = Parametrization.of(ModelSpec.from_config(cfg)).depth_scaled_init
    return {"model.init": m.init, "model.init_std": m.init_std,
            "model.depth_scaled_init": str(depth_scaled).lower()}


@pytest.mark.parametrize("init", ["normal", "xavier"])
def test_bias_and_tie_toggles_leave_every_shared_tensor_identical(init):
    """The case that used to fail: removing biases or adding a head shifted every later draw."""
    _, on = build(["bias=on", "tie=tied", f"model.init={init}"])
    for ov in (["bias=off"], ["tie=untied"], ["bias=off", "tie=untied"]):
        _, other = build([*ov, f"model.init={init}"])
        a, b = on.state_dict(), other.state_dict()
        shared = [k for k in a if k in b and a[k].shape == b[k].shape and a[k].ndim == 2]
        assert len(shared) >= 9  # embeddings, positions, and every block's matrices
        assert all(torch.equal(a[k], b[k]) for k in shared)


def test_different_seeds_still_give_different_inits():
    torch.manual_seed(0)
    a = build_model(ModelSpec.from_config(compose(DIMS)))
    torch.manual_seed(1)
    b = build_model(ModelSpec.from_config(compose(DIMS)))
    assert not torch.equal(a.tok_emb.weight, b.tok_emb.weight)
    # and within one model, same-shaped matrices are not copies of each other
    assert not torch.equal(a.blocks[0].attn.qkv.weight, a.blocks[1].attn.qkv.weight)


def first_layer_input_cosine(pos: str) -> float:
    """Mean cosine similarity of block 0's inputs for two different tokens at the same position."""
    cfg = compose(["model=tiny", f"pos={pos}", "logger=none"])
    torch.manual_seed(0)
    m = build_model(ModelSpec.from_config(cfg)).eval()
    g = torch.Generator().manual_seed(0)
    a, b = torch.randint(0, 256, (2, 8, 128), generator=g)
    b = torch.where(a == b, (b + 1) % 256, b)  # different tokens at every position

    def block0_input(idx):
        with torch.no_grad():
            return m.pos.add_to_embeddings(m.tok_emb(idx) * m.emb_multiplier)

    return torch.cosine_similarity(block0_input(a), block0_input(b), dim=-1).mean().item()


def test_sinusoidal_positions_do_not_drown_the_token_signal():
    """The raw sin/cos table (RMS 0.71) on 0.02-RMS embeddings made two tokens at one position
    look alike (cosine 0.999); scaled to the paper's proportion it is 0.36, learned 0.51."""
    learned, sinusoidal = first_layer_input_cosine("learned"), first_layer_input_cosine("sinusoidal")
    assert 0.4 < learned < 0.6  # equal token and position RMS: cosine ~1/2
    assert 0.25 < sinusoidal < 0.45  # position RMS 0.71x the token RMS: ~0.5 / 1.5
    assert abs(sinusoidal - learned) < 0.25
