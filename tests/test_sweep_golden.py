"""What `ablate sweep ... --dry-run` prints (the job list, its JSON, the placement of packed jobs
and SLURM's sbatch script), frozen as files under tests/golden/sweep/ so the sweep code can be
moved without changing what a user sees.

A deliberate change of that output: regenerate the files and review the diff before committing,
    ABLATE_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q -n 0 tests/test_sweep_golden.py
    git diff tests/golden/sweep/

Paths are written as <TMP> (the test's directory) and <PYTHON> (this interpreter). The command
runs on one CPU core with no GPU visible, so placement and threads are the same on any machine."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest

from conftest import run_ablate

GOLDEN = Path(__file__).parent / "golden" / "sweep"
UPDATE = os.environ.get("ABLATE_UPDATE_GOLDEN") == "1"

MIXED = ["norm=layernorm,rmsnorm", "act=gelu,swiglu,relu", "train.lr=0.003,0.001"]
PAIR = ["act=gelu,swiglu"]
CASES = {
    "ofat.json": [*MIXED, "--json"],
    "ofat.txt": MIXED,
    "grid.json": [*PAIR, "norm=layernorm,rmsnorm", "--mode", "grid", "--json"],
    "grid.txt": [*PAIR, "norm=layernorm,rmsnorm", "--mode", "grid"],
    "seeds.json": [*PAIR, "--seeds", "2", "--json"],
    "seeds.txt": [*PAIR, "--seeds", "2"],
    "seeds_only.txt": ["--seeds", "3"],
    "study.json": ["study=gpt2_to_llama", "--json"],
    "study.txt": ["study=gpt2_to_llama"],
    "preset.txt": ["arch=gpt2,llama", "norm=layernorm,rmsnorm"],
    "launcher_joblib.txt": [*PAIR, "launcher=joblib"],
    "launcher_submitit_local.txt": [*PAIR, "launcher=submitit_local"],
    "launcher_slurm.txt": [*PAIR, "launcher=slurm", "hydra.launcher.partition=gpu"],
    "launcher_slurm_batches.txt": [*PAIR, "--seeds", "3", "launcher=slurm",
                                   "hydra.sweeper.max_batch_size=4"],
    "launcher_slurm_one_job.txt": ["--seeds", "1", "launcher=slurm"],
    "pack_joblib.txt": [*PAIR, "--seeds", "2", "launcher=joblib", "--jobs-per-gpu", "2"],
    "pack_submitit_local.txt": [*PAIR, "launcher=submitit_local", "--jobs-per-gpu", "2"],
    "pack_slurm.txt": [*PAIR, "--seeds", "3", "launcher=slurm", "--jobs-per-gpu", "2",
                       "hydra.launcher.gpus_per_node=2"],
    "pack_slurm_cpu_device.txt": [*PAIR, "--seeds", "2", "launcher=slurm", "--jobs-per-gpu", "3",
                                  "train.device=cpu"],
}


@contextlib.contextmanager
def one_core():
    """This process on one core (a subprocess started inside inherits it), as before after."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def dry_run(args: list[str], tmp_path: Path) -> str:
    with one_core():
        res = run_ablate("sweep", *args, "--dry-run", f"out_dir={tmp_path / 'runs'}",
                         f"hydra.sweep.dir={tmp_path / 'sweep'}", env={"CUDA_VISIBLE_DEVICES": ""})
    assert res.returncode == 0, res.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "sweep").exists()  # nothing made
    return res.stdout.replace(str(tmp_path), "<TMP>").replace(sys.executable, "<PYTHON>")


@pytest.mark.parametrize("name", sorted(CASES))
def test_dry_run_output_is_unchanged(name, tmp_path):
    out = dry_run(CASES[name], tmp_path)
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(out)
    assert path.is_file(), f"{path} is missing: generate it with ABLATE_UPDATE_GOLDEN=1"
    assert out == path.read_text(), f"{name}: the dry run's output changed (see this file's docstring)"
