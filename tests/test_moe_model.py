"""ffn=moe in the model and the trainer: the dense model it reduces to, its counts, the tokens a
training step counts (and what does not count), and its settings refused in one line."""

from __future__ import annotations

import pytest
import torch

from ablate.model.moe import MoE
from ablate.model.spec import ModelSpec, active_params, count_params
from ablate.model.transformer import Transformer
from ablate.train.policy import Action
from conftest import compose, scripted_trainer

SIZE = dict(vocab_size=64, d_model=32, n_layers=3, n_heads=2, n_kv_heads=2, d_ff=64, max_seq_len=16)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("act", ["swiglu", "gelu"])
def test_one_expert_top1_at_the_dense_width_trains_as_the_dense_model(act):
    """E=1, k=1, d_expert = d_ff, no balancing terms, weights copied: the LM losses are equal."""
    dense_spec = ModelSpec(**SIZE, act=act, bias=True)
    moe_spec = ModelSpec(**SIZE, act=act, bias=True, ffn="moe", settings={"ffn": dict(
        experts=1, top_k=1, d_expert=dense_spec.d_ff, balance="none", z_coef=0.0)})
    torch.manual_seed(0)
    dense, moe = Transformer(dense_spec, seed=0), Transformer(moe_spec, seed=0)
    state = dense.state_dict()
    ours = moe.state_dict()
    w_in = "gate_up" if dense_spec.gated else "up"
    for i in range(SIZE["n_layers"]):
        for name, value in state.items():
            if not name.startswith(f"blocks.{i}.ffn."):
                continue
            part, kind = name.split(".")[-2:]  # gate_up / up / down, weight / bias
            bank = {("down", "weight"): "w_out", ("down", "bias"): "b_out",
                    (w_in, "weight"): "w_in", (w_in, "bias"): "b_in"}[(part, kind)]
            ours[f"blocks.{i}.ffn.{bank}"] = value.unsqueeze(0)
    ours.update({k: v for k, v in state.items() if ".ffn." not in k})
    moe.load_state_dict(ours)
    idx = torch.randint(0, 64, (2, 16))
    y = torch.randint(0, 64, (2, 16))
    a, b = dense.train()(idx, y), moe.train()(idx, y)
    torch.testing.assert_close(b.lm_loss, a.lm_loss, rtol=1e-6, atol=1e-6)
    assert b.terms == {}


def test_active_params_are_the_router_and_k_experts_of_each_moe_layer():
    spec = ModelSpec(**SIZE, act="swiglu", ffn="moe", settings={"ffn": dict(experts=6, top_k=2, dense_first=1)})
    model = Transformer(spec)
    inactive = 0
    for block in model.blocks:
        if isinstance(block.ffn, MoE):
            m = block.ffn
            per_expert = m.w_in[0].numel() + m.w_out[0].numel() + m.b_in[0].numel() + m.b_out[0].numel()
            inactive += (6 - 2) * per_expert
    total = sum(p.numel() for p in model.parameters())
    assert count_params(spec)["total"] == total
    assert active_params(spec) == total - inactive
    # the fair width: two experts' parameters nearest the dense FFN's (d_ff 64 -> 32 each)
    assert model.blocks[1].ffn.d_expert == 32 and not isinstance(model.blocks[0].ffn, MoE)


def test_a_training_step_counts_its_micro_steps_tokens_and_nothing_else_counts(tmp_path):
    trainer = scripted_trainer(tmp_path, "arch=llama", "model.n_heads=4", "ffn=moe", "ffn.experts=4",
                               "train.grad_accum=2")
    assert trainer.grad_accum == 2
    moe = [b.ffn for b in trainer.model.blocks]
    seen: list[list[torch.Tensor]] = [[] for _ in moe]

    def counter(i):
        def hook(module, args, out):  # the routing of this forward, recomputed here
            x = args[0].reshape(-1, args[0].shape[-1])
            seen[i].append(torch.bincount(module.route(x)[2].reshape(-1), minlength=4))
        return hook

    for i, m in enumerate(moe):
        m.register_forward_hook(counter(i))
    trainer.train_step(0)
    assert all(len(s) == 2 for s in seen)  # two micro-steps
    expected = torch.stack([s[0] + s[1] for s in seen])
    assert torch.equal(trainer.step_loads, expected)
    assert trainer.step_loads.sum() == 2 * 2 * 4 * 32 * 2  # layers x micro x batch x seq x k / grad_accum
    trainer.evaluate()  # evaluation and diagnostics' forward: seen by the hooks, counted by no one
    from ablate.train.diagnostics import activation_stats

    activation_stats(trainer.model, torch.randint(0, 256, (2, 32)))
    assert torch.equal(trainer.step_loads, expected) and trainer.loads.take() is None


def test_a_skipped_step_counts_nothing_and_an_applied_one_keeps_its_loads(tmp_path):
    trainer = scripted_trainer(tmp_path, "ffn=moe", "ffn.experts=4", "train.skip_spikes=true", "train.steps=16",
                               losses=lambda step: 50.0 if step + 1 == 15 else None)
    kept = []
    update = trainer._update

    def spy(verdict):
        pending = trainer.step_loads
        update(verdict)
        kept.append((verdict.action, pending, trainer.expert_loads))

    trainer._update = spy
    assert trainer.fit().result.skipped_steps == 1
    for step, (action, pending, loads) in enumerate(kept, start=1):
        if step == 15:
            assert action is Action.SKIP and torch.equal(loads, kept[13][2])  # still step 14's
        else:
            assert action is Action.UPDATE and loads is pending


def test_log_rows_carry_the_terms_and_the_imbalance(tmp_path):
    trainer = scripted_trainer(tmp_path, "ffn=moe", "ffn.experts=4", "train.steps=2")
    trainer.fit()
    row = [r for r in trainer.sinks.rows if "train_loss" in r][-1]
    assert row["loss/balance"] > 0 and row["loss/router_z"] > 0
    assert 1.0 <= row["stat/moe_imbalance"] <= 4 / 2
    assert row["stat/moe_imbalance_layer"] in (0.0, 1.0)


def test_a_ladder_sizes_a_rung_by_active_params_and_refuses_dense_first_at_its_depth():
    from ablate.errors import ConfigError
    from ablate.model.spec import active_non_embedding_params, non_embedding_params
    from ablate.sweep.transfer_plan import Rung, rung_size

    rung = Rung("r0", 32, 2, 2)
    cfg = compose(["ffn=moe", *rung.overrides()])
    params, per_step = rung_size(rung, lambda: cfg)
    spec = ModelSpec.from_config(cfg)
    assert params == active_non_embedding_params(spec) < non_embedding_params(spec)
    assert per_step == cfg.train.batch_size * cfg.train.seq_len
    with pytest.raises(ConfigError, match=r"^ladder rung r0 \(model.d_model=32 model.n_layers=2 model.n_heads=2\): "
                                          r"ffn.dense_first=2 must be"):
        rung_size(rung, lambda: compose(["ffn=moe", "ffn.dense_first=2", *rung.overrides()]))
