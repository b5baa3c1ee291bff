"""Run lifecycle: re-entering a run directory (a resumed sweep, a submitit requeue, `ablate run`
with Hydra flags, a rerun). A run that cannot continue is refused in one line before its files
are touched; a diverged run is not trained again; a finished run keeps its timings."""

from __future__ import annotations

import json

import pytest

from conftest import TINY, copy_of_trained_run, find_run_dirs, run_ablate

from ablate.train import checkpoint

BASE = [*TINY, "train.threads=1"]  # 6 steps
UNSTABLE = [o for o in BASE if not o.startswith(("train.steps", "train.warmup_steps"))] + [
    "norm_pos=post", "train.warmup_steps=0", "train.grad_clip=0", "train.steps=40", "train.lr=30"]
# Hydra flags make `ablate run` skip its pre-flight (as `--cfg`, `--info`): the job checks alone.
FLAG = "--config-name=config"


def files(run_dir) -> dict:
    return {name: (run_dir / name).read_bytes() for name in ("config.yaml", "summary.json", "metrics.jsonl")}


def unfinish(run) -> None:
    """As if the run had been preempted right after its last checkpoint: a run that resumes."""
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "status": "preempted"}))


@pytest.fixture
def finished(tmp_path_factory, tmp_path):
    return copy_of_trained_run(tmp_path_factory, tmp_path, *BASE)


def test_a_sweep_resumed_with_a_changed_config_is_refused_before_any_job_runs(tmp_path):
    args = ["sweep", *BASE, "norm=layernorm,rmsnorm", f"out_dir={tmp_path}"]
    res = run_ablate(*args)
    assert res.returncode == 0, res.stderr
    runs = find_run_dirs(tmp_path)
    before = {run: files(run) for run in runs}
    sweep_dir = runs[0].parent
    res = run_ablate(*args, "model.d_model=64", f"hydra.sweep.dir={sweep_dir}")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert f"{runs[0]} holds a completed run with model.d_model=32; this config has model.d_model=64" in res.stderr
    assert {run: files(run) for run in runs} == before


def test_a_checkpoint_of_another_world_size_is_refused_in_one_line(finished):
    """A checkpoint of 2 ranks resumed by 1 process would continue at half the global batch."""
    step, path = checkpoint.list_checkpoints(finished)[-1]
    state = checkpoint.load_file(path)
    state.update(world_size=2, strategy="ddp")
    checkpoint.save(finished, step, state)
    unfinish(finished)
    before = files(finished)
    res = run_ablate("run", *BASE, f"hydra.run.dir={finished}", FLAG)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"error: the checkpoint of step 6 in {checkpoint.ckpt_dir(finished)} was written by 2 processes "
        "(ddp), this run has 1 process: resume with the same train.nproc and train.strategy, or start "
        "over with train.resume=never"]
    assert files(finished) == before


def test_a_one_process_checkpoint_is_refused_by_two_ranks_before_they_start(finished):
    unfinish(finished)
    res = run_ablate("run", *BASE, "train.nproc=2", f"hydra.run.dir={finished}")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"error: the checkpoint of step 6 in {checkpoint.ckpt_dir(finished)} was written by 1 process, "
        "this run has 2 processes (ddp): resume with the same train.nproc and train.strategy, or start "
        "over with train.resume=never"]
    assert not (finished / "torchrun.log").exists()


def test_a_checkpoint_past_train_steps_is_refused(finished):
    before = files(finished)
    res = run_ablate("run", *[o for o in BASE if not o.startswith("train.steps")], "train.steps=4",
                     f"hydra.run.dir={finished}", FLAG)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"error: {finished} holds a completed run with train.steps=6; this config has train.steps=4: "
        "use another directory (hydra.run.dir / hydra.sweep.dir), or start it over with train.resume=never"]
    assert files(finished) == before


def test_a_diverged_run_re_entered_unchanged_returns_its_outcome_without_training(tmp_path):
    run = tmp_path / "run"
    res = run_ablate("run", *UNSTABLE, f"hydra.run.dir={run}")
    assert res.returncode == 0 and json.loads((run / "summary.json").read_text())["status"] == "diverged"
    before = files(run)
    res = run_ablate("run", *UNSTABLE, "train.progress=true", f"hydra.run.dir={run}")  # display only
    assert res.returncode == 0, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"{run} already diverged at step {json.loads(before['summary.json'])['step']} "
        f"({json.loads(before['summary.json'])['reason']}); returning that outcome without training "
        "(train.resume=never trains it again)"]
    assert files(run) == before


def test_re_entering_a_finished_run_keeps_its_timings_and_an_extended_run_adds_them_up(finished):
    first = json.loads((finished / "summary.json").read_text())
    first.update(wall_time_s=1000.0)  # as if it had trained for a while
    (finished / "summary.json").write_text(json.dumps(first))
    res = run_ablate("run", *BASE, f"hydra.run.dir={finished}")
    assert res.returncode == 0, res.stderr
    assert json.loads((finished / "summary.json").read_text()) == first  # returned, not rewritten

    res = run_ablate("run", *[o for o in BASE if not o.startswith("train.steps")], "train.steps=8",
                     "train.extend=true", f"hydra.run.dir={finished}")
    assert res.returncode == 0, res.stderr
    longer = json.loads((finished / "summary.json").read_text())
    assert longer["step"] == 8 and longer["resumed_from"] == 6 and longer["extended_from"] == 6
    assert 1000.0 < longer["wall_time_s"] < 1000.0 + 600  # both segments
    assert longer["time_to_first_step_s"] == first["time_to_first_step_s"]
