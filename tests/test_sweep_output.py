"""What a sweep prints. One line per job as it ends (name, status, final val_loss,
time, jobs left, ETA) and none of Hydra's launcher chatter; --strict fails the sweep when any
job did not complete; any installed Hydra sweeper runs through `ablate sweep`."""

from __future__ import annotations

import json
import logging
import re

from conftest import TINY, find_run_dirs, run_ablate

ONE_THREAD = ["train.threads=1"]


def job_lines(res) -> list[str]:
    return [ln for ln in res.stdout.splitlines() if re.match(r"\[\d+/\d+\] ", ln)]


def test_one_line_per_job_no_hydra_chatter_and_strict_fails_on_a_diverged_job(tmp_path):
    sweep_dir = tmp_path / "s"
    res = run_ablate("sweep", *TINY, *ONE_THREAD, f"hydra.sweep.dir={sweep_dir}", "--strict",
                     "train.warmup_steps=0", "train.grad_clip=0", "train.eval_every=1",
                     "train.lr=0.003,1000")
    assert res.returncode == 1, res.stderr  # a job diverged: --strict fails the sweep
    assert "Launching" not in res.stdout + res.stderr and "#0 :" not in res.stdout + res.stderr
    lines = job_lines(res)
    assert len(lines) == 2, res.stdout
    val = json.loads((sweep_dir / "0_baseline" / "summary.json").read_text())["val_loss"]
    assert re.fullmatch(rf"\[1/2\] baseline  completed  val_loss {val:.4f}  \d+s  1 left  ETA \d+s",
                        lines[0]), lines[0]
    # the loss it measured before diverging is not a result: `-`, as compare's table says
    assert json.loads((sweep_dir / "1_train.lr=1000" / "summary.json").read_text())["val_loss"] is not None
    assert re.fullmatch(r"\[2/2\] train\.lr=1000  diverged  val_loss -  \d+s  0 left  done", lines[1])
    assert "--strict: 1 of 2 jobs did not complete (train.lr=1000: diverged)" in res.stderr
    # resumed, the sweep runs neither job again and says so instead of a time
    again = job_lines(run_ablate("resume", str(sweep_dir)))
    assert again == [f"[1/2] baseline  completed  val_loss {val:.4f}  done earlier  1 left  ETA -",
                     "[2/2] train.lr=1000  diverged  val_loss -  done earlier  0 left  done"], again


def test_hydra_basic_sweeper_runs_through_ablate_sweep(tmp_path):
    res = run_ablate("sweep", "hydra/sweeper=basic", *TINY, *ONE_THREAD, f"out_dir={tmp_path}",
                     "norm=layernorm,rmsnorm")
    assert res.returncode == 0, res.stderr
    norms = sorted(json.loads((d / "summary.json").read_text())["axes"]["norm"]
                   for d in find_run_dirs(tmp_path))
    assert norms == ["layernorm", "rmsnorm"]
    # ablate's own options do not exist on another sweeper: one line, nothing launched
    bad = run_ablate("sweep", "hydra/sweeper=basic", "--seeds", "2", *TINY, f"out_dir={tmp_path / 'b'}",
                     "norm=layernorm,rmsnorm")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --seeds apply to ablate's sweeper")
    assert not (tmp_path / "b").exists()


def test_eta_is_the_mean_job_time_times_the_jobs_left():
    from ablate.sweep import Job
    from ablate.sweep.progress import JobResult, Progress

    now = [100.0]
    p = Progress(4, clock=lambda: now[0])
    now[0] += 30
    line = p.line(JobResult(Job([], "a"), "completed"), 30.0)
    assert line == "[1/4] a  completed  val_loss -  30s  3 left  ETA 1m30s"
    now[0] += 90  # 120 s for two jobs: 60 s each, two left
    assert p.line(JobResult(Job([], "b"), "failed"), 90.0).endswith("1m30s  2 left  ETA 2m00s")


def test_eta_weighs_the_jobs_left_by_their_training_flops():
    """A ladder's last rungs cost more than its first: the ETA counts their FLOPs, not jobs."""
    from ablate.sweep import Job
    from ablate.sweep.progress import JobResult, Progress, job_flops
    from conftest import compose

    small, large = compose(TINY), compose(TINY + ["model.d_model=64", "train.steps=40"])
    ratio = job_flops(large) / job_flops(small)
    assert ratio > 4
    jobs = [Job([], "s0"), Job([], "s1"), Job([], "l0")]
    now = [0.0]
    p = Progress(4, clock=lambda: now[0])  # the fourth job is a later phase's: the mean job
    p.expect(jobs, [small, small, large])
    now[0] += 10
    line = p.line(JobResult(jobs[0], "completed"), 10.0)
    mean = (2 + ratio) / 3
    assert line.endswith(f"ETA {_fmt(10 * (1 + ratio + mean))}")
    p.line(JobResult(jobs[1], "completed", earlier=True), None)  # done earlier: no time, no work
    now[0] += 10 * ratio
    assert p.line(JobResult(jobs[2], "completed"), 10 * ratio).endswith(f"1 left  ETA {_fmt(10 * mean)}")


def _fmt(seconds: float) -> str:
    from ablate.sweep.progress import _duration

    return _duration(seconds)


def test_launcher_logs_are_hidden_unless_hydra_verbose():
    from ablate.sweep.progress import quiet_launcher_logs

    lg = logging.getLogger("hydra._internal.core_plugins.basic_launcher")
    before = lg.level
    with quiet_launcher_logs(False):
        assert not lg.isEnabledFor(logging.INFO)
    assert lg.level == before
    with quiet_launcher_logs(True):
        assert lg.level == before  # hydra.verbose: Hydra's own levels stand
