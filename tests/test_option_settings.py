"""An option's own settings (register_option(settings=...)): a typed key of its config group,
checked at compose time, carried by ModelSpec.settings to the option's implementation; and an
option's own init (a module's init_parameters), shown on norm=dyt's alpha0 in every block
layout."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from ablate.errors import ConfigError
from ablate.model import options
from ablate.model.norms import DyT
from ablate.model.roles import Role, param_groups, role_of
from ablate.model.spec import ModelSpec, count_params
from ablate.model.transformer import build_model, built_counts
from ablate.config.axes import group_options
from conftest import PRESET_DEPTH, TINY, compose, find_run_dirs, invoke_ablate, run_ablate

SMALL = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.max_seq_len=32",
         "train.seq_len=16", "logger=none"]


def dyts(model) -> list[DyT]:
    return [m for m in model.modules() if isinstance(m, DyT)]


@pytest.mark.parametrize("norm_pos", options.names("norm_pos"))
@pytest.mark.parametrize("alpha0", [None, 1.0])
def test_alpha0_reaches_every_dyt_in_every_block_layout(norm_pos, alpha0):
    overrides = ["norm=dyt", f"norm_pos={norm_pos}", "qk_norm=on"]
    overrides += [f"norm.alpha0={alpha0}"] if alpha0 else []
    spec = ModelSpec.from_config(compose(SMALL + overrides))
    assert spec.settings.of("norm") == {"alpha0": alpha0 or 0.5}
    torch.manual_seed(0)
    model = build_model(spec)  # refuses a count that differs from the analytic one
    norms = dyts(model)
    per_block = 4 if norm_pos == "sandwich" else 2
    final = 0 if norm_pos == "post" else 1
    assert len(norms) == count_params(spec)["norm"] // (2 * 32 + 1) == 2 * per_block + final
    assert all(n.alpha.item() == (alpha0 or 0.5) for n in norms)
    # alpha: a scalar without weight decay; gamma and beta start at their roles' 1 and 0
    no_decay = {id(p) for p in param_groups(model, 0.1)[1]["params"]}
    assert all(role_of(n.alpha) is Role.SCALAR and id(n.alpha) in no_decay for n in norms)
    assert all(bool((n.weight == 1).all()) and bool((n.bias == 0).all()) for n in norms)
    # qk_norm stays RMSNorm per head (no DyT inside attention)
    assert not any(isinstance(m, DyT) for b in model.blocks for m in b.attn.modules())
    assert built_counts(model) == count_params(spec)


def test_dyt_follows_bias_as_layernorms_beta():
    off = build_model(ModelSpec.from_config(compose(SMALL + ["norm=dyt", "bias=off"])))
    assert all(n.bias is None for n in dyts(off)) and dyts(off)
    on = count_params(ModelSpec.from_config(compose(SMALL + ["norm=dyt"])))["norm"]
    assert on - count_params(off.spec)["norm"] == 32 * len(dyts(off))  # one beta of width d per norm


@pytest.mark.parametrize("arch", group_options("arch"))
def test_dyt_replaces_the_norm_of_every_preset(arch):
    """Every norm of the preset's model is a DyT (beta as the preset's bias), its count exact."""
    cfg = compose(SMALL + [f"arch={arch}", "norm=dyt", "model.n_heads=4", *PRESET_DEPTH.get(arch, [])])  # gqa: 2 KV
    spec = ModelSpec.from_config(cfg)
    model = build_model(spec)
    # QK-norm (axis qk_norm, on in arch=gemma3) is its own RMSNorm per head, not the norm axis's;
    # MLA's latent norms are RMSNorms whatever the norm axis: DeepSeek's, part of its attention
    layer_norms = [m for name, m in model.named_modules() if m.__class__.__name__ in ("LayerNorm", "RMSNorm")
                   and not name.endswith(("q_norm", "k_norm", "attn.kv_norm"))]
    assert cfg.norm.name == "dyt" and dyts(model) and not layer_norms
    assert all((n.bias is not None) == spec.bias for n in dyts(model))


def test_a_spec_carries_settings_generically_and_round_trips():
    spec = ModelSpec.from_config(compose(SMALL + ["norm=dyt", "norm.alpha0=2.0"]))
    as_json = json.loads(json.dumps(spec.to_dict()))
    assert as_json["settings"] == {"norm": {"alpha0": 2.0}}
    assert ModelSpec(**as_json) == spec and hash(ModelSpec(**as_json)) == hash(spec)
    # a variant whose options have no settings serializes as it did before they existed
    assert "settings" not in ModelSpec.from_config(compose(SMALL)).to_dict()
    # declared defaults are filled in: the spec built by hand equals the composed one
    assert ModelSpec(**{**as_json, "settings": {}}).settings.of("norm") == {"alpha0": 0.5}


@pytest.mark.parametrize("norm, settings, message", [
    ("dyt", {"norm": {"alpha": 1.0}}, "norm.alpha is not a setting of norm=dyt; its settings: alpha0"),
    ("layernorm", {"norm": {"alpha0": 1.0}},
     "norm.alpha0 is not a setting of norm=layernorm; its settings: none"),
    ("dyt", {"tie": {"x": 1}}, "settings for tie: no option of that axis takes settings here"),
], ids=["unknown", "another-options", "flag-axis"])
def test_a_spec_refuses_settings_its_options_do_not_declare(norm, settings, message):
    base = ModelSpec.from_config(compose(SMALL)).to_dict()
    with pytest.raises(ConfigError, match=message):
        ModelSpec(**{**base, "norm": norm, "settings": settings})


DYT_KEYS = "(none is close; norm has: alpha0, eps, name)"


@pytest.mark.parametrize("overrides, message", [
    (["norm=dyt", "norm.foo=1"], f"error: unknown config key 'norm.foo' {DYT_KEYS}"),
    (["norm=dyt", "norm.alpha=1"], "error: unknown config key 'norm.alpha' (did you mean norm.alpha0?)"),
    (["norm=layernorm", "norm.alpha0=1"],
     "error: unknown config key 'norm.alpha0': a setting of norm=dyt only"),
    (["norm=dyt", "+norm.foo=1"], f"error: unknown config key 'norm.foo' {DYT_KEYS}"),
    (["norm=dyt", "norm.alpha0=big"], "error: norm.alpha0: Value 'big' of type 'str' could not be converted"),
], ids=["unknown", "typo", "another-options", "appended", "mistyped"])
def test_an_unknown_or_mistyped_setting_is_one_line_before_anything_runs(tmp_path, overrides, message):
    res = invoke_ablate("run", *TINY, *overrides, f"out_dir={tmp_path}")  # refused before Hydra starts a job
    assert res.returncode == 2 and res.stderr.startswith(message), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not any(tmp_path.iterdir())


def test_a_setting_is_shown_by_cfg_job_recorded_and_trained_with(tmp_path):
    shown = run_ablate("run", "norm=dyt", "norm.alpha0=1.0", "logger=none", "--cfg", "job")
    assert shown.returncode == 0 and "norm:\n  name: dyt\n  eps: 1.0e-05\n  alpha0: 1.0\n" in shown.stdout
    headline = run_ablate("inspect", "norm=dyt", "norm.alpha0=1.0", "logger=none").stdout.splitlines()[0]
    assert headline.startswith("norm=dyt ") and headline.endswith(" param=sp optim=adamw norm.alpha0=1.0")
    run_dir = tmp_path / "run"
    res = run_ablate("run", *TINY, "train.steps=2", "norm=dyt", "norm.alpha0=1.0", f"hydra.run.dir={run_dir}")
    assert res.returncode == 0, res.stderr
    assert "alpha0: 1.0" in (run_dir / "config.yaml").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    inspected = json.loads(run_ablate("inspect", *TINY, "norm=dyt", "norm.alpha0=1.0", "--json").stdout)
    assert summary["status"] == "completed" and summary["params"] == inspected["params"]["total"]
    assert inspected["spec"]["settings"] == {"norm": {"alpha0": 1.0}} and find_run_dirs(tmp_path)


def test_an_activation_gets_its_settings_as_keyword_arguments(own_registry):
    options.register_option("act", "leaky", F.leaky_relu, settings={"negative_slope": 0.01})
    spec = ModelSpec(vocab_size=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=64, max_seq_len=16,
                     act="leaky", settings={"act": {"negative_slope": 0.3}})
    x = torch.randn(4, 64)
    torch.testing.assert_close(build_model(spec).blocks[0].ffn.act(x), F.leaky_relu(x, 0.3))


@pytest.mark.parametrize("axis, settings, message", [
    ("tie", {"x": 1}, "tie option 'o' got settings; only the options of norm, norm_pos, act, pos, attn, ffn take"),
    ("norm", {"eps": 1e-6}, "setting 'eps' must be a new identifier"),
    ("norm", {"name": "x"}, "setting 'name' must be a new identifier"),
    ("norm", {"alpha0": None}, "setting 'alpha0' needs a bool, int, float or str default"),
], ids=["flag-axis", "axis-key", "name", "untyped"])
def test_register_option_refuses_settings_it_cannot_type_or_pass(own_registry, axis, settings, message):
    with pytest.raises(ValueError, match=message):
        options.register_option(axis, "o", object(), settings=settings)


def test_a_scalar_without_its_modules_init_is_refused():
    from torch import nn

    from ablate.model.roles import init_weights, tag

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.s = nn.Parameter(torch.empty(1))
            tag(self.s, Role.SCALAR)

    with pytest.raises(RuntimeError, match="Scaled has a Role.SCALAR parameter but no init_parameters"):
        init_weights(Scaled(), 0.02, 1, False, seed=0)


def test_an_own_init_draws_by_seed_and_name_like_the_roles(own_registry):
    """A module's init_parameters draws from init.generator(param): the same (seed, name)
    gives the same values whatever else the variant adds, as the role defaults do."""
    from ablate.model.norms import LayerNorm
    from ablate.model.roles import param_seed

    class NoisyGain(LayerNorm):
        def init_parameters(self, init):
            g = init.generator(self.weight)
            self.weight.copy_(1 + 0.1 * torch.empty(self.weight.shape).normal_(generator=g))

    options.register_option("norm", "noisy", NoisyGain, params=options.get("norm", "layernorm").params)
    base = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, d_ff=64, max_seq_len=16,
                norm="noisy")
    a = build_model(ModelSpec(**base), seed=5)
    b = build_model(ModelSpec(**{**base, "tied": False, "bias": False}), seed=5)
    c = build_model(ModelSpec(**base), seed=6)
    name = "blocks.1.norm2.weight"
    expected = 1 + 0.1 * torch.empty(32).normal_(generator=torch.Generator().manual_seed(param_seed(5, name)))
    torch.testing.assert_close(a.get_parameter(name), expected, rtol=0, atol=0)
    assert torch.equal(a.get_parameter(name), b.get_parameter(name))
    assert not torch.equal(a.get_parameter(name), c.get_parameter(name))


def test_settings_of_any_type_are_typed_by_their_declaration(own_registry):
    """int, float, bool, str and optional settings: a given value is typed as declared (an int for
    a float setting becomes a float), anything else is one line naming the key."""
    from typing import Optional, get_type_hints

    from ablate.model.norms import LayerNorm

    class Knobs(LayerNorm):
        def __init__(self, d, eps=1e-5, bias=True, window=None, scale=1.0, mode="a", on=False):
            super().__init__(d, eps, bias)

    options.register_option("norm", "knobs", Knobs, params=options.get("norm", "layernorm").params,
                            settings={"window": options.setting(None, int), "scale": 1.0, "mode": "a",
                                      "on": False})
    hints = get_type_hints(options.get("norm", "knobs").schema)
    assert hints["window"] == Optional[int] and hints["scale"] is float and hints["mode"] is str
    base = dict(vocab_size=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=64, max_seq_len=16,
                norm="knobs")
    spec = ModelSpec(**base, settings={"norm": {"window": 1024, "scale": 2}})
    assert spec.norm.window == 1024 and type(spec.norm.window) is int
    assert spec.norm.scale == 2.0 and type(spec.norm.scale) is float and spec.norm.mode == "a"
    assert spec.norm == "knobs" and f"norm={spec.norm}" == "norm=knobs"  # it reads as its name
    assert ModelSpec(**base).norm.window is None  # null by default
    for key, value, words in (("window", 1.5, "an integer or null"), ("window", True, "an integer or null"),
                              ("scale", "x", "a number"), ("on", 1, "true or false"), ("mode", None, "a string")):
        with pytest.raises(ConfigError, match=f"^norm.{key}={value!r} must be {words}$"):
            ModelSpec(**base, settings={"norm": {key: value}})
    build_model(spec)  # the settings reach the class as keyword arguments


def test_an_axis_setting_is_every_options_and_reaches_the_typed_config(own_registry, monkeypatch):
    """declare_axis(..., settings=...): a key every option of the axis has, typed as an option's own."""
    import dataclasses
    from typing import Optional, get_type_hints

    from ablate.model.attention import CausalSelfAttention

    class Windowed(CausalSelfAttention):
        def __init__(self, spec, layer, window=None):
            super().__init__(spec, layer)
            self.window = window

    monkeypatch.setitem(options.AXES, "attn", dataclasses.replace(
        options.AXES["attn"], settings={"window": options.setting(None, int)}))
    options.register_option("attn", "windowed", Windowed, params=options.get("attn", "mha").params)
    option = options.get("attn", "windowed")
    assert get_type_hints(option.schema)["window"] == Optional[int] and option.all_settings["window"].optional
    spec = ModelSpec(vocab_size=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, d_ff=64, max_seq_len=16,
                     attn="windowed", settings={"attn": {"window": 8}})
    assert spec.attn.window == 8 and spec.settings.of("attn") == {"window": 8}
    assert [b.attn.window for b in build_model(spec).blocks] == [8, 8]
