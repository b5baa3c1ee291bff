"""The re-entry rule on its own (ablate/run/lifecycle.py, the table in its docstring): what entering a
run directory with a config does, for each thing the directory can hold."""

from __future__ import annotations

import pytest
import yaml
from omegaconf import OmegaConf

from conftest import TINY, compose

from ablate.errors import RunDirError
from ablate.run.lifecycle import EXTEND, RESUME, RETURN, START, check_reentry
from ablate.run.directory import CONFIG, SUMMARY, write_json


def held(run_dir, status, overrides=(), checkpoint=False, **record):
    """A run directory as a run of TINY + overrides left it: its config, its record and, if
    asked, a checkpoint of step 3."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = OmegaConf.to_container(compose([*TINY, *overrides]), resolve=True)
    (run_dir / CONFIG).write_text(yaml.safe_dump(cfg))
    write_json(run_dir / SUMMARY, {"status": status, "step": 6, "steps": 6, **record})
    if checkpoint:
        (run_dir / "checkpoints").mkdir()
        (run_dir / "checkpoints" / "step_00000003.pt").write_bytes(b"")
    return run_dir


def test_a_fresh_directory_starts(tmp_path):
    assert check_reentry(tmp_path / "nothing", compose(TINY)) is None
    assert check_reentry(tmp_path, compose(TINY)) is None  # exists, holds no run


@pytest.mark.parametrize("status, said", [
    ("completed", "already completed (step 6/6); returning its result"),
    ("diverged", "already diverged at step 6 (non-finite loss); returning that outcome without training")])
def test_a_finished_run_of_the_same_experiment_returns_its_outcome(tmp_path, status, said):
    run = held(tmp_path / "r", status, reason="non-finite loss" if status == "diverged" else "")
    # logger and train.eval_every do not change what is trained: the same experiment
    decision = check_reentry(run, compose([*TINY, "logger=wandb", "train.eval_every=3"]))
    assert decision.action == RETURN and decision.found.record.status == status
    assert decision.notice.startswith(f"{run} {said}")


def test_a_completed_run_extends_only_when_asked_by_name(tmp_path):
    run = held(tmp_path / "r", "completed")
    decision = check_reentry(run, compose([*TINY, "train.steps=12", "train.extend=true"]))
    assert (decision.action, decision.extended_from) == (EXTEND, 6)
    with pytest.raises(RunDirError, match=r"train\.steps=6; this config has train\.steps=12: to train it "
                                          r"further, extend it by name: ablate resume .* --extend 12"):
        check_reentry(run, compose([*TINY, "train.steps=12"]))
    with pytest.raises(RunDirError, match=r"holds a diverged run with train\.steps=6"):
        check_reentry(held(tmp_path / "d", "diverged"), compose([*TINY, "train.steps=12", "train.extend=true"]))


def test_another_experiment_is_refused_naming_the_key(tmp_path):
    finished = held(tmp_path / "f", "completed")
    with pytest.raises(RunDirError, match=r"holds a completed run with norm\.name=layernorm; this config "
                                          r"has norm\.name=rmsnorm"):
        check_reentry(finished, compose([*TINY, "norm=rmsnorm"]))
    stopped = held(tmp_path / "s", "preempted", checkpoint=True)
    with pytest.raises(RunDirError, match=r"holds a checkpoint of a preempted run with seed=0"):
        check_reentry(stopped, compose([*TINY, "seed=1"]))


def test_an_unfinished_run_resumes_from_its_checkpoint_or_starts_over_without_one(tmp_path):
    stopped = held(tmp_path / "s", "interrupted", checkpoint=True)
    decision = check_reentry(stopped, compose([*TINY, "train.device=cpu"]))  # how it is computed: the same
    assert decision.action == RESUME and decision.found.checkpoints[0][0] == 3
    failed = held(tmp_path / "f", "failed", overrides=["seed=1"])
    decision = check_reentry(failed, compose(TINY))  # no checkpoint: any config starts over
    assert decision.action == START
    assert decision.notice == f"{failed} (failed) has no checkpoint: starting from step 0 (it had logged no step)"


def test_a_running_record_whose_process_is_gone_reads_killed(tmp_path):
    run = held(tmp_path / "k", "running", pid=2 ** 22 + 12345, host=None)  # no such process here
    decision = check_reentry(run, compose(TINY))
    assert decision.action == START and "(killed) has no checkpoint" in decision.notice


def test_resume_never_starts_over_whatever_the_directory_holds(tmp_path):
    run = held(tmp_path / "r", "completed")
    assert check_reentry(run, compose([*TINY, "norm=rmsnorm", "train.resume=never"])) is None
