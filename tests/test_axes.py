"""The declared options, Hydra's config groups, `ablate axes --json`, presets and bad input agree
with DESIGN.md."""

from __future__ import annotations

import json

import pytest
import torch

from ablate.config.schema import AXES
from ablate.model import options
from conftest import TINY, compose, find_run_dirs, invoke_ablate, run_ablate

DESIGN = {  # DESIGN.md's axes table: option names are part of the interface
    "norm": {"layernorm", "rmsnorm", "dyt"}, "norm_pos": {"pre", "post", "sandwich", "reordered"},
    "act": {"relu", "gelu", "silu", "swiglu", "geglu", "reglu"},
    "pos": {"learned", "sinusoidal", "rope", "alibi", "nope"}, "attn": {"mha", "gqa", "mqa", "mla"},
    "ffn": {"dense", "moe"},
    "tie": {"tied", "untied"}, "bias": {"on", "off"}, "dropout": {"off", "on"}, "qk_norm": {"off", "on"},
    "param": {"sp", "mup", "completep"}, "optim": {"adamw", "muon"},
}


def hydra_group_options(group: str) -> list[str]:
    """The options Hydra finds for a config group, as `norm=...` resolves them."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from ablate.config.axes import CONF_DIR
    from ablate.config.schema import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return GlobalHydra.instance().config_loader().get_group_options(group)
    finally:
        GlobalHydra.instance().clear()


def test_declarations_config_groups_and_axes_listing_agree():
    r = run_ablate("axes", "--json")
    assert r.returncode == 0, r.stderr
    listing = {row["group"]: row for row in json.loads(r.stdout)}
    assert tuple(options.AXES) == AXES == tuple(DESIGN)
    for axis in AXES:
        declared = options.names(axis)
        assert set(declared) == set(hydra_group_options(axis)) == set(listing[axis]["options"]) \
            == DESIGN[axis], axis
        assert listing[axis]["axis"] is True
    defaults = {"norm": "layernorm", "norm_pos": "pre", "act": "gelu", "pos": "learned", "attn": "mha",
                "ffn": "dense", "tie": "tied", "bias": "on", "dropout": "off", "qk_norm": "off", "param": "sp",
                "optim": "adamw", "arch": "gpt2"}
    assert {g: listing[g]["default"] for g in defaults} == defaults
    assert set(listing["arch"]["options"]) >= {"gpt2", "llama", "vaswani"}


def test_every_declared_implementation_loads_as_its_axis_expects():
    """A built-in's class is named by its path (imported on first use): a typo fails here."""
    from torch import nn

    from ablate.model.blocks import Block
    from ablate.model.component import Sublayer
    from ablate.model.positions import Positional
    from ablate.model.spec import ModelSpec

    expected = {"norm": nn.Module, "norm_pos": Block, "pos": Positional}
    spec = ModelSpec(vocab_size=64, d_model=32, n_layers=2, n_heads=8, n_kv_heads=8, d_ff=64, max_seq_len=16)
    for axis in AXES:
        for option in options.declared(axis):
            impl = option.load()
            if axis in expected:
                assert issubclass(impl, expected[axis]), option
            elif axis == "act":
                assert callable(impl), option
            elif axis in ("attn", "ffn"):  # components: a module class or factory of Sublayers
                module = impl(spec, 1)
                assert isinstance(module, nn.Module) and isinstance(module, Sublayer), option
                if axis == "attn":
                    assert option.n_kv_heads(8, 4) in (1, 2, 8), option
            elif axis == "param":
                assert isinstance(impl, type), option
            elif axis == "optim":
                assert issubclass(impl, torch.optim.Optimizer), option
            else:
                assert isinstance(impl, bool), option


def test_every_option_composes_and_builds_a_spec():
    from ablate.model.spec import ModelSpec

    for axis in AXES:
        for option in options.names(axis):
            cfg = compose([f"{axis}={option}"])
            assert cfg[axis].name == option
            ModelSpec.from_config(cfg)


PRESETS = {
    "gpt2": dict(norm="layernorm", norm_pos="pre", act="gelu", pos="learned", attn="mha", ffn="dense", tie="tied",
                 bias="on", dropout="off", qk_norm="off", param="sp", optim="adamw"),
    "llama": dict(norm="rmsnorm", norm_pos="pre", act="swiglu", pos="rope", attn="gqa", ffn="dense", tie="untied",
                  bias="off", dropout="off", qk_norm="off", param="sp", optim="adamw"),
    "vaswani": dict(norm="layernorm", norm_pos="post", act="relu", pos="sinusoidal", attn="mha", ffn="dense",
                    tie="tied", bias="on", dropout="on", qk_norm="off", param="sp", optim="adamw"),
}


@pytest.mark.parametrize("arch", list(PRESETS))
def test_presets_compose_to_documented_axes(arch):
    from ablate.config.schema import axis_values
    from ablate.model.spec import ModelSpec

    cfg = compose([f"arch={arch}"])
    assert axis_values(cfg) == PRESETS[arch]
    spec = ModelSpec.from_config(cfg)
    assert spec.emb_scale == (arch == "vaswani")
    assert spec.dropout == (0.1 if arch == "vaswani" else 0.0)
    if arch == "llama":
        # real GQA on the default 4 heads (2 KV heads), neither MHA (4) nor MQA (1)
        assert 1 < spec.n_kv_heads < spec.n_heads and not spec.bias and not spec.tied


def test_command_line_axis_wins_over_preset():
    from ablate.config.schema import axis_values
    from ablate.model.spec import ModelSpec

    cfg = compose(["arch=llama", "norm=layernorm", "dropout=on"])
    assert axis_values(cfg) == {**PRESETS["llama"], "norm": "layernorm", "dropout": "on"}
    cfg = compose(["norm=layernorm", "arch=llama"])  # order on the command line does not matter
    assert cfg.norm.name == "layernorm"
    assert compose(["arch=vaswani", "model.emb_scale=false"]).model.emb_scale is False
    explicit = compose(["arch=llama", "model.n_kv_heads=4", "model.n_heads=8"])  # gqa's own: 2
    assert ModelSpec.from_config(explicit).n_kv_heads == 4
    # a preset's settings of one option apply only while it is chosen: arch=deepseek's MoE with
    # ffn=dense is arch=deepseek_dense's block; its settings still lose to the command line's
    assert ModelSpec.from_config(compose(["arch=deepseek", "ffn=dense"])) == \
        ModelSpec.from_config(compose(["arch=deepseek_dense"]))
    moe = compose(["arch=deepseek", "ffn.router=softmax", "ffn.balance=aux"]).ffn
    assert (moe.name, moe.router, moe.balance, moe.shared) == ("moe", "softmax", "aux", 1)


@pytest.mark.parametrize("args, message", [
    (["norm=batchnorm"], f"Available options in 'norm': {', '.join(sorted(DESIGN['norm']))}"),
    (["attn=gqa", "model.n_heads=6", "model.n_kv_heads=4"],
     "model.n_heads=6 is not divisible by model.n_kv_heads=4"),
    (["pos=rope", "model.d_model=36", "model.n_heads=4"], "pos=rope needs an even head dim"),
])
def test_run_refuses_bad_input_before_training(tmp_path, args, message):
    r = invoke_ablate("run", *TINY, *args, f"out_dir={tmp_path}")  # refused before Hydra starts a job
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert not find_run_dirs(tmp_path) and not any(tmp_path.iterdir())  # no run dir at all
