"""Sweeps when things go wrong: a job whose launcher loses it (killed, OOM, node failure) fails
alone and the others are still read from their directories; a sweep that cannot work here (an
unwritable sweep dir, no SLURM, bad data) is refused in one line before anything is launched."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import types

import pytest

from conftest import ROOT, TINY, run_ablate

FAST = [*TINY, "train.threads=1"]

# A Hydra launcher that runs every job but #0, then raises, as hydra-submitit-launcher does when
# one job of the batch died (its `[j.results()[0] for j in jobs]` raises for the whole batch).
FLAKY_LAUNCHER = textwrap.dedent('''
    from dataclasses import dataclass

    from hydra._internal.core_plugins.basic_launcher import BasicLauncher
    from hydra.core.config_store import ConfigStore


    @dataclass
    class FlakyConf:
        _target_: str = "hydra_plugins.flaky_launcher.flaky_launcher.FlakyLauncher"


    ConfigStore.instance().store(group="hydra/launcher", name="flaky", node=FlakyConf)


    class FlakyLauncher(BasicLauncher):
        def launch(self, job_overrides, initial_job_idx):
            super().launch(job_overrides[1:], initial_job_idx + 1)
            raise RuntimeError("job #0 died")
''')


def sweep_record(root):
    (record,) = root.glob("sweeps/*/sweep.json")
    return json.loads(record.read_text())


def test_a_launcher_that_raises_loses_only_the_jobs_without_a_summary(tmp_path):
    plugin = tmp_path / "shadow" / "hydra_plugins" / "flaky_launcher"
    plugin.mkdir(parents=True)
    (plugin / "__init__.py").write_text("")
    (plugin / "flaky_launcher.py").write_text(FLAKY_LAUNCHER)
    res = run_ablate("sweep", *FAST, "hydra/launcher=flaky", "norm=layernorm,rmsnorm",
                     "act=gelu,relu", f"out_dir={tmp_path / 'runs'}",
                     env={"PYTHONPATH": f"{plugin.parent.parent}:{ROOT}"})
    assert res.returncode == 0, res.stderr  # two of three jobs finished
    assert "2/3 jobs finished" in res.stdout and "ablate compare" in res.stdout
    assert "failed: #0 baseline (failed: the launcher lost the job: RuntimeError: job #0 died)" \
        in res.stderr
    assert "#1" not in res.stderr and "#2" not in res.stderr and "Traceback" not in res.stderr
    jobs = sweep_record(tmp_path / "runs")["jobs"]
    assert [j["status"] for j in jobs] == ["failed", "completed", "completed"]
    assert jobs[1]["run_dir"].endswith("1_norm=rmsnorm") and jobs[2]["run_dir"].endswith("2_act=relu")


def _summary(run_dir, **fields):
    from ablate.run.directory import write_json

    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / "summary.json", {"host": socket.gethostname(), **fields})


def test_recover_trusts_only_an_outcome_this_launch_wrote(tmp_path):
    from ablate.sweep import Job
    from ablate.sweep.progress import recover, summary_stamp

    job = Job(["norm=rmsnorm"], "norm=rmsnorm")
    done, stale, dead, never = (tmp_path / n for n in ("done", "stale", "dead", "never"))
    _summary(stale, status="completed")  # left by an earlier run of this sweep
    before = {d: summary_stamp(str(d)) for d in (done, stale, dead, never)}
    time.sleep(0.01)
    _summary(done, status="completed")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _summary(dead, status="running", pid=gone.pid)  # SIGKILLed while training

    def outcome(d):
        r = recover(job, str(d), before[d], "the launcher lost the job: X")
        return r.status, r.error

    assert outcome(done) == ("completed", "")
    assert outcome(stale) == ("failed", "the launcher lost the job: X")
    assert outcome(never) == ("failed", "the launcher lost the job: X")
    status, error = outcome(dead)
    assert status == "failed" and "died before it wrote an outcome" in error
    # on SLURM a job OOM-killed on its node says "running" from a host we cannot check
    elsewhere = tmp_path / "elsewhere"
    _summary(elsewhere, status="running", pid=1, host="node042")
    assert recover(job, str(elsewhere), None, "the launcher lost the job: OOM").error == \
        "the launcher lost the job: OOM"


def test_each_submitit_job_is_waited_for_and_read_on_its_own(tmp_path):
    """hydra-submitit-launcher stops at the first job that died; the sweeper waits for every job
    and takes each one's own return, or says why it has none (submitit's state, e.g. OOM)."""
    from hydra_plugins.ablate_sweeper.ablate_sweeper import _collect

    class FakeJob:  # what the sweeper reads of a submitit Job
        def __init__(self, job_id, result, state):
            self.job_id, self.result, self.state, self.waited = job_id, result, state, False
            self.paths = types.SimpleNamespace(result_pickle=tmp_path / f"{job_id}_0_result.pkl")
            if result is not None:
                self.paths.result_pickle.write_text("")

        def wait(self):
            self.waited = True

        def results(self):
            return [self.result]

    jobs = [FakeJob("7_0", "job return", "COMPLETED"), FakeJob("7_1", None, "OUT_OF_MEMORY")]
    assert _collect(jobs, 2, "UncompletedJobError: ...") == [
        ("job return", ""), (None, "submitit job 7_1 has not produced any output (state: OUT_OF_MEMORY)")]
    assert all(j.waited for j in jobs)
    assert _collect([], 2, "sbatch failed") == [(None, "sbatch failed")] * 2  # nothing submitted


@pytest.mark.slow
def test_a_killed_submitit_job_fails_alone(tmp_path):
    """`kill -9` of one job's training process: the other job still finishes and is compared."""
    cmd = [sys.executable, "-m", "cli.main", "sweep", *FAST, "train.steps=200", "train.log_every=50",
           "launcher=submitit_local", "norm=layernorm,rmsnorm", f"out_dir={tmp_path}"]
    sweep = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        victim = None
        for _ in range(600):
            summary = next(tmp_path.glob("sweeps/*/0_baseline/summary.json"), None)
            try:
                victim = json.loads(summary.read_text()) if summary else None
            except ValueError:
                victim = None  # being replaced
            if victim and victim["status"] == "running":
                break
            time.sleep(0.1)
        assert victim and victim["status"] == "running", "the baseline job never started"
        os.kill(victim["pid"], signal.SIGKILL)
        out, err = sweep.communicate(timeout=240)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.communicate()
    assert sweep.returncode == 0, err
    assert "1/2 jobs finished" in out and "ablate compare" in out
    assert "failed: #0 baseline" in err and "died before it wrote an outcome" in err
    assert "#1 norm=rmsnorm" not in err
    jobs = sweep_record(tmp_path)["jobs"]
    assert [j["status"] for j in jobs] == ["failed", "completed"]
    assert json.loads(open(os.path.join(jobs[1]["run_dir"], "summary.json")).read())["status"] == "completed"


@pytest.mark.parametrize("where", ["out_dir={file}/runs", "hydra.sweep.dir={file}/x"])
def test_an_unwritable_sweep_dir_is_refused_before_launch(tmp_path, where):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    res = run_ablate("sweep", *FAST, "norm=layernorm,rmsnorm", where.format(file=a_file))
    assert res.returncode == 2
    assert res.stderr.startswith("error: sweep directory ") and res.stderr.count("\n") == 1
    assert f"{a_file} is not a directory" in res.stderr and "Traceback" not in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_slurm_without_sbatch_is_refused_before_launch_and_dry_run_still_works(tmp_path):
    no_slurm = {"PATH": str(tmp_path / "empty")}  # no sbatch on PATH
    out = tmp_path / "runs"
    res = run_ablate("sweep", "launcher=slurm", "norm=layernorm,rmsnorm", f"out_dir={out}", env=no_slurm)
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert res.stderr.startswith("error: launcher=slurm submits with sbatch, which is not on PATH")
    assert "login node" in res.stderr and "--dry-run" in res.stderr
    assert not out.exists()
    res = run_ablate("sweep", "launcher=slurm", "norm=layernorm,rmsnorm", f"out_dir={out}",
                     "--dry-run", env=no_slurm)
    assert res.returncode == 0 and "#SBATCH --array=0-1%2" in res.stdout and not out.exists()


def test_a_data_error_is_one_line_before_any_job_starts(tmp_path):
    corpus = tmp_path / "one_letter.txt"
    corpus.write_text("a")  # passes the file checks; too few tokens to split, found by tokenizing
    out = tmp_path / "runs"
    res = run_ablate("sweep", *FAST, "data=text_files", f"data.paths=[{corpus}]",
                     f"data.cache_dir={tmp_path / 'cache'}", "train.lr=0.003,0.001", f"out_dir={out}")
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith("error: job #0 (baseline): data=text_files: the corpus has only")
    assert "nothing was launched" in res.stderr and not out.exists()


def test_a_local_sweep_tokenizes_once_before_its_jobs(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n"
                              for i in range(400)))
    cache = tmp_path / "cache"
    res = run_ablate("sweep", *FAST, "data=text_files", f"data.paths=[{corpus}]",
                     f"data.cache_dir={cache}", "train.lr=0.003,0.001", f"out_dir={tmp_path / 'runs'}")
    assert res.returncode == 0, res.stderr
    (meta,) = cache.glob("*/meta.json")
    job_dirs = sorted(tmp_path.glob("runs/sweeps/*/[0-9]_*"))
    assert len(job_dirs) == 2
    # the cache was complete before either job wrote its first file (config.yaml)
    assert all(meta.stat().st_mtime_ns < (d / "config.yaml").stat().st_mtime_ns for d in job_dirs)
    assert "waiting for another process" not in res.stderr
