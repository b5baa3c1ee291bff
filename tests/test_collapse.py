"""A completed run that learned only token frequencies is named in its summary and in compare,
its status still `completed` (ablate/run/collapse.py). Fixtures: tests/fixtures/collapse, the
summary.json, config.yaml and metrics.jsonl of `ablate run norm=dyt train.steps=150
train.threads=1 logger=none` and of the same with norm=layernorm (2026-11-29): DyT saturates and
ends at the unigram loss with no gradient reaching its blocks; LayerNorm does not."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from ablate.analysis.report import CompareOptions, build_report
from ablate.names import Status
from ablate.run.collapse import UNIGRAM_TOLERANCE, collapse_of
from ablate.run.record import read_record
from ablate.run.summary import summary_table
from ablate.terminal import render
from ablate.train.launch import unigram_loss
from ablate.train.trainer import blocks_grad_norm
from conftest import TINY, compose

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "collapse"


def test_the_saturated_dyt_run_is_named_collapsed_and_layernorm_is_not():
    dyt, layernorm = read_record(FIXTURES / "dyt"), read_record(FIXTURES / "layernorm")
    assert dyt.status == layernorm.status == Status.COMPLETED
    text = " ".join(render(summary_table(dyt, FIXTURES / "dyt")).split())
    assert ("note │ collapsed: val_loss 3.3360 is within 0.05 of the unigram loss 3.3368 (each token predicted "
            "from its frequency alone); no gradient reached the blocks at the last step") in text
    assert "status │ completed" in text
    assert collapse_of(layernorm) is None and "collapsed" not in render(summary_table(layernorm, FIXTURES))


def test_compare_says_which_variant_collapsed(tmp_path):
    root = Path(shutil.copytree(FIXTURES, tmp_path / "runs"))
    report = build_report([root], CompareOptions())
    notes = [n for n in report.notes if "collapsed" in n]
    assert notes == ["norm=dyt: collapsed in 1 of 1 run(s), its status still completed: val_loss 3.3360 is within "
                     "0.05 of the unigram loss 3.3368 (each token predicted from its frequency alone); no gradient "
                     "reached the blocks at the last step (a saturated tanh or norm passes none; "
                     "train.diagnostics_every=25 shows from when)"]
    assert all(r.status == {"completed": 1} for r in report.comparison)  # a note, not another status


@pytest.mark.parametrize("offset, collapsed", [(0.0, True), (UNIGRAM_TOLERANCE - 1e-4, True),
                                                (-(UNIGRAM_TOLERANCE - 1e-4), True),
                                                (UNIGRAM_TOLERANCE + 1e-4, False), (-0.83, False)])
def test_the_tolerance_around_the_unigram_loss(offset, collapsed):
    record = read_record(FIXTURES / "layernorm")  # its blocks had a gradient: the loss alone decides
    record.result.val_loss = record.info.unigram_loss + offset
    assert (collapse_of(record) is not None) == collapsed
    record.status = Status.DIVERGED
    assert collapse_of(record) is None


def test_the_unigram_loss_is_the_entropy_of_the_token_frequencies():
    from scipy.stats import entropy

    tokens = np.random.default_rng(0).choice(50, size=20_000, p=np.arange(1, 51) / np.arange(1, 51).sum())
    assert unigram_loss(tokens.astype(np.uint16)) == pytest.approx(entropy(np.bincount(tokens)), abs=1e-6)


def test_the_block_gradient_norm_is_the_norm_of_the_blocks_gradients_alone():
    from ablate.model.spec import ModelSpec
    from ablate.model.transformer import Transformer

    torch.manual_seed(0)
    model = Transformer(ModelSpec.from_config(compose(TINY), tokenizer_vocab=256))
    x = torch.randint(0, 256, (2, 16))
    model(x, x).loss.backward()
    expected = sum(float(p.grad.pow(2).sum()) for n, p in model.named_parameters() if n.startswith("blocks."))
    assert blocks_grad_norm(model) == pytest.approx(expected ** 0.5, rel=1e-5) and expected > 0
    for p in model.blocks.parameters():
        p.grad.zero_()
    assert blocks_grad_norm(model) == 0.0
