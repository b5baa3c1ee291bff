"""Several sweep jobs share one device (`ablate sweep --jobs-per-gpu K`) and
`ablate bench --jobs-per-device` times a small sweep at K jobs at a time. No GPU here: the
placement logic is tested on a fake 2-GPU machine; the runs pin the CPU, where K jobs per
device means K processes sharing the cores."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import TINY, find_run_dirs, run_ablate

from ablate.sweep import machine
from ablate.sweep import placement as S
from ablate.sweep.launchers import LAUNCHERS
from ablate.errors import ConfigError

NOT_CPU = [o for o in TINY if not o.startswith("train.device=")]  # device: auto (no GPU here)


def fake_config(target: str, task=(), **launcher):
    return OmegaConf.create({"hydra": {"launcher": {"_target_": target, **launcher},
                                       "overrides": {"task": list(task)}}})


def job(device="auto", threads=0, nproc=1):
    return OmegaConf.create({"train": {"device": device, "threads": threads, "nproc": nproc}})


JOBLIB = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"
SLURM = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"


@pytest.fixture
def two_gpus(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(machine, "usable_cores", lambda: 16)


def test_joblib_on_two_gpus_runs_k_per_gpu_and_cycles_devices(two_gpus):
    p = S.plan_packing(4, fake_config(JOBLIB, n_jobs=2), job())
    assert p.n_jobs == 8 and p.group == 1  # 2 GPUs x 4; the yaml's n_jobs=2 was not the user's
    assert [p.overrides(i)[0] for i in range(4)] == ["train.device=cuda:0", "train.device=cuda:1"] * 2
    assert p.overrides(5) == ["train.device=cuda:1", "train.threads=2"]  # 16 cores / 8 jobs


def test_user_choices_win(two_gpus):
    # n_jobs given on the command line; placement still cycles over both GPUs
    p = S.plan_packing(4, fake_config(JOBLIB, ["hydra.launcher.n_jobs=3"], n_jobs=3), job())
    assert p.n_jobs == 3 and p.threads == 16 // 3 and len(p.devices) == 2
    # a chosen device: every job stays there, k of them at once
    p = S.plan_packing(4, fake_config(JOBLIB, n_jobs=2), job(device="cuda:1"))
    assert p.n_jobs == 4 and p.devices == [] and p.overrides(1) == ["train.threads=4"]
    # chosen threads are kept
    assert S.plan_packing(2, fake_config(JOBLIB, n_jobs=2), job(threads=3)).overrides(0) == \
        ["train.device=cuda:0"]


def test_a_cpu_only_machine_is_one_device(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(machine, "usable_cores", lambda: 2)
    p = S.plan_packing(2, fake_config(JOBLIB, n_jobs=2), job())
    assert (p.n_jobs, p.devices, p.overrides(0)) == (2, [], ["train.threads=1"])


def test_slurm_groups_k_jobs_per_gpu_of_the_allocation(two_gpus):
    # the allocation, not this machine: 2 GPUs and 8 cores per task -> 2 x 3 jobs per task
    p = S.plan_packing(3, fake_config(SLURM, gpus_per_node=2, cpus_per_task=8, tasks_per_node=1), job())
    assert (p.group, p.n_jobs, p.threads) == (6, 6, 1)
    assert p.overrides(4)[0] == "train.device=cuda:0"


def test_packing_refuses_what_it_cannot_pack():
    with pytest.raises(ConfigError, match="launcher=basic"):
        S.check_launcher_packs(LAUNCHERS["basic"])
    with pytest.raises(ConfigError, match="single-process"):
        S.plan_packing(2, fake_config(SLURM, gpus_per_node=1, cpus_per_task=8, tasks_per_node=2), job())
    with pytest.raises(ConfigError, match="single-process"):
        S.plan_packing(2, fake_config(JOBLIB, n_jobs=2), job(nproc=2))
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ConfigError, match="jobs_per_gpu must be an integer >= 1"):
            S.check_jobs_per_gpu(bad)


@pytest.mark.parametrize("args, message", [
    (["--jobs-per-gpu", "0", "launcher=joblib"], "jobs_per_gpu must be an integer >= 1, got 0"),
    (["hydra.sweeper.jobs_per_gpu=-1", "launcher=joblib"], "jobs_per_gpu must be an integer >= 1"),
    (["--jobs-per-gpu", "2"], "launcher=basic"),  # the default launcher runs one job at a time
])
def test_bad_jobs_per_gpu_is_one_line_and_nothing_runs(tmp_path, args, message):
    res = run_ablate("sweep", *TINY, f"out_dir={tmp_path}", "act=gelu,swiglu", *args, timeout=120)
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], res.stderr
    assert not find_run_dirs(tmp_path)


def test_slurm_dry_run_shows_the_grouped_array(tmp_path):
    res = run_ablate("sweep", *NOT_CPU, f"out_dir={tmp_path}", "act=gelu,swiglu", "--seeds", "3",
                     "launcher=slurm", "--jobs-per-gpu", "2", "--dry-run", timeout=120)
    assert res.returncode == 0, res.stderr
    assert "6 jobs" in res.stdout
    assert "#SBATCH --array=0-2%3" in res.stdout  # 6 jobs, 2 per task: 3 array tasks
    assert "2 sweep jobs at once in each task" in res.stdout
    assert "train.device=cuda:0" in res.stdout  # gpus_per_node=1: every job of a task on it
    assert not (tmp_path / "sweeps").exists()


def spans(sweep_dir: Path) -> dict:
    """Each job's (start, end): its config.yaml is written as it starts, its summary.json last."""
    return {d.name: ((d / "config.yaml").stat().st_mtime_ns, (d / "summary.json").stat().st_mtime_ns)
            for d in find_run_dirs(sweep_dir)}


def finished_sweep(res, tmp_path: Path) -> tuple[Path, dict]:
    """The one sweep directory under tmp_path and its runs' summaries, by run directory name."""
    assert res.returncode == 0, res.stderr
    (sweep_dir,) = (tmp_path / "sweeps").iterdir()
    return sweep_dir, {d.name: json.loads((d / "summary.json").read_text()) for d in find_run_dirs(sweep_dir)}


def all_overlap(spans: dict) -> bool:
    return max(s for s, _ in spans.values()) < min(e for _, e in spans.values())


@pytest.mark.slow  # ~30 s on 2 busy cores: three processes each import torch
def test_joblib_sweep_runs_k_jobs_at_once(tmp_path):
    res = run_ablate("sweep", *NOT_CPU, f"out_dir={tmp_path}", "act=gelu,swiglu,relu",
                     "launcher=joblib", "--jobs-per-gpu", "3", timeout=300)
    sweep_dir, runs = finished_sweep(res, tmp_path)
    assert len(runs) == 3 and {s["status"] for s in runs.values()} == {"completed"}
    assert all_overlap(spans(sweep_dir)), spans(sweep_dir)  # all three ran at the same time
    cores = len(os.sched_getaffinity(0))
    for d in find_run_dirs(sweep_dir):
        train = OmegaConf.load(d / "config.yaml").train
        assert train.threads == max(1, cores // 3) and train.device == "auto"
    assert OmegaConf.load(sweep_dir / "multirun.yaml").hydra.launcher.n_jobs == 3
    assert "3 jobs per device on one device: 3 at once" in res.stdout


@pytest.mark.slow
def test_submitit_runs_k_jobs_in_one_task(tmp_path):
    res = run_ablate("sweep", *TINY, f"out_dir={tmp_path}", "act=gelu,swiglu",
                     "launcher=submitit_local", "--jobs-per-gpu", "2", timeout=300)
    sweep_dir, runs = finished_sweep(res, tmp_path)
    assert sorted(runs) == ["0_baseline", "1_act=swiglu"]
    assert {s["status"] for s in runs.values()} == {"completed"}
    tasks = [d for d in (sweep_dir / ".submitit").iterdir() if list(d.glob("*_result.pkl"))]
    assert len(tasks) == 1  # one submitit task ran both jobs
    assert all_overlap(spans(sweep_dir))
    assert "2/2 jobs finished" in res.stdout


@pytest.mark.slow  # ~20 s: four processes each import torch
def test_bench_jobs_per_device_reports_consistent_numbers():
    res = run_ablate("bench", *TINY, "--jobs-per-device", "1,2", "--sweep-jobs", "2", "--steps", "3",
                     "--warmup", "1", "--json", timeout=300)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert [r["jobs_per_device"] for r in out["rows"]] == [1, 2]
    tps = out["tokens_per_step"]
    assert tps == 4 * 32  # TINY: batch 4 x seq 32
    cores = out["cores"]
    for r in out["rows"]:
        assert len(r["jobs"]) == 2
        assert r["tokens"] == 2 * 3 * tps  # jobs x steps x tokens/step
        assert r["tokens_per_s"] == pytest.approx(r["tokens"] / r["wall_s"])
        assert r["threads_per_job"] == max(1, cores // r["jobs_per_device"])
        assert all(j["threads"] == r["threads_per_job"] for j in r["jobs"])
        assert all(not j["hydra_imported"] and j["loss_finite"] for j in r["jobs"])
        # each job's timed steps last no longer than the whole sweep
        assert all(tps * 3 / j["tokens_per_s"] <= r["wall_s"] for j in r["jobs"])
    one, two = out["rows"]
    assert two["speedup"] == pytest.approx(one["wall_s"] / two["wall_s"])
    # k=1 ran the jobs one after the other, k=2 both at once (from start-up to the last step)
    a, b = one["jobs"]
    assert min(a["timed_to"], b["timed_to"]) <= max(a["started"], b["started"])
    a, b = two["jobs"]
    assert max(a["started"], b["started"]) < min(a["timed_to"], b["timed_to"])


@pytest.mark.parametrize("args, message", [
    (["--jobs-per-device", "0,2"], "--jobs-per-device takes a list of integers >= 1"),
    (["--jobs-per-device", "1,x"], "--jobs-per-device takes a list of integers >= 1"),
    (["--jobs-per-device", "1,2", "--reference"], "--jobs-per-device times whole processes"),
    (["--jobs-per-device", "1", "--sweep-jobs", "0"], "--sweep-jobs must be >= 1"),
])
def test_bench_jobs_per_device_bad_input(args, message):
    res = run_ablate("bench", *TINY, *args, timeout=120)
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], res.stderr


def test_a_failing_bench_job_is_one_line():
    import sys

    from ablate.measure.bench import _pool
    from ablate.errors import AblateError

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    with pytest.raises(AblateError) as e:
        _pool(["{not json"], 1, env)
    assert "bench job #0 at 1 jobs per device failed: error: JSONDecodeError" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_a_packed_task_preempted_requeues_and_every_job_resumes(tmp_path):
    """SLURM's USR2 reaches the array task: both of its jobs checkpoint, submitit requeues the
    task, and both resume from their checkpoints to the last step."""
    import signal
    import subprocess
    import sys
    import time

    from conftest import ROOT

    steps = 500  # both jobs are past step 30 when signalled: hundreds of steps still to go
    long = [o for o in TINY if not o.startswith("train.steps")] + [f"train.steps={steps}"]
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "sweep", *long, "launcher=submitit_local",
                             "--seeds", "2", "--jobs-per-gpu", "2", f"out_dir={tmp_path}"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end, pids = time.time() + 120, {}
    while time.time() < end and len(pids) < 2:  # both jobs training
        for metrics in tmp_path.rglob("metrics.jsonl"):
            if len(metrics.read_text().splitlines()) > 30:
                pids[metrics.parent] = json.loads((metrics.parent / "summary.json").read_text())["pid"]
        time.sleep(0.2)
    assert len(pids) == 2, "the jobs did not start"
    parents = {int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) for pid in pids.values()}
    assert len(parents) == 1  # one task runs both jobs
    os.kill(parents.pop(), signal.SIGUSR2)  # to the task, as SLURM signals it
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    for run_dir in pids:
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["step"] == steps
        assert summary["previous_status"] == "preempted" and 0 < summary["resumed_from"] < steps
    logs = "".join(p.read_text() for p in (tmp_path / "sweeps").rglob(".submitit/*/*.err"))
    assert "this job is preempted" in logs  # submitit's handler requeued the task
