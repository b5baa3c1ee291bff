"""Paired batches (ablate/data/batches.py: same data_seed -> identical batches whatever the
architecture, the parallelism or a resume) and fixed validation windows, through the real trainer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ablate.data.batches import Batches, val_windows
from ablate.errors import DataError
from ablate.tracking.sinks import Sink
from conftest import TINY, compose


class ListSink(Sink):
    def __init__(self):
        self.rows = []

    def log(self, row):
        self.rows.append(row)


def trained_batches(overrides: list[str], steps: int, tmp_path, start_step: int = 0) -> list:
    """Run the real Trainer (built the way `ablate run` builds it) and record every (x, y) the
    model is trained on."""
    from ablate.model.spec import ModelSpec
    from ablate.model.transformer import build_model
    from ablate.train.launch import prepare_data
    from ablate.train.trainer import Trainer

    cfg = compose(TINY + [f"train.steps={steps}", "train.eval_every=0"] + overrides)
    tok, data = prepare_data(cfg, progress=False)
    model = build_model(ModelSpec.from_config(cfg, tokenizer_vocab=tok.vocab_size))
    seen = []

    def record(module, args, kwargs):
        y = args[1] if len(args) > 1 else kwargs.get("targets")
        if y is not None:  # a training forward (evaluation passes no targets)
            seen.append((args[0].clone(), y.clone()))

    model.register_forward_pre_hook(record, with_kwargs=True)
    trainer = Trainer(model, cfg.train, data, sinks=ListSink(), run_dir=tmp_path,
                      byte_lengths=tok.token_byte_lengths(), data_seed=cfg.data_seed)
    outcome = trainer.fit(start_step)
    assert outcome.status == "completed"
    return seen


def test_two_architectures_with_one_data_seed_train_on_identical_batches(tmp_path):
    base = trained_batches([], 4, tmp_path / "a")
    other = trained_batches(["norm=rmsnorm", "act=swiglu", "pos=rope", "attn=gqa", "model.n_heads=4",
                             "tie=untied", "model.n_layers=1"], 4, tmp_path / "b")
    assert len(base) == len(other) == 4
    for (x1, y1), (x2, y2) in zip(base, other):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
        assert x1.shape == (4, 32) and torch.equal(x1[:, 1:], y1[:, :-1])  # y is x shifted by one
    shifted = trained_batches(["data_seed=1"], 4, tmp_path / "c")
    assert all(not torch.equal(a[0], b[0]) for a, b in zip(base, shifted))


def test_a_resumed_run_continues_the_batch_sequence_without_replaying(tmp_path):
    full = trained_batches([], 5, tmp_path / "a")
    resumed = trained_batches([], 5, tmp_path / "b", start_step=3)
    assert len(resumed) == 2
    for (x1, _), (x2, _) in zip(full[3:], resumed):
        assert torch.equal(x1, x2)


def test_ranks_and_accumulation_split_one_global_batch():
    tokens = np.arange(10_000, dtype=np.uint16)
    one = Batches(tokens, seq_len=16, batch_size=8, data_seed=3)
    ranks = [Batches(tokens, 16, 4, 3, rank=r, world_size=2) for r in range(2)]
    accum = Batches(tokens, 16, 4, 3, grad_accum=2)
    ranks_accum = [Batches(tokens, 16, 2, 3, rank=r, world_size=2, grad_accum=2) for r in range(2)]
    for step in (0, 1, 57):
        x, y = one.get(step)
        by_rank = [b.get(step)[0] for b in ranks]
        by_micro = [accum.get(step, m)[0] for m in range(2)]
        both = [ranks_accum[r].get(step, m)[0] for m in range(2) for r in range(2)]
        assert torch.equal(torch.cat(by_rank), x)
        assert torch.equal(torch.cat(by_micro), x)
        assert torch.equal(torch.cat(both), x)
        assert not torch.equal(by_rank[0], by_rank[1])  # disjoint slices, not copies
        assert torch.equal(y, x + 1)  # consecutive ids: windows are contiguous text
        assert int(y.max()) < len(tokens)
    assert not torch.equal(one.get(0)[0], one.get(1)[0])


def test_windows_cover_the_whole_training_split():
    tokens = np.arange(40, dtype=np.uint16)
    b = Batches(tokens, seq_len=8, batch_size=4, data_seed=0)
    starts = np.concatenate([b.starts(s) for s in range(200)])
    assert starts.min() == 0 and starts.max() == len(tokens) - 8 - 1  # the last token is a target


def test_a_split_smaller_than_one_batch_is_refused():
    with pytest.raises(DataError, match="fewer than one batch"):
        Batches(np.arange(100, dtype=np.uint16), seq_len=32, batch_size=4, data_seed=0)


def test_validation_windows_predict_each_token_once():
    tokens = np.arange(100)
    windows = val_windows(tokens, seq_len=32, max_tokens=1000)
    targets = np.concatenate([tokens[s + 1:s + 1 + n] for s, n in windows])
    assert np.array_equal(targets, tokens[1:])
    capped = val_windows(tokens, seq_len=32, max_tokens=40)
    assert capped == [(0, 32), (32, 8)]
