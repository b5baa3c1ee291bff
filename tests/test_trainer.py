"""The trainer's resume (ablate/train/trainer.py): a resumed run counts tokens from its
checkpoint, and a checkpoint that does not fit the model names the first key that differs."""

from __future__ import annotations

import pytest

from conftest import scripted_trainer

from ablate.errors import CheckpointError
from ablate.train import checkpoint


def test_a_resumed_run_counts_tokens_from_its_checkpoint(tmp_path):
    first = scripted_trainer(tmp_path, "train.steps=4")
    first.fit()
    path = checkpoint.list_checkpoints(tmp_path)[-1][1]
    state = checkpoint.load_file(path)
    assert state["tokens"] == 4 * first.tokens_per_step
    state["tokens"] = 1_000_000  # e.g. seen with another split of the global batch
    checkpoint.save(tmp_path, 4, state)

    again = scripted_trainer(tmp_path, "train.steps=6")
    outcome = again.fit(again.try_resume())
    assert outcome.result.tokens == 1_000_000 + 2 * again.tokens_per_step
    assert again.sinks.rows[-1]["tokens"] == outcome.result.tokens


def test_a_checkpoint_that_does_not_fit_names_the_first_differing_key(tmp_path):
    scripted_trainer(tmp_path, "train.steps=1").fit()
    wider = scripted_trainer(tmp_path, "model.d_model=48")
    with pytest.raises(CheckpointError) as e:
        wider.try_resume()
    assert "shape [256, 32] in the checkpoint, [256, 48] in this model" in str(e.value)
    assert "Error(s) in loading state_dict" not in str(e.value)
