"""Preemption. SIGTERM mid-run: the run checkpoints and stops as `preempted`; the same
run started again in its directory resumes and ends at the same final step. Under submitit
(launcher=submitit_local: the SLURM code path without a cluster) the preempted job asks to be
requeued through submitit's checkpoint protocol, is restarted and resumes by itself."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from conftest import TINY, find_run_dirs, read_jsonl, run_ablate, start_ablate as start

STEPS = 500  # long enough to be interrupted after 30 steps (a tiny step takes ~1-10 ms)
LONG = [o for o in TINY if not o.startswith("train.steps")] + [f"train.steps={STEPS}", "train.threads=1"]


def wait_for_steps(root, n=30, timeout=120):
    """The run dir once its metrics show n steps (and the pid of the process training)."""
    end = time.time() + timeout
    while time.time() < end:
        for metrics in root.rglob("metrics.jsonl"):
            if len(metrics.read_text().splitlines()) > n:
                summary = json.loads((metrics.parent / "summary.json").read_text())
                return metrics.parent, summary["pid"]
        time.sleep(0.2)
    raise AssertionError("the run did not start")


@pytest.mark.slow
def test_sigterm_checkpoints_and_the_rerun_resumes_to_the_same_final_step(tmp_path):
    run_dir = tmp_path / "run"
    args = ("run", *LONG, f"hydra.run.dir={run_dir}")
    proc = start(*args)
    _, pid = wait_for_steps(tmp_path)
    assert pid == proc.pid
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "preempted", err
    stopped = summary["step"]
    assert 0 < stopped < STEPS
    ckpt = run_dir / "checkpoints" / f"step_{stopped:08d}.pt"
    assert ckpt.is_file()
    # outside submitit a stopped run is not a success: 130, as `ablate sweep` in this case
    assert proc.returncode == 130
    assert err.strip().splitlines() == [
        f"stopped at step {stopped} (signal SIGTERM); checkpoint {ckpt}; resume with: ablate resume {run_dir}"]

    res = run_ablate(*args)
    assert res.returncode == 0, res.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from"] == stopped
    assert summary["step"] == STEPS and summary["previous_status"] == "preempted"
    steps = [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if "train_loss" in r]
    assert steps == list(range(1, STEPS + 1))  # no step lost, none repeated


@pytest.mark.slow
def test_submitit_job_is_requeued_and_resumes(tmp_path):
    proc = start("sweep", *LONG, "launcher=submitit_local", "--seeds", "1", f"out_dir={tmp_path}")
    run_dir, pid = wait_for_steps(tmp_path)
    os.kill(pid, signal.SIGUSR2)  # submitit's preemption / time-limit signal
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["step"] == STEPS
    assert summary["previous_status"] == "preempted" and 0 < summary["resumed_from"] < STEPS
    logs = "".join(p.read_text() for p in (run_dir.parent / ".submitit").rglob("*.err"))
    assert "this job is preempted" in logs  # submitit's handler ran and requeued the job
    assert len(find_run_dirs(tmp_path)) == 1


@pytest.mark.slow
def test_sigterm_stops_a_sweep_and_the_same_sweep_dir_resumes_it(tmp_path):
    steps = 500
    args = ("sweep", *LONG, f"train.steps={steps}", "norm=layernorm,rmsnorm", f"out_dir={tmp_path}")
    proc = start(*args)
    run_dir, pid = wait_for_steps(tmp_path, n=10)
    assert pid == proc.pid  # the basic launcher trains in the sweep's own process
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "not finished: #0 baseline (preempted)" in err and "not finished: #1 norm=rmsnorm (not run)" in err
    assert len(find_run_dirs(tmp_path)) == 1  # the next job was not started
    sweep_dir = run_dir.parent
    res = run_ablate(*args, f"hydra.sweep.dir={sweep_dir}")
    assert res.returncode == 0, res.stderr
    first = json.loads((run_dir / "summary.json").read_text())
    assert first["status"] == "completed" and first["resumed_from"] and first["step"] == steps
    assert len(find_run_dirs(sweep_dir)) == 2 and "2/2 jobs finished" in res.stdout
