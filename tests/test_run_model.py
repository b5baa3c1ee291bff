"""load_run_model: a run directory's weights, or one line saying why there are none to load."""

from __future__ import annotations

import shutil

import pytest
import torch

from ablate.errors import CheckpointError
from ablate.run.record import read_record
from ablate.run.trained import load_run_model
from ablate.train import checkpoint
from ablate.names import Status
from conftest import TINY, built_once, trained_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A tiny trained run with checkpoints at steps 2, 4 and 6, once for the session's workers
    (its tests only read it, or change a copy)."""
    def build(d):
        trained_run(d / "run", *TINY, "train.ckpt_every=2", "train.keep_ckpts=3")

    return built_once(tmp_path_factory, "run-model", build) / "run"


def _copy(run_dir, tmp_path):
    return shutil.copytree(run_dir, tmp_path / "copy")


def test_the_newest_checkpoint_is_loaded_in_eval_mode(run_dir):
    loaded = load_run_model(run_dir)
    assert loaded.step == 6 and loaded.tokenizer == "byte" and not loaded.model.training
    assert loaded.spec.d_model == 32 and loaded.cfg.train.seq_len == 32
    saved = checkpoint.load_file(checkpoint.list_checkpoints(run_dir)[-1][1])["model"]
    for name, t in loaded.model.state_dict().items():
        assert torch.equal(t, saved[name]), name


def test_step_picks_that_checkpoint(run_dir):
    early, late = load_run_model(run_dir, step=2), load_run_model(run_dir)
    assert early.step == 2
    assert not torch.equal(early.model.tok_emb.weight, late.model.tok_emb.weight)


def test_a_step_without_checkpoint_lists_the_steps_there_are(run_dir):
    with pytest.raises(CheckpointError, match=r"no checkpoint of step 3; there are: 2, 4, 6$"):
        load_run_model(run_dir, step=3)


def test_not_a_run_directory(tmp_path):
    with pytest.raises(CheckpointError, match="no config.yaml \\(not an ablate run directory\\)"):
        load_run_model(tmp_path)


def test_a_run_without_weights_says_why(run_dir, tmp_path):
    d = _copy(run_dir, tmp_path)
    shutil.rmtree(d / "checkpoints")
    with pytest.raises(CheckpointError) as e:
        load_run_model(d)
    assert "no checkpoint: the run kept none (train.ckpt_every / keep_ckpts)" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_diverged_run_is_refused_with_its_reason_and_step(run_dir, tmp_path):
    d = _copy(run_dir, tmp_path)
    record = read_record(d)
    record.status, record.reason, record.step = Status.DIVERGED, "non-finite loss", 5
    record.write(d)
    with pytest.raises(CheckpointError, match=r"the run diverged at step 5 \(non-finite loss\)"):
        load_run_model(d)


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous(run_dir, tmp_path, capsys):
    d = _copy(run_dir, tmp_path)
    newest = checkpoint.list_checkpoints(d)[-1][1]
    newest.write_bytes(newest.read_bytes()[:100])
    assert load_run_model(d).step == 4
    assert "skipping checkpoint" in capsys.readouterr().err
