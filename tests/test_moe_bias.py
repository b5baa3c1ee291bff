"""ffn.balance=bias in the trainer: the choice bias moves by -bias_rate * sign(load - mean load),
centred, after each applied optimizer step, from the step's loads over its micro-steps and its
ranks; a skipped step, evaluation and diagnostics leave it; a resumed run ends bit for bit as the
uninterrupted one."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from ablate.model.moe import MoE
from ablate.train import checkpoint
from ablate.train.policy import Action
from conftest import ROOT, compose, scripted_trainer

RATE = 0.01
BIAS = ["arch=llama", "model.n_heads=4", "ffn=moe", "ffn.experts=4", "ffn.router=sigmoid", "ffn.balance=bias",
        f"ffn.bias_rate={RATE}"]


pytestmark = pytest.mark.usefixtures("one_thread")


def biases(model) -> torch.Tensor:
    return torch.stack([b.ffn.choice_bias.clone() for b in model.blocks if isinstance(b.ffn, MoE)])  # (L, E)


def moved(bias: torch.Tensor, loads: torch.Tensor) -> torch.Tensor:
    """The update written out: b - rate * sign(load - mean load), then b - mean(b), per layer."""
    load = loads.float()
    b = bias - RATE * torch.sign(load - load.mean(dim=-1, keepdim=True))
    return b - b.mean(dim=-1, keepdim=True)


def test_an_applied_step_moves_the_bias_by_its_loads_and_nothing_else_moves_it(tmp_path):
    trainer = scripted_trainer(tmp_path, *BIAS, "train.grad_accum=2", "train.skip_spikes=true", "train.steps=16",
                               losses=lambda step: 50.0 if step + 1 == 15 else None)
    seen = []
    update = trainer._update

    def spy(verdict):
        before, loads = biases(trainer.model), trainer.step_loads
        update(verdict)
        seen.append((verdict.action, before, loads, biases(trainer.model)))

    trainer._update = spy
    assert trainer.fit().result.skipped_steps == 1
    for step, (action, before, loads, after) in enumerate(seen, start=1):
        if step == 15:  # the skipped step: its routing moves nothing
            assert action is Action.SKIP and torch.equal(after, before)
        else:
            assert action is Action.UPDATE and torch.equal(after, moved(before, loads))
    final = seen[-1][3]
    assert final.abs().sum() > 0 and torch.allclose(final.mean(dim=-1), torch.zeros(len(final)), atol=1e-7)
    # evaluation and diagnostics' extra forward pass: the bias stays
    from ablate.train.diagnostics import activation_stats

    trainer.evaluate()
    activation_stats(trainer.model, torch.randint(0, 256, (2, 32)))
    assert torch.equal(biases(trainer.model), final)


def test_a_resumed_run_ends_with_the_bias_and_weights_of_the_uninterrupted_one(tmp_path):
    whole = scripted_trainer(tmp_path / "whole", *BIAS, "train.steps=6", "train.ckpt_every=3")
    whole.fit()
    state = checkpoint.load_file(dict(checkpoint.list_checkpoints(tmp_path / "whole"))[3])
    resumed = scripted_trainer(tmp_path / "resumed", *BIAS, "train.steps=6", "train.ckpt_every=3")
    assert resumed.try_resume(state) == 3
    saved = torch.stack([state["model"][f"blocks.{i}.ffn.choice_bias"] for i in range(len(resumed.model.blocks))])
    assert saved.abs().sum() > 0 and torch.equal(biases(resumed.model), saved)  # the checkpoint holds it
    resumed.fit(start_step=3)
    a, b = whole.model.state_dict(), resumed.model.state_dict()
    assert biases(whole.model).abs().sum() > 0
    assert all(torch.equal(a[k], b[k]) for k in a)


# ---- two gloo ranks with different token distributions -------------------------------------------
SIZE = ["model.d_model=32", "model.n_layers=2", "model.max_seq_len=64", "train.batch_size=4", "train.seq_len=32",
        "train.steps=1", "train.device=cpu", "logger=none", *BIAS]


def rank_step(rank: int, init: str, out: str) -> dict:
    """One DDP training step of rank `rank` of 2 (gloo): rank 0 reads tokens below 128, rank 1
    tokens from 128 (different routing). -> its window, its local loads and the biases after."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ablate.data.cache import TokenData
    from ablate.model.spec import ModelSpec
    from ablate.model.transformer import build_model
    from ablate.train.trainer import Trainer

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    try:
        cfg = compose(SIZE)
        spec = ModelSpec.from_config(cfg, tokenizer_vocab=256)
        model = build_model(spec, seed=0)
        rng = np.random.default_rng(rank)
        data = TokenData(train=rng.integers(128 * rank, 128 * rank + 128, 4000).astype(np.uint16),
                         val=rng.integers(0, 256, 600).astype(np.uint16), meta={}, path=out)
        trainer = Trainer(model, cfg.train, data, None, out, np.ones(spec.vocab_size, dtype=np.int64),
                          rank=rank, world_size=2, wrap=lambda m: DDP(m))
        local, take = [], trainer.loads.take
        trainer.loads.take = lambda: local.append(take()) or local[-1]  # this rank's, before the all-reduce
        trainer.train_step(0)
        trainer.apply_update()
        return dict(window=trainer.batches.window(0, 0), local=local[0], bias=biases(model))
    finally:
        dist.destroy_process_group()


CHILD = ("import sys, torch; sys.path.insert(0, {tests!r}); import test_moe_bias as t; "
         "torch.set_num_threads(1); torch.save(t.rank_step(1, {init!r}, {out!r}), {out!r} + '/rank1.pt')")


def test_two_ranks_move_the_bias_by_the_loads_of_their_union_batch(tmp_path):
    """Rank 1 in a subprocess, rank 0 here; DDP broadcasts buffers from rank 0, so equal biases
    prove nothing: the bias must be the union batch's update, not rank 0's alone."""
    init = str(tmp_path / "init")
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(tests=str(ROOT / "tests"), init=init, out=str(tmp_path))],
                             cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, stderr=subprocess.PIPE, text=True)
    try:
        rank0 = rank_step(0, init, str(tmp_path))
    finally:
        assert child.wait(timeout=120) == 0, child.stderr.read()
    rank1 = torch.load(tmp_path / "rank1.pt")
    assert torch.equal(rank0["bias"], rank1["bias"])
    # one process over the union batch: the same initial model, one forward, its loads
    from ablate.model.spec import ModelSpec
    from ablate.model.transformer import build_model

    model = build_model(ModelSpec.from_config(compose(SIZE), tokenizer_vocab=256), seed=0).train()
    union = torch.cat([rank0["window"], rank1["window"]])
    model(union[:, :-1], union[:, 1:])
    loads = torch.stack([b.ffn.counts for b in model.blocks])
    assert torch.equal(loads, rank0["local"] + rank1["local"])
    zero = torch.zeros_like(loads, dtype=torch.float32)
    assert torch.equal(rank0["bias"], moved(zero, loads))
    assert not torch.equal(rank0["bias"], moved(zero, rank0["local"]))  # rank 0's loads alone move it otherwise
