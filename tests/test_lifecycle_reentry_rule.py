"""The one rule for re-entering a run directory (ablate/run/lifecycle.py): a finished run's results
change only when the user asks for it by name (`--extend`, `train.resume=never`), whichever way
the directory is entered (`run` into it, `resume`, a sweep re-run); a killed run loses at most
one evaluation interval and says so when it has to start over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import TINY, compose, copy_of_trained_run, find_run_dirs, read_jsonl, run_ablate

BASE = [o for o in TINY if not o.startswith("train.steps")] + ["train.threads=1", "train.steps=10"]


def snapshot(run_dir) -> dict:
    """Every file of a run directory, by content (.hydra's record and the checkpoints included)."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.fixture
def finished(tmp_path_factory, tmp_path):
    return copy_of_trained_run(tmp_path_factory, tmp_path, *BASE)


def test_the_same_experiment_returns_the_recorded_result_and_writes_nothing(finished):
    before = snapshot(finished)
    for args in (["run", *BASE, "logger=none", f"hydra.run.dir={finished}"], ["resume", str(finished)]):
        res = run_ablate(*args)
        assert res.returncode == 0, res.stderr
        assert res.stderr.strip() == (f"{finished} already completed (step 10/10); returning its result "
                                      f"(to train further: ablate resume {finished} --extend STEPS)")
        assert snapshot(finished) == before


@pytest.mark.parametrize("how", ["run", "resume"])
def test_more_steps_without_asking_is_refused_and_names_the_key(finished, how):
    before = snapshot(finished)
    args = (["run", *BASE, "train.steps=12", f"hydra.run.dir={finished}"] if how == "run"
            else ["resume", str(finished), "train.steps=12"])
    res = run_ablate(*args)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"error: {finished} holds a completed run with train.steps=10; this config has train.steps=12: "
        f"to train it further, extend it by name: ablate resume {finished} --extend 12; or use another "
        "directory (hydra.run.dir / hydra.sweep.dir), or start it over with train.resume=never"]
    assert snapshot(finished) == before


# A Hydra flag makes `ablate run` skip its pre-flight (as `--cfg`, `--info`): the job checks alone,
# after Hydra has written its own .hydra/ record of the new config.
@pytest.mark.parametrize("flags, hydras", [([], None), (["--config-name=config"], ".hydra/")],
                         ids=["pre-flight", "inside-the-job"])
def test_another_experiment_in_a_finished_directory_is_refused(finished, flags, hydras):
    def record():  # the run's files (all but Hydra's own record where Hydra writes it)
        return {name: data for name, data in snapshot(finished).items()
                if hydras is None or not name.startswith(hydras)}

    before = record()
    res = run_ablate("run", *BASE, "train.lr=0.01", f"hydra.run.dir={finished}", *flags)
    assert res.returncode == 2
    # only more steps of a completed run can be extended: no --extend here
    assert res.stderr.strip().splitlines() == [
        f"error: {finished} holds a completed run with train.lr=0.003; this config has train.lr=0.01: "
        "use another directory (hydra.run.dir / hydra.sweep.dir), or start it over with train.resume=never"]
    assert record() == before


def test_extend_trains_further_at_the_rate_the_schedule_ended_with(finished):
    rows_before = read_jsonl(finished / "metrics.jsonl")
    res = run_ablate("resume", str(finished), "--extend", "14")
    assert res.returncode == 0, res.stderr
    assert f"extending {finished} from step 10 to 14 (train.extend=true)" in res.stderr
    summary = json.loads((finished / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["step"] == 14 and summary["steps"] == 14
    assert summary["extended_from"] == 10 and summary["resumed_from"] == 10
    rows = read_jsonl(finished / "metrics.jsonl")
    assert rows[:len(rows_before)] == rows_before  # the first 10 steps' record is kept as it was
    cfg = dict(o.split("=", 1) for o in BASE if o.startswith("train."))
    floor = float(cfg.get("train.lr", 3e-3)) * 0.1  # min_lr_ratio x lr: where cosine ended
    extra = [r for r in rows if "lr" in r and r["step"] > 10]
    assert [r["step"] for r in extra] == [11, 12, 13, 14]
    assert all(r["lr"] == pytest.approx(floor) for r in extra)
    again = run_ablate("resume", str(finished))  # the extended run is finished too
    assert again.returncode == 0 and "already completed (step 14/14)" in again.stderr


def test_a_sweep_rerun_with_more_steps_is_refused_before_any_job_runs(tmp_path):
    args = ["sweep", *BASE, "norm=layernorm,rmsnorm", f"hydra.sweep.dir={tmp_path / 'sw'}"]
    res = run_ablate(*args)
    assert res.returncode == 0, res.stderr
    runs = find_run_dirs(tmp_path)
    before = {run: snapshot(run) for run in runs}
    res = run_ablate(*args, "train.steps=12")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: job #0 (baseline): ")
    assert "train.steps=10; this config has train.steps=12" in lines[0]
    assert {run: snapshot(run) for run in runs} == before
    same = run_ablate(*args)  # the same sweep again: every job returns its record
    assert same.returncode == 0 and "done earlier" in same.stdout
    assert {run: snapshot(run) for run in runs} == before


def _kill_when(args: list, run_dir, ready) -> None:
    """Start `ablate run`, SIGKILL it once ready(metrics rows) holds (no warning: an OOM kill)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "run", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        try:
            rows = read_jsonl(run_dir / "metrics.jsonl")
        except (OSError, ValueError):  # not there yet, or a line half written
            rows = []
        if ready(rows):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert ready(read_jsonl(run_dir / "metrics.jsonl")), "the run ended before it could be killed"


def test_a_run_killed_after_its_second_evaluation_resumes_past_the_first(tmp_path):
    run = tmp_path / "run"
    args = [o for o in BASE if not o.startswith(("train.steps", "train.eval_every"))]
    args += ["train.steps=400", "train.eval_every=20", f"hydra.run.dir={run}"]  # ckpt_every: default
    _kill_when(args, run, lambda rows: sum("val_loss" in r and r["step"] > 0 for r in rows) >= 2)
    assert json.loads((run / "summary.json").read_text())["status"] == "running"  # no record written
    res = run_ablate("resume", str(run))
    assert res.returncode == 0, res.stderr
    first = res.stderr.splitlines()[0]
    assert first.startswith(f"{run} was killed") and "resuming from its checkpoint of step" in first
    resumed = json.loads((run / "summary.json").read_text())
    assert resumed["status"] == "completed" and resumed["resumed_from"] >= 40 > 20


def test_a_killed_run_without_a_checkpoint_says_it_starts_over(tmp_path):
    run = tmp_path / "run"
    args = [o for o in BASE if not o.startswith(("train.steps", "train.eval_every", "train.log_every"))]
    args += ["train.steps=60", "train.eval_every=0", "train.log_every=5", f"hydra.run.dir={run}"]
    _kill_when(args, run, lambda rows: len(rows) >= 2)
    last = max(r["step"] for r in read_jsonl(run / "metrics.jsonl"))
    res = run_ablate("resume", str(run))
    assert res.returncode == 0, res.stderr
    assert (f"{run} (killed) has no checkpoint: starting from step 0 (it had logged up to step {last})"
            in res.stderr.splitlines()[0])
    assert json.loads((run / "summary.json").read_text())["resumed_from"] is None


def test_an_automatic_warmup_is_the_same_experiment_as_the_count_it_gives():
    """A run recorded with a warmup count (set by hand, or before the automatic warmup existed,
    without its keys) is re-entered with the automatic one where that gives the same count; two
    automatic warmups differ only where their rule does, so an extended run stays the same run."""
    from omegaconf import OmegaConf

    from ablate.run.lifecycle import differences

    auto = compose(BASE)  # TINY: 40% of the steps, at most 2: 2 of 10
    recorded = OmegaConf.to_container(auto, resolve=True)
    for key in ("warmup_fraction", "warmup_max_steps"):
        del recorded["train"][key]
    recorded["train"]["warmup_steps"] = 2
    assert differences(recorded, auto) == []
    recorded["train"]["warmup_steps"] = 3
    assert differences(recorded, auto) == [("train.warmup_steps", 3, 2)]
    uncapped = [*BASE, "train.warmup_max_steps=100"]  # 4 of 10 steps, 16 of 40
    shorter, longer = compose(uncapped), compose([*uncapped, "train.steps=40"])
    assert differences(OmegaConf.to_container(shorter, resolve=True), longer) == [("train.steps", 10, 40)]
    faster = compose([*BASE, "train.warmup_fraction=0.1"])
    assert differences(OmegaConf.to_container(auto, resolve=True), faster) == [
        ("train.warmup_fraction", 0.4, 0.1)]
