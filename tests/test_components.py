"""The component contract (ablate/model/component.py): an attention or FFN option builds its module
for a layer and answers for its parameters, FLOPs, decode cache, auxiliary losses and statistics;
the model's totals, the KV cache, inspect, the objective and its logging, diagnostics and
coord-check read them through it. Held with tests/component_plugin.py, a plugin nothing else in
ablate knows: an attention that caches one latent of width attn.rank per token (not keys and
values of head_dim) and an FFN with a differentiable auxiliary loss, a statistic and an optional
integer setting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from ablate.model import options
from ablate.model.spec import ModelSpec, count_params, flops_per_token, kv_cache_bytes_per_token
from ablate.model.transformer import build_model, built_counts
from conftest import TINY, compose, registry_state, run_ablate

HERE = Path(__file__).resolve().parent
ENV = {"PYTHONPATH": str(HERE)}  # where `plugins=[component_plugin]` is found
PLUGIN = ["plugins=[component_plugin]", "attn=latent", "ffn=penalized"]


def cached_logits(model, idx: torch.Tensor, chunks=(5, 1, 3)) -> torch.Tensor:
    from ablate.model.kv_cache import KVCache

    cache = KVCache.for_model(model, batch=idx.shape[0], capacity=idx.shape[1])
    out, start = [], 0
    for n in chunks:
        out.append(model.decode(idx[:, start:start + n], cache))
        start += n
    return torch.cat(out, dim=1)


def test_a_plugins_components_are_counted_cached_and_their_terms_added_as_declared():
    with registry_state([str(HERE)]):  # the plugin's options are gone after, as in a new process
        cfg = compose([*TINY, *PLUGIN, "ffn.width=48", "ffn.coef=0.5", "pos=alibi"])
        spec = ModelSpec.from_config(cfg)
        assert spec.ffn.width == 48 and type(spec.ffn.width) is int and spec.attn.rank == 8
        torch.manual_seed(0)
        model = build_model(spec)  # refuses a built count that differs from the declared one
        d, L, r, w = spec.d_model, spec.n_layers, spec.attn.rank, 48
        # the declarations, by a formula written here: q, latent down, keys and values up, output
        attn = (d * d + d) + (d * r + r) + (r * 2 * d + 2 * d) + (d * d + d)
        assert built_counts(model)["attention"] == count_params(spec)["attention"] == L * attn
        assert count_params(spec)["ffn"] == L * (2 * d * w + w + d)
        assert flops_per_token(spec, 32) == 6 * (L * attn + L * (2 * d * w + w + d) + spec.vocab_size * d) \
            + 12 * L * d * 32
        # the cache: one latent of width r per position and layer, as declared, in KVCache too
        assert kv_cache_bytes_per_token(spec, 4) == r * L * 4
        from ablate.model.kv_cache import KVCache

        cache = KVCache.for_model(model, batch=3, capacity=10)
        assert [tuple(layer.latent.shape) for layer in cache.layers] == [(3, 10, r)] * L
        assert cache.bytes() == 3 * 10 * kv_cache_bytes_per_token(spec, 4)
        idx = torch.randint(0, spec.vocab_size, (2, 9))
        with torch.no_grad():
            torch.testing.assert_close(cached_logits(model, idx), model(idx).logits, rtol=1e-5, atol=1e-5)
        # the objective: the LM loss plus the FFNs' term, summed over layers, checked against the
        # penalty computed here from each FFN's input; the statistic is the largest layer's RMS
        inputs = []
        hooks = [b.ffn.register_forward_hook(lambda m, a, out: inputs.append(a[0])) for b in model.blocks]
        out = model(idx[:, :-1], idx[:, 1:])
        for h in hooks:
            h.remove()
        hidden = [F.gelu(b.ffn.up(x)) for b, x in zip(model.blocks, inputs)]
        want = sum(0.5 * h.float().pow(2).mean() for h in hidden)
        torch.testing.assert_close(out.terms["act_l2"], want.detach())
        torch.testing.assert_close(out.loss, out.lm_loss + want)
        assert out.stats["hidden_rms"] == max(h.detach().float().pow(2).mean().sqrt() for h in hidden)
        assert set(out.metrics()) == {"loss/act_l2", "stat/hidden_rms"}
        # differentiable: the term moves the FFN's gradient (coefficient 0 leaves it the LM's alone)
        out.loss.backward()
        grad = model.blocks[0].ffn.up.weight.grad.clone()
        model.zero_grad()
        zero = build_model(ModelSpec.from_config(compose([*TINY, *PLUGIN, "ffn.width=48", "ffn.coef=0", "pos=alibi"])),
                           seed=0)
        zero.load_state_dict(model.state_dict())
        out0 = zero(idx[:, :-1], idx[:, 1:])
        out0.loss.backward()
        assert out0.terms["act_l2"] == 0 and torch.equal(out0.loss, out0.lm_loss)
        assert not torch.allclose(zero.blocks[0].ffn.up.weight.grad, grad)


def test_blocks_know_their_layer_and_components_may_differ_by_it(own_registry):
    """A component built per layer (here an FFN half as wide on odd layers) is counted layer by
    layer; a block written to (spec, make_norm) gets its index all the same."""
    from ablate.model.blocks import Block
    from ablate.model.ffn import MLP

    class Alternating(MLP):
        def __init__(self, spec, layer):
            import dataclasses

            super().__init__(dataclasses.replace(spec, d_ff=spec.d_ff // (1 + layer % 2)), options.get("act", spec.act))

    class OldStyle(Block):  # written before blocks knew their index
        def __init__(self, spec, make_norm):
            super().__init__(spec, make_norm)
            self.norm1, self.norm2 = make_norm(spec.d_model), make_norm(spec.d_model)

        def forward(self, x, ctx):
            x = x + self.attn(self.norm1(x), ctx)
            return x + self.ffn(self.norm2(x))

    from ablate.model.options import ffn_layer_params

    options.register_option("ffn", "alternating", Alternating, params=lambda spec, layer: ffn_layer_params(
        spec.d_model, spec.d_ff // (1 + layer % 2), False, spec.bias))
    options.register_option("norm_pos", "oldstyle", OldStyle, params=lambda spec, norm: 2 * norm)
    spec = ModelSpec(vocab_size=64, d_model=32, n_layers=3, n_heads=2, n_kv_heads=2, d_ff=64, max_seq_len=16,
                     ffn="alternating", norm_pos="oldstyle")
    model = build_model(spec)
    assert [b.layer for b in model.blocks] == [0, 1, 2] and [b.ffn.up.out_features for b in model.blocks] == [64, 32, 64]
    assert built_counts(model) == count_params(spec)
    assert flops_per_token(spec, 16) == flops_per_token(ModelSpec(**{**spec.to_dict(), "ffn": "dense",
                                                                      "norm_pos": "pre"}), 16) \
        - 6 * (ffn_layer_params(32, 64, False, True) - ffn_layer_params(32, 32, False, True))


def test_an_optional_integer_setting_composes_as_an_integer_and_refuses_a_fraction(tmp_path):
    res = run_ablate("inspect", *TINY, *PLUGIN, "ffn.width=1024", "--json", env=ENV)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["spec"]["settings"]["ffn"] == {"coef": 0.01, "width": 1024}
    res = run_ablate("run", *TINY, *PLUGIN, "ffn.width=1.5", f"out_dir={tmp_path}", env=ENV)
    assert res.returncode == 2 and res.stderr.startswith("error: ffn.width: Value '1.5' of type 'float' could not "
                                                          "be converted to Integer"), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not any(tmp_path.iterdir())


def latest_weights(run_dir: Path) -> dict:
    from ablate.train.checkpoint import latest_valid

    return latest_valid(run_dir)["model"]


def test_a_plugins_components_train_log_and_run_through_every_command(tmp_path):
    from ablate.tracking.wandb_file import read_run

    short = [*TINY, "train.steps=3", *PLUGIN]
    runs = {coef: tmp_path / f"coef{coef}" for coef in ("0", "0.5")}
    # coefficient 0.5: logged to W&B (offline), with diagnostics at every step
    res = run_ablate("run", *short, "ffn.coef=0.5", "logger=wandb", "train.diagnostics_every=1",
                     f"hydra.run.dir={runs['0.5']}", env=ENV)
    assert res.returncode == 0, res.stderr
    res = run_ablate("run", *short, "ffn.coef=0", f"hydra.run.dir={runs['0']}", env=ENV)
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in (runs["0.5"] / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train_loss" in r]
    assert len(train) == 3 and all(r["loss/act_l2"] > 0 and r["stat/hidden_rms"] > 0 for r in train)
    diag = [r for r in rows if "diag/hidden_rms/block1" in r]
    assert len(diag) == 3 and all(r["diag/max_attn_logit/block0"] > -1e9 for r in diag)
    zero = [json.loads(line) for line in (runs["0"] / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss/act_l2"] for r in zero if "train_loss" in r] == [0.0] * 3
    history = [h for h in read_run(runs["0.5"]).history if "train/loss" in h]
    assert [h["train/loss_act_l2"] for h in history] == [r["loss/act_l2"] for r in train]
    assert [h["train/stat_hidden_rms"] for h in history] == [r["stat/hidden_rms"] for r in train]
    # the term trains: the same seed and batches end in other weights with coefficient 0
    a, b = latest_weights(runs["0.5"]), latest_weights(runs["0"])
    assert not torch.equal(a["blocks.0.ffn.up.weight"], b["blocks.0.ffn.up.weight"])
    # inspect's KV bytes: the declared latent (rank 8 x 2 layers x 2 bytes), bench --decode's measured
    inspected = json.loads(run_ablate("inspect", *short, "--json", "--build", env=ENV).stdout)
    assert inspected["kv_cache_bytes_per_token"] == 8 * 2 * 2
    assert inspected["built_params"] == inspected["params"]
    res = run_ablate("bench", "--decode", *short, "train.threads=1", "train.precision=bf16", "--batch", "2",
                     "--context", "6", "--new-tokens", "3", "--rounds", "1", "--warmup", "1", "--json", env=ENV)
    assert res.returncode == 0, res.stderr
    bench = json.loads(res.stdout)
    row = bench["rows"][0]
    assert row["kv_cache_bytes_per_token"] == bench["kv_cache_formula_bytes_per_token"] == 8 * 2 * 2
    assert row["kv_cache_bytes"] == 8 * 2 * 2 * 2 * (6 + 3)
    for args in (("sample", str(runs["0.5"]), "--max-new-tokens", "4"),
                 ("compare", str(runs["0.5"]), str(runs["0"])),
                 ("coord-check", *PLUGIN, "--widths", "16,32,64", "--steps", "2", "--seeds", "1", "--json")):
        res = run_ablate(*args, env=ENV)
        assert res.returncode == 0, (args, res.stderr)
    traces = json.loads(res.stdout)
    assert traces and "attn_logits" in json.dumps(traces)
    # no Hugging Face family holds a latent cache: the export is refused in one line
    res = run_ablate("export", str(runs["0.5"]), str(tmp_path / "hf"), env=ENV)
    assert res.returncode == 2 and "attn='latent'" in res.stderr and "ffn='penalized'" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "hf").exists()


def test_the_documented_example_is_this_plugin():
    """docs/extending.md's worked example is this file, character for character (the tests above
    hold what the docs show)."""
    import re

    text = (HERE.parent / "docs" / "extending.md").read_text(encoding="utf-8")
    code = re.search(r"cat > my_pkg/components\.py <<'PY'\n(.*?)\nPY\n", text, re.S)
    assert code, "docs/extending.md lost its my_pkg/components.py example"
    assert code.group(1) + "\n" == (HERE / "component_plugin.py").read_text(encoding="utf-8")


def test_each_term_is_logged_as_the_mean_over_micro_steps_as_train_loss_is(tmp_path):
    """loss/z and loss/mtp: the weighted value each adds, averaged over the step's micro-steps
    (computed here from the model's own logits before the step); train_loss stays the LM loss."""
    from conftest import scripted_trainer

    trainer = scripted_trainer(tmp_path, "model.z_loss=0.01", "model.mtp_heads=1", "train.grad_accum=2",
                               "train.steps=1")
    model, ce, z = trainer.model, [], []
    with torch.no_grad():
        for micro in range(trainer.grad_accum):
            w = trainer.batches.window(0, micro)
            logits = model(w[:, :-1]).logits.float()  # (B, T, V)
            ce.append(F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten()))
            z.append(0.01 * torch.logsumexp(logits, dim=-1).pow(2).mean())
    assert trainer.fit().status == "completed"
    row = next(r for r in trainer.sinks.rows if "train_loss" in r)
    assert row["train_loss"] == pytest.approx(float(sum(ce) / 2), rel=1e-5)
    assert row["loss/z"] == pytest.approx(float(sum(z) / 2), rel=1e-5)
    assert 0 < row["loss/mtp"] and {"loss/z", "loss/mtp"} <= set(row)
