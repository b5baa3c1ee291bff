"""conf option files, the registries, `ablate axes --json`, presets and bad input agree with DESIGN.md."""

from __future__ import annotations

import json

import pytest
import yaml

from ablate.axes import conf_dir
from ablate.config import AXES
from ablate.model import options
from ablate.model.blocks import BLOCKS
from ablate.model.ffn import ACTIVATIONS
from ablate.model.norms import NORMS
from ablate.model.positions import POSITIONS
from tests.conftest import TINY, compose, find_run_dirs, run_ablate

REGISTRIES = {"norm": NORMS, "norm_pos": BLOCKS, "act": ACTIVATIONS, "pos": POSITIONS,
              "attn": options.ATTENTION, "tie": options.TIE, "bias": options.BIAS,
              "dropout": options.DROPOUT, "qk_norm": options.QK_NORM}
DESIGN = {  # DESIGN.md's axes table: option names are part of the interface
    "norm": {"layernorm", "rmsnorm"}, "norm_pos": {"pre", "post", "sandwich", "reordered"},
    "act": {"relu", "gelu", "silu", "swiglu", "geglu", "reglu"},
    "pos": {"learned", "sinusoidal", "rope", "alibi", "nope"}, "attn": {"mha", "gqa", "mqa"},
    "tie": {"tied", "untied"}, "bias": {"on", "off"}, "dropout": {"off", "on"}, "qk_norm": {"off", "on"},
}


def conf_options(group: str) -> dict[str, dict]:
    return {p.stem: yaml.safe_load(p.read_text()) for p in (conf_dir() / group).glob("*.yaml")}


def test_conf_files_registries_and_axes_listing_agree():
    r = run_ablate("axes", "--json")
    assert r.returncode == 0, r.stderr
    listing = {row["group"]: row for row in json.loads(r.stdout)}
    assert set(REGISTRIES) == set(AXES)
    for axis, registry in REGISTRIES.items():
        files = conf_options(axis)
        assert set(files) == set(registry.names()) == set(listing[axis]["options"]) == DESIGN[axis], axis
        for option, content in files.items():
            assert str(content["name"]) == option, f"conf/{axis}/{option}.yaml names itself {content['name']}"
        assert listing[axis]["axis"] is True
    defaults = {"norm": "layernorm", "norm_pos": "pre", "act": "gelu", "pos": "learned", "attn": "mha",
                "tie": "tied", "bias": "on", "dropout": "off", "qk_norm": "off", "arch": "gpt2"}
    assert {g: listing[g]["default"] for g in defaults} == defaults
    assert set(listing["arch"]["options"]) >= {"gpt2", "llama", "vaswani"}


def test_torch_free_option_names_equal_registry_keys():
    assert options.NORM_NAMES == tuple(NORMS.names())
    assert options.NORM_POS_NAMES == tuple(BLOCKS.names())
    assert options.ACT_NAMES == tuple(ACTIVATIONS.names())
    assert options.POS_NAMES == tuple(POSITIONS.names())
    assert set(options.GATED_ACTS) == {n for n in ACTIVATIONS if ACTIVATIONS.get(n).gated}


def test_every_option_composes_and_builds_a_spec():
    from ablate.model.spec import ModelSpec

    for axis in AXES:
        for option in conf_options(axis):
            cfg = compose([f"{axis}={option}"])
            assert cfg[axis].name == option
            ModelSpec.from_config(cfg)


PRESETS = {
    "gpt2": dict(norm="layernorm", norm_pos="pre", act="gelu", pos="learned", attn="mha", tie="tied",
                 bias="on", dropout="off", qk_norm="off"),
    "llama": dict(norm="rmsnorm", norm_pos="pre", act="swiglu", pos="rope", attn="gqa", tie="untied",
                  bias="off", dropout="off", qk_norm="off"),
    "vaswani": dict(norm="layernorm", norm_pos="post", act="relu", pos="sinusoidal", attn="mha",
                    tie="tied", bias="on", dropout="on", qk_norm="off"),
}


@pytest.mark.parametrize("arch", list(PRESETS))
def test_presets_compose_to_documented_axes(arch):
    from ablate.config import axis_values
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
    from ablate.config import axis_values
    from ablate.model.spec import ModelSpec

    cfg = compose(["arch=llama", "norm=layernorm", "dropout=on"])
    assert axis_values(cfg) == {**PRESETS["llama"], "norm": "layernorm", "dropout": "on"}
    cfg = compose(["norm=layernorm", "arch=llama"])  # order on the command line does not matter
    assert cfg.norm.name == "layernorm"
    assert compose(["arch=vaswani", "model.emb_scale=false"]).model.emb_scale is False
    explicit = compose(["arch=llama", "model.n_kv_heads=4", "model.n_heads=8"])  # gqa's own: 2
    assert ModelSpec.from_config(explicit).n_kv_heads == 4


@pytest.mark.parametrize("args, message", [
    (["norm=batchnorm"], "Available options in 'norm': layernorm, rmsnorm"),
    (["attn=gqa", "model.n_heads=6", "model.n_kv_heads=4"],
     "model.n_heads=6 is not divisible by model.n_kv_heads=4"),
    (["pos=rope", "model.d_model=36", "model.n_heads=4"], "pos=rope needs an even head dim"),
])
def test_run_refuses_bad_input_before_training(tmp_path, args, message):
    r = run_ablate("run", *TINY, *args, f"out_dir={tmp_path}")
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert not find_run_dirs(tmp_path) and not any(tmp_path.iterdir())  # no run dir at all
