"""`ablate resume DIR`: a stopped run continues from its checkpoint with its own overrides (no
retyping, default directory names with '=' and ','), a finished one says so, and a sweep
directory replays its sweep pinned to that directory."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import yaml

from conftest import ROOT, TINY, find_run_dirs, invoke_ablate, run_ablate, train_rows

LONG = [o for o in TINY if not o.startswith("train.steps")] + ["train.steps=300", "train.threads=1"]


def test_a_stopped_run_prints_and_accepts_its_resume_command(tmp_path):
    out = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "run", *LONG, "act=relu", f"out_dir={out}"],
                           cwd=ROOT, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    end = time.time() + 120
    while not (find_run_dirs(out) and train_rows(find_run_dirs(out)[0]) >= 3):
        assert proc.poll() is None, proc.stderr.read()
        assert time.time() < end
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    run = find_run_dirs(out)[0]
    assert "=" in run.name and "," in run.name  # the default name: the overrides
    stopped = json.loads((run / "summary.json").read_text())["step"]
    last = err.strip().splitlines()[-1]
    assert last.endswith(f"resume with: ablate resume {shlex.quote(str(run))}"), last
    assert last in (run / "ablate.log").read_text()  # a cluster job's log says it too

    # the printed command, with an override that does not change what is trained
    res = run_ablate("resume", str(run), "train.progress=false")
    assert res.returncode == 0, res.stderr
    assert f"was interrupted at step {stopped}/300; resuming from its checkpoint of step {stopped}" in res.stderr
    done = json.loads((run / "summary.json").read_text())
    assert done["status"] == "completed" and done["resumed_from"] == stopped and done["step"] == 300
    assert done["axes"]["act"] == "relu"  # the recorded overrides were replayed
    assert find_run_dirs(out) == [run]  # no new directory

    again = run_ablate("resume", str(run))
    assert again.returncode == 0
    assert again.stderr.strip() == (f"{run} already completed (step 300/300); returning its result "
                                    f"(to train further: ablate resume {shlex.quote(str(run))} --extend STEPS)")
    assert json.loads((run / "summary.json").read_text()) == done


def test_resume_refuses_what_is_not_a_run(tmp_path):
    res = invoke_ablate("resume", str(tmp_path / "nope"))
    assert res.returncode == 2 and res.stderr.strip() == f"error: no such directory: {tmp_path / 'nope'}"
    res = invoke_ablate("resume", str(tmp_path))
    assert res.returncode == 2 and "not a run directory" in res.stderr and "Traceback" not in res.stderr


def test_a_diverged_run_is_not_trained_again(tmp_path):
    from conftest import compose

    from ablate.run.lifecycle import RETURN, check_reentry

    (tmp_path / "summary.json").write_text(json.dumps(
        {"status": "diverged", "step": 7, "steps": 50, "reason": "non-finite loss"}))
    decision = check_reentry(tmp_path, compose(TINY))
    assert decision.action == RETURN
    assert decision.notice.startswith(f"{tmp_path} already diverged at step 7 (non-finite loss)")


def test_a_sweep_directory_replays_its_sweep_pinned_to_it(tmp_path):
    from cli.resume import run_args, sweep_args

    sweep = tmp_path / "2026-11-23_10-41-50"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": {
        "hydra": ["hydra.sweeper.mode=grid", "hydra.sweeper.seeds=3", "hydra.mode=MULTIRUN",
                  "hydra.launcher.partition=gpu"],
        "task": ["launcher=slurm", "norm=layernorm,rmsnorm", "train.steps=100"]}}}))
    assert sweep_args(sweep, ["logger=none"]) == [
        "launcher=slurm", "norm=layernorm,rmsnorm", "train.steps=100", "hydra.sweeper.mode=grid",
        "hydra.sweeper.seeds=3", "hydra.launcher.partition=gpu", "logger=none", f"hydra.sweep.dir='{sweep}'"]

    run = tmp_path / "10-41-00_act=relu,train.steps=30"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["act=relu", "train.steps=30", "train.resume=never"]))
    assert run_args(run, []) == ["act=relu", "train.steps=30", "train.resume=auto", f"hydra.run.dir='{run}'"]


def test_a_sweep_job_resumed_on_its_own_keeps_its_name_and_its_sweep(tmp_path):
    """`ablate resume JOB_DIR` of a stopped sweep job: the run continues its record's identity
    (the name its sweeper gave it, the sweep it belongs to: its W&B group), not its overrides'."""
    run = tmp_path / "job3"
    assert run_ablate("run", *TINY, "norm=rmsnorm", f"hydra.run.dir={run}").returncode == 0
    summary = json.loads((run / "summary.json").read_text())
    summary.update(status="preempted", variant="norm=rmsnorm", sweep="sweep-0922")  # as its sweep left it
    (run / "summary.json").write_text(json.dumps(summary))
    res = run_ablate("resume", str(run))
    assert res.returncode == 0, res.stderr
    done = json.loads((run / "summary.json").read_text())
    assert (done["status"], done["variant"], done["sweep"]) == ("completed", "norm=rmsnorm", "sweep-0922")
    assert done["previous_status"] == "preempted"
