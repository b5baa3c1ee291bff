"""Sweeps that really run. One sweep directory, one job directory per variant named by
its change, the comparison at the end; a failing job does not stop the others; the slurm
launcher renders the sbatch script it would submit."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from conftest import TINY, find_run_dirs, in_process, record_calls, run_ablate

ONE_THREAD = ["train.threads=1"]


def summaries(root):
    return {d.name: json.loads((d / "summary.json").read_text()) for d in find_run_dirs(root)}


def table_column(out: str, header: str) -> dict[str, str]:
    """{variant: cell} of one column of the comparison table in `out` (piped: the full table)."""
    lines = out.splitlines()
    col = [c.strip() for c in next(line for line in lines if header in line).split("┃")].index(header)
    return {cells[1].strip(): cells[col].strip() for cells in (line.split("│") for line in lines if line.startswith("│"))}


def hold(run_dir: Path, pid: int) -> None:
    """Make run_dir look in use by the live process `pid`: its job fails at run time."""
    run_dir.mkdir(parents=True)
    (run_dir / "run.lock").write_text(json.dumps({"pid": pid, "host": socket.gethostname()}))


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
    # ... from every run's config, read back after the jobs' results: 2 (K and V) x 2 layers x
    # d_model 32 x 4 bytes (fp32 on the CPU) of KV cache per token, for each variant
    assert table_column(res.stdout, "KV cache bytes/token") == dict.fromkeys(
        ["baseline", "norm=rmsnorm", "act=swiglu"], f"{2 * 2 * 32 * 4}")
    from ablate.analysis import compare_dirs

    rows = compare_dirs([sweep_dir])
    assert [r["variant"] for r in rows] == ["baseline", "norm=rmsnorm", "act=swiglu"]
    assert rows[0]["baseline"] and all(r["n"] == 1 for r in rows)


def test_failing_and_diverging_jobs_do_not_stop_the_sweep(tmp_path, other_pid):
    # A failure no pre-check can foresee: job #1's directory is held by another live process.
    sweep_dir = tmp_path / "sweeps" / "s"
    held = sweep_dir / "1_norm=rmsnorm"
    hold(held, other_pid)
    res = run_ablate("sweep", *TINY, *ONE_THREAD, f"hydra.sweep.dir={sweep_dir}",
                     "train.warmup_steps=0", "train.grad_clip=0",
                     "norm=layernorm,rmsnorm", "train.lr=0.003,1e9")
    assert res.returncode == 0, res.stderr  # some jobs finished
    runs = summaries(tmp_path / "sweeps")
    assert runs["0_baseline"]["status"] == "completed"
    assert not (held / "summary.json").exists()  # the holder's directory is left alone
    (lr_job,) = [name for name in runs if name.startswith("2_train.lr=")]
    assert runs[lr_job]["status"] == "diverged"
    assert "failed: #1 norm=rmsnorm" in res.stderr and "Traceback" not in res.stderr
    assert "2/3 jobs finished (1 diverged)" in res.stdout
    # the same outcome for scripts, one entry per job, in <sweep_dir>/sweep.json
    (record_file,) = (tmp_path / "sweeps").glob("*/sweep.json")
    record = json.loads(record_file.read_text())
    jobs = record["jobs"]
    assert [(j["name"], j["status"]) for j in jobs] == [
        ("baseline", "completed"), ("norm=rmsnorm", "failed"), (lr_job[2:], "diverged")]
    assert record["finished"] == 2 and record["total"] == 3
    assert "in use by process" in jobs[1]["error"] and jobs[0]["error"] is None
    assert "norm=rmsnorm" in jobs[1]["overrides"] and "train.lr=0.003" in jobs[1]["overrides"]
    assert [Path(j["run_dir"]).name for j in jobs] == ["0_baseline", "1_norm=rmsnorm", lr_job]
    assert not [f for f in record_file.parent.iterdir() if f.name.startswith(".sweep.json")]


def test_a_sweep_where_every_job_fails_exits_non_zero(tmp_path, other_pid):
    sweep_dir = tmp_path / "s"
    for name in ("0_baseline", "1_train.lr=0.001"):
        hold(sweep_dir / name, other_pid)
    res = run_ablate("sweep", *TINY, *ONE_THREAD, f"hydra.sweep.dir={sweep_dir}", "train.lr=0.003,0.001")
    assert res.returncode != 0
    assert res.stderr.count("failed: #") == 2 and "0/2 jobs finished" in res.stdout


def test_a_corpus_too_small_for_any_job_is_refused_before_launch(tmp_path):
    tiny_file = tmp_path / "tiny.txt"
    tiny_file.write_text("hi\n")
    res = run_ablate("sweep", *TINY, *ONE_THREAD, f"out_dir={tmp_path}", "data=text_files",
                     f"data.paths=[{tiny_file}]", "train.lr=0.003,0.001")
    assert res.returncode == 2 and "fewer than one batch" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "sweeps").exists()


SLURM = ["launcher=slurm", "hydra.launcher.partition=gpu", "hydra.launcher.account=lab",
         "hydra.launcher.gpus_per_node=4", "hydra.launcher.tasks_per_node=4",
         "hydra.launcher.timeout_min=30", "hydra.launcher.mem_gb=128"]


def slurm_preview(tmp_path, *args):
    res = run_ablate("sweep", *SLURM, "norm=layernorm,rmsnorm", f"out_dir={tmp_path}", *args, "--dry-run")
    assert res.returncode == 0, res.stderr
    return res, res.stdout[res.stdout.index("#!/bin/bash"):].strip()


def test_slurm_launcher_composes_and_renders_the_sbatch_script(tmp_path):
    res, script = slurm_preview(tmp_path, "--seeds", "3", "hydra.launcher.array_parallelism=4")
    # hydra-submitit-launcher submits the 6 jobs as one array job, at most 4 running at once
    for line in ("#SBATCH --array=0-5%4", "#SBATCH --partition=gpu", "#SBATCH --account=lab",
                 "#SBATCH --gpus-per-node=4", "#SBATCH --ntasks-per-node=4", "#SBATCH --time=30",
                 "#SBATCH --mem=128GB", "#SBATCH --cpus-per-task=8", "#SBATCH --signal=USR2@120",
                 "#SBATCH --nodes=1", "#SBATCH --job-name=ablate"):
        assert line in script.splitlines(), line
    assert "/.submitit/%A_%a/%A_%a_0_log.out" in script and "srun" in script
    assert "6 jobs" in res.stdout and "one array job of 6 tasks" in res.stdout
    assert not list(tmp_path.iterdir())


def test_sbatch_preview_is_the_script_the_launcher_submits(tmp_path, monkeypatch):
    """The --dry-run script equals what hydra-submitit-launcher hands to sbatch (captured from
    its real launch, with srun faked present and sbatch replaced by a capture)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
    from omegaconf import OmegaConf
    from submitit.slurm.slurm import SlurmExecutor

    from ablate.config.axes import CONF_DIR
    from ablate.config.schema import register_configs

    sweep_dir = f"hydra.sweep.dir={tmp_path / 'sweep'}"
    _, preview = slurm_preview(tmp_path, "--seeds", "3", sweep_dir)
    register_configs()  # the schema the primary config starts from (not stored by any import)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[*SLURM, sweep_dir], return_hydra_config=True)
    GlobalHydra.instance().clear()
    params = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    params.pop("_target_")
    submitted = []

    def sbatch(executor, command):
        submitted.append(executor._make_submission_file_text(command, "uid"))
        raise RuntimeError("captured")

    monkeypatch.setattr(SlurmExecutor, "affinity", classmethod(lambda cls: 2))
    monkeypatch.setattr(SlurmExecutor, "_submit_command", sbatch)
    launcher = SlurmLauncher(**params)
    launcher.setup(hydra_context=None, task_function=None, config=cfg)
    with pytest.raises(RuntimeError, match="captured"):
        launcher.launch([["seed=0"]] * 6, initial_job_idx=0)
    assert submitted == [preview + "\n"]


def test_each_job_is_composed_once_and_trains_with_its_own_overrides(tmp_path, monkeypatch):
    """Each job's config is composed once: the basic launcher reuses the config the checks
    composed (a copy) instead of composing it again, and each job still gets its own values and
    number. (Counted as the sweep asks Hydra to compose, whether or not the suite's memo then
    derives the composition.)"""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    calls = record_calls(monkeypatch, ConfigLoaderImpl, "load_configuration")
    res = in_process("sweep", *TINY, *ONE_THREAD, "norm=layernorm,rmsnorm", "--seeds", "2",
                     f"hydra.sweep.dir={tmp_path / 's'}")  # in this process, where the calls are counted
    assert res.returncode == 0, res.stderr
    overrides = [kwargs["overrides"] if "overrides" in kwargs else args[2] for args, kwargs in calls]
    jobs = [tuple(o) for o in overrides if any("ABLATE_JOB=" in x for x in o)]
    assert len(jobs) == 4 == len(set(jobs))
    runs = summaries(tmp_path / "s")
    assert sorted((n.split("_", 1)[0], r["axes"]["norm"], r["seed"]) for n, r in runs.items()) == [
        ("0", "layernorm", 0), ("1", "layernorm", 1), ("2", "rmsnorm", 0), ("3", "rmsnorm", 1)]
