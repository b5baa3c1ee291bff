"""The configuration a run starts from (conf/ composed by ablate/config/compose.py): with no overrides,
the GPT-2 baseline on every axis, Shakespeare and the byte tokenizer; each baseline option
composes by name."""

from __future__ import annotations

import pytest

from conftest import compose

GPT2_OPTIONS = ["norm=layernorm", "norm_pos=pre", "act=gelu", "pos=learned", "attn=mha",
                "tie=tied", "bias=on", "dropout=off", "qk_norm=off"]


def test_default_config_is_the_gpt2_baseline():
    cfg = compose([])
    assert {a: cfg[a].name for a in ("norm", "norm_pos", "act", "pos", "attn", "tie", "bias",
                                     "dropout", "qk_norm")} == dict(o.split("=") for o in GPT2_OPTIONS)
    assert cfg.data.name == "shakespeare" and cfg.tokenizer.name == "byte"


@pytest.mark.parametrize("override", GPT2_OPTIONS)
def test_each_baseline_option_composes(override):
    group, option = override.split("=")
    assert compose([override])[group].name == option
