"""Sliding windows as the reports see them: the settings composed, typed and refused on the
command line; `ablate inspect`'s layers, FLOPs and KV figures at a stated context (checked
against the cache built from the tensors and a count written here); `bench --decode`'s context;
the length reports' note; compare's KV column; W&B tags; a ladder refused at plan time naming
the rung; the presets arch=mistral and arch=gemma3."""

from __future__ import annotations

import pytest
import torch

from conftest import compose, invoke_ablate

from ablate.model.spec import ModelSpec, flops_per_token, kv_cache_bytes, kv_cache_bytes_per_token

GEMMA3 = ["arch=gemma3", "logger=none"]


def test_a_window_composes_as_an_integer_and_reaches_every_layer_by_its_index():
    cfg = compose(["pos=rope", "attn=gqa", "model.n_heads=4", "attn.window=16", "attn.global_every=2",
                   "attn.local_rope_base=500"])
    spec = ModelSpec.from_config(cfg)
    assert (spec.attn.window, spec.attn.global_every, spec.attn.local_rope_base) == (16, 2, 500.0)
    from ablate.model.transformer import Transformer

    with torch.device("meta"):
        model = Transformer(spec)
    assert [b.attn.window for b in model.blocks] == [16, None, 16, None]
    assert model.pos.local_base == 500.0
    # a run without them reads as it always has: nothing in the spec's settings
    assert not ModelSpec.from_config(compose(["pos=rope"])).settings


def test_inspect_shows_each_layer_and_takes_its_kv_figures_at_the_context_it_names():
    from ablate.measure.inspect import inspect_config
    from ablate.model.kv_cache import KVCache
    from ablate.model.transformer import Transformer

    cfg = compose(GEMMA3)
    r = inspect_config(cfg, seq_len=128, batch=3, dtype="fp32")
    spec = ModelSpec(**r["spec"])
    assert spec.n_layers == 6
    assert [x["window"] for x in r["layers"]] == [32] * 5 + [None]
    assert [x["rope_base"] for x in r["layers"]] == [1e4] * 5 + [1e6]
    assert [x["keys"] for x in r["layers"]] == [32] * 5 + [128]
    model = Transformer(spec)
    for context in (20, 32, 128, 200):  # the declared figure against the tensors of a built cache
        built = KVCache.for_model(model, batch=1, capacity=context, dtype=torch.float32).bytes()
        assert kv_cache_bytes(spec, context, 4) == built
        assert kv_cache_bytes_per_token(spec, 4, context) == round(built / context)
    assert r["kv_cache_context"] == 128 and r["kv_cache_bytes"] == 3 * kv_cache_bytes(spec, 128, 4)
    assert [x["kv_bytes"] for x in r["layers"]] == [32 * 512] * 5 + [128 * 512]  # 2 x 2 KV heads x 32 x 4 B
    # 12 * d_attn * min(W, T) per sliding layer: the full model's count less the keys it hides
    full = ModelSpec(**{**r["spec"], "settings": {}})
    hidden = 5 * 12 * spec.n_heads * spec.head_dim * (128 - 32)
    assert flops_per_token(spec, 128) == flops_per_token(full, 128) - hidden == r["flops_per_token"]
    assert flops_per_token(spec, 32) == flops_per_token(full, 32)  # W >= T: full attention's
    out = invoke_ablate("inspect", *GEMMA3, "--seq-len", "128")
    assert out.returncode == 0, out.stderr
    assert "attention by layer, at context 128" in out.stdout and "window 32" in out.stdout
    assert "KV cache (fp32) at context 128" in out.stdout  # the run's precision: fp32 on a CPU


def test_bench_decode_takes_its_kv_figures_at_its_context_and_names_the_pattern():
    from ablate.measure import decode_bench as d
    from ablate.measure.bench_report import decode_table

    cfg = compose(["pos=rope", "attn.window=4", "attn.global_every=2", "model.d_model=32", "model.n_heads=4",
                   "model.n_layers=2", "train.device=cpu", "train.threads=1", "logger=none"])
    r = d.bench_decode(cfg, [2], context=6, new_tokens=3, rounds=1, warmup=1)
    per_position_layer = 2 * 4 * 8 * 4  # K and V x KV heads x head_dim x fp32 bytes
    per_sequence = (4 + 9) * per_position_layer  # the sliding layer keeps 4 of the 9 positions
    assert r["rows"][0]["kv_cache_bytes"] == 2 * per_sequence
    assert r["rows"][0]["kv_cache_bytes_per_token"] == r["kv_cache_formula_bytes_per_token"] == round(per_sequence / 9)
    foot = " ".join(decode_table(r).foot)
    assert "at context 9" in foot and "window 4 on 1 of 2 layers (full: 1)" in foot


def test_the_length_reports_say_what_local_layers_see():
    from pathlib import Path

    from ablate.analysis.groups import Group
    from ablate.analysis.length_eval import window_notes
    from ablate.evaluation.lengths import RunEval, format_run
    from ablate.model.sliding import describe

    spec = ModelSpec.from_config(compose(GEMMA3))
    ev = RunEval(Path("run"), 128, [], attention=describe(spec))
    lines = format_run(ev, "windows")
    assert any(line.strip().startswith("sliding windows: window 32 on 5 of 6 layers (full: 5); sliding "
                                       "layers' RoPE base 10,000; a sliding layer sees at most its window's "
                                       "keys at any length") for line in lines)

    class Run:  # what window_notes reads of a compared run
        def __init__(self, config):
            self.config = config

    groups = [Group([Run({"attn.window": None})], label="baseline"),
              Group([Run({"attn.window": 16, "attn.global_every": 2})], label="attn.global_every=2"),
              Group([Run({"attn.window": 16})], label="attn.window=16")]
    assert window_notes(groups) == [
        "sliding windows in attn.global_every=2 (attn.window=16, attn.global_every=2); attn.window=16: a sliding "
        "layer sees at most its window's keys at any length (only the full layers see the whole context); "
        "--rope-scaling stretches the full layers' RoPE base only"]
    assert window_notes(groups[:1]) == []


def test_rope_scaling_stretches_the_full_layers_only_with_one_base():
    """Without attn.local_rope_base the sliding layers keep pos.base's tables, unscaled."""
    from ablate.model.positions import RopeScaling, rope_tables
    from ablate.model.transformer import Transformer

    spec = ModelSpec.from_config(compose(["pos=rope", "attn.window=8", "attn.global_every=2", "logger=none"]))
    with torch.device("meta"):
        pos = Transformer(spec).pos
    assert pos.context(10, "cpu", torch.float32).local_rope is None  # one base, no scaling: one table
    pos.scaling = RopeScaling.parse("pi:4")
    ctx = pos.context(10, "cpu", torch.float32)
    plain = rope_tables(10, spec.head_dim, spec.rope_base)
    assert all(torch.equal(a, b) for a, b in zip(ctx.local_rope, plain))
    assert not torch.equal(ctx.rope[1], plain[1])


def test_compare_reads_the_kv_cache_at_the_runs_seq_len():
    from ablate.measure.inspect import run_kv_cache_bytes_per_token

    cfg = compose(["pos=rope", "attn.window=16", "train.seq_len=64", "logger=none"])
    spec = ModelSpec.from_config(cfg)
    assert run_kv_cache_bytes_per_token(cfg, "fp32") == kv_cache_bytes(spec, 64, 4) / 64 == 4 * 2 * 128 * 4 // 4


def test_wandb_tags_and_config_carry_the_settings():
    from ablate.run.record import RunInfo
    from ablate.tracking.wandb_sink import wandb_config
    from ablate.train.launch import run_tags

    cfg = compose(["pos=rope", "attn.window=16", "attn.global_every=2", "logger=none"])
    assert run_tags(cfg) == ["pos=rope", "attn.window=16", "attn.global_every=2"]
    config = wandb_config(cfg, "x", RunInfo(params=1))
    assert (config["attn_window"], config["attn_global_every"], config["attn_local_rope_base"]) == (16, 2, None)
    assert run_tags(compose(["logger=none"])) == []


@pytest.mark.parametrize("overrides, words", [
    (["attn.window=1.5"], "attn.window"),
    (["attn.window=-3"], "attn.window must be a positive integer (the keys a query sees, counting itself)"),
    (["pos=rope", "attn.window=8", "attn.local_rope_base=1e4", "attn.global_every=2", "attn=mqa",
      "attn.local_rope_base=-1"], "attn.local_rope_base must be positive"),
])
def test_bad_settings_are_refused_by_inspect_in_one_line(overrides, words):
    res = invoke_ablate("inspect", *overrides, "logger=none")
    assert res.returncode == 2 and words in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


def test_a_ladder_rung_with_no_full_layer_is_refused_at_plan_time_naming_it(tmp_path):
    res = invoke_ablate("sweep", "pos=rope", "attn.window=8", "attn.global_every=3", "act=gelu,swiglu",
                        "--ladder", "cpu", "--dry-run", "logger=none", f"hydra.sweep.dir={tmp_path}/s")
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == ("error: ladder rung r0 (model.d_model=32 model.n_layers=2 model.n_heads=2): "
                                  "attn.global_every=3 leaves no full "
                                  "layer in a 2-layer model (full layers are 2, 5, ...): use at most 2, or null "
                                  "to slide every layer")
    assert not (tmp_path / "s").exists()


def test_presets_have_the_documented_block_and_pattern():
    from ablate.config.schema import axis_values

    mistral, gemma3 = (ModelSpec.from_config(compose([f"arch={a}", "logger=none"])) for a in ("mistral", "gemma3"))
    assert axis_values(compose(["arch=mistral"]))["attn"] == "gqa"
    assert (mistral.norm, mistral.act, mistral.pos, mistral.tied, mistral.n_layers) == ("rmsnorm", "swiglu", "rope",
                                                                                        False, 6)
    assert (mistral.attn.window, mistral.attn.global_every) == (32, None)
    assert (gemma3.norm_pos, gemma3.act, gemma3.qk_norm, gemma3.emb_scale, gemma3.tied) == ("sandwich", "geglu",
                                                                                           True, True, True)
    assert (gemma3.attn.window, gemma3.attn.global_every, gemma3.attn.local_rope_base, gemma3.rope_base) == (
        32, 6, 1e4, 1e6)
    # a size on the command line wins over the presets' 6 layers
    assert ModelSpec.from_config(compose(["arch=gemma3", "model=small", "logger=none"])).n_layers == 12
