"""Issue 6: sweeps that really run. One sweep directory, one job directory per variant named by
its change, the comparison at the end; a failing job does not stop the others; the slurm
launcher renders the sbatch script it would submit."""

from __future__ import annotations

import json

import pytest

from conftest import TINY, find_run_dirs, run_ablate

ONE_THREAD = ["train.threads=1"]


def summaries(root):
    return {d.name: json.loads((d / "summary.json").read_text()) for d in find_run_dirs(root)}


@pytest.mark.slow
def test_ofat_sweep_with_submitit_local_runs_three_variants(tmp_path):
    res = run_ablate("sweep", *TINY, *ONE_THREAD, "launcher=submitit_local", f"out_dir={tmp_path}",
                     "norm=layernorm,rmsnorm", "act=gelu,swiglu", timeout=300)
    assert res.returncode == 0, res.stderr
    (sweep_dir,) = (tmp_path / "sweeps").iterdir()
    runs = summaries(sweep_dir)
    assert sorted(runs) == ["0_baseline", "1_norm=rmsnorm", "2_act=swiglu"]
    assert {s["status"] for s in runs.values()} == {"completed"}
    assert runs["1_norm=rmsnorm"]["axes"]["norm"] == "rmsnorm"
    assert runs["1_norm=rmsnorm"]["axes"]["act"] == "gelu"  # held at the baseline
    assert {s["sweep"] for s in runs.values()} == {sweep_dir.name}  # the W&B group
    assert [r for r in (sweep_dir / ".submitit").iterdir()]  # it went through submitit
    # `ablate compare` of the sweep dir (printed at the end) sees the three variants
    assert "3/3 jobs finished" in res.stdout and "ablate compare" in res.stdout
    from ablate.tracking.compare import compare_dirs

    rows = compare_dirs([sweep_dir])
    assert [r["variant"] for r in rows] == ["baseline", "norm=rmsnorm", "act=swiglu"]
    assert rows[0]["baseline"] and all(r["n"] == 1 for r in rows)


def test_failing_and_diverging_jobs_do_not_stop_the_sweep(tmp_path):
    tiny_file = tmp_path / "tiny.txt"  # passes the checks, fails at run time: too few tokens
    tiny_file.write_text("hi\n")
    res = run_ablate("sweep", *TINY, *ONE_THREAD, f"out_dir={tmp_path}", f"data.paths=[{tiny_file}]",
                     "train.warmup_steps=0", "train.grad_clip=0",
                     "data=shakespeare,text_files", "train.lr=0.003,1e9")
    assert res.returncode == 0, res.stderr  # some jobs finished
    runs = summaries(tmp_path / "sweeps")
    assert runs["0_baseline"]["status"] == "completed"
    assert runs["1_data=text_files"]["status"] == "failed"
    (lr_job,) = [name for name in runs if name.startswith("2_train.lr=")]
    assert runs[lr_job]["status"] == "diverged"
    assert "failed: #1 data=text_files" in res.stderr and "Traceback" not in res.stderr
    assert "2/3 jobs finished (1 diverged)" in res.stdout


def test_a_sweep_where_every_job_fails_exits_non_zero(tmp_path):
    tiny_file = tmp_path / "tiny.txt"
    tiny_file.write_text("hi\n")
    res = run_ablate("sweep", *TINY, *ONE_THREAD, f"out_dir={tmp_path}", "data=text_files",
                     f"data.paths=[{tiny_file}]", "train.lr=0.003,0.001")
    assert res.returncode != 0
    assert res.stderr.count("failed: #") == 2 and "0/2 jobs finished" in res.stdout


def test_slurm_launcher_composes_and_renders_the_sbatch_script(tmp_path):
    res = run_ablate("sweep", "launcher=slurm", "hydra.launcher.partition=gpu",
                     "hydra.launcher.account=lab", "hydra.launcher.gpus_per_node=4",
                     "hydra.launcher.tasks_per_node=4", "hydra.launcher.timeout_min=30",
                     "hydra.launcher.mem_gb=128", "norm=layernorm,rmsnorm", "--seeds", "3",
                     f"out_dir={tmp_path}", "--dry-run")
    assert res.returncode == 0, res.stderr
    script = res.stdout[res.stdout.index("#!/bin/bash"):]
    for line in ("#SBATCH --partition=gpu", "#SBATCH --account=lab", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --ntasks-per-node=4", "#SBATCH --time=30", "#SBATCH --mem=128GB",
                 "#SBATCH --cpus-per-task=8", "#SBATCH --signal=USR2@120"):
        assert line in script, line
    assert "srun" in script and "6 jobs" in res.stdout
    assert not list(tmp_path.iterdir())
