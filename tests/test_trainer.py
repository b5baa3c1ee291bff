"""Run lifecycle, in-process: a lasting loss shift under train.skip_spikes ends the run, a resumed
run counts tokens from its checkpoint, a checkpoint that does not fit names the first key that
differs, and a torchrun launch reports only the summary it wrote."""

from __future__ import annotations

import json

import pytest

from conftest import TINY, compose, run_context, scripted_trainer

from ablate.errors import CheckpointError
from ablate.rundir import SUMMARY, write_json
from ablate.train import checkpoint


def make_trainer(run_dir, *overrides, loss_from=None, loss=50.0):
    """A tiny Trainer whose measured loss is `loss` from step `loss_from` on."""
    shifted = (lambda step: loss if step + 1 >= loss_from else None) if loss_from is not None else None
    return scripted_trainer(run_dir, *overrides, losses=shifted)


def test_skip_spikes_ends_a_lasting_loss_shift_as_diverged(tmp_path):
    """The loss jumps at step 15 and stays there: 9 updates are skipped, the 10th ends the run."""
    outcome = make_trainer(tmp_path, "train.skip_spikes=true", loss_from=15).fit()
    assert outcome.status == "diverged", outcome
    assert "10 updates in a row skipped as loss spikes" in outcome.reason
    assert outcome.result.skipped_steps == 9 and outcome.step == 23


def test_a_resumed_run_counts_tokens_from_its_checkpoint(tmp_path):
    first = make_trainer(tmp_path, "train.steps=4")
    first.fit()
    path = checkpoint.list_checkpoints(tmp_path)[-1][1]
    state = checkpoint.load_file(path)
    assert state["tokens"] == 4 * first.tokens_per_step
    state["tokens"] = 1_000_000  # e.g. seen with another split of the global batch
    checkpoint.save(tmp_path, 4, state)

    again = make_trainer(tmp_path, "train.steps=6")
    outcome = again.fit(again.try_resume())
    assert outcome.result.tokens == 1_000_000 + 2 * again.tokens_per_step
    assert again.sinks.rows[-1]["tokens"] == outcome.result.tokens


def test_a_checkpoint_that_does_not_fit_names_the_first_differing_key(tmp_path):
    make_trainer(tmp_path, "train.steps=1").fit()
    wider = make_trainer(tmp_path, "model.d_model=48")
    with pytest.raises(CheckpointError) as e:
        wider.try_resume()
    assert "shape [256, 32] in the checkpoint, [256, 48] in this model" in str(e.value)
    assert "Error(s) in loading state_dict" not in str(e.value)


def test_a_torchrun_launch_reports_only_the_summary_it_wrote(tmp_path, monkeypatch, capsys):
    """torchrun failing before rank 0 writes anything: the summary of an earlier run in the
    directory is neither reported as this launch's outcome nor changed."""
    from ablate import run
    from ablate.train import distributed

    stale = {"status": "completed", "step": 6}
    write_json(tmp_path / SUMMARY, stale)
    monkeypatch.setattr(distributed, "launch_ranks", lambda *args, **kwargs: 1)
    record, code = run._run_ranks(compose(TINY), run_context(tmp_path))
    assert record.status == "failed" and code == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: torchrun exited with code 1 before rank 0 recorded the outcome; see {tmp_path / 'torchrun.log'}"]
    assert json.loads((tmp_path / SUMMARY).read_text()) == stale


def test_a_rank_0_killed_mid_run_leaves_a_failed_summary_not_running(tmp_path, monkeypatch):
    from ablate import run
    from ablate.train import distributed

    def killed(*args, **kwargs):  # rank 0 recorded "running", then the OOM killer came
        write_json(tmp_path / SUMMARY, {"status": "running", "pid": 1})
        return 137

    monkeypatch.setattr(distributed, "launch_ranks", killed)
    record, code = run._run_ranks(compose(TINY), run_context(tmp_path))
    assert code == 137 and record.status == "failed" and "code 137" in record.error
    assert json.loads((tmp_path / SUMMARY).read_text())["status"] == "failed"
