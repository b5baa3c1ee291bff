"""Run lifecycle, real processes: a stop signal at any point (startup, training, with torchrun
ranks, under submitit) ends with a truthful summary, the lock released, no process left behind,
one line on the console and a non-zero exit code; torchrun's own output stays in its log."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from conftest import TINY, find_run_dirs, read_summary as summary, run_ablate, start_ablate as start, train_rows

from ablate.train import checkpoint

LONG = [o for o in TINY if not o.startswith("train.steps")] + ["train.steps=100000", "train.threads=1"]
SHORT = LONG[:-2] + ["train.steps=200", "train.threads=1"]  # long enough to be stopped, short to resume


def wait_for(condition, proc, timeout=120):
    end = time.time() + timeout
    while not condition():
        assert proc.poll() is None, "the run ended first: " + proc.stderr.read()
        assert time.time() < end, "timed out"
        time.sleep(0.02)


def processes_in(run_dir) -> list[int]:
    """Live processes whose command line names run_dir (torchrun, its ranks)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(run_dir) in cmdline.read_bytes().decode(errors="replace") and cmdline.parent.name != str(os.getpid()):
                found.append(int(cmdline.parent.name))
        except OSError:
            pass
    return found


@pytest.mark.slow
@pytest.mark.parametrize("sig,status", [(signal.SIGTERM, "preempted"), (signal.SIGINT, "interrupted")])
def test_a_signal_to_a_two_rank_run_stops_every_rank_with_a_checkpoint(tmp_path, sig, status):
    run = tmp_path / "run"
    proc = start("run", *SHORT, "train.nproc=2", f"hydra.run.dir={run}")  # resumed as it was started
    wait_for(lambda: train_rows(run) >= 3, proc)
    proc.send_signal(sig)  # `kill -TERM <ablate pid>`, or Ctrl-C (which reaches only this process)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    done = summary(run)
    assert done["status"] == status and done["step"] > 0, err
    ckpt = checkpoint.ckpt_dir(run) / f"step_{done['step']:08d}.pt"
    assert ckpt.is_file()
    assert err.strip().splitlines() == [
        f"stopped at step {done['step']} (signal {sig.name}); checkpoint {ckpt}; resume with: ablate resume {run}"]
    assert not (run / "run.lock").exists() and not processes_in(run)  # nothing left running
    if sig == signal.SIGTERM:  # re-entry takes both stops alike (vocab.STOPPED): a preempted
        return  # two-rank run resumes in the submitit requeue test below, an interrupted one here
    res = run_ablate("run", *SHORT, "train.nproc=2", f"hydra.run.dir={run}")
    assert res.returncode == 0, res.stderr
    again = summary(run)
    assert again["status"] == "completed" and again["resumed_from"] == done["step"]


@pytest.mark.slow
def test_a_two_rank_submitit_job_is_requeued_only_after_its_ranks_checkpoint(tmp_path):
    proc = start("sweep", *LONG[:-2], "train.steps=400", "train.threads=1", "train.nproc=2",
                 "launcher=submitit_local", "--seeds", "1", f"out_dir={tmp_path}")
    wait_for(lambda: any(train_rows(p.parent) >= 5 for p in tmp_path.rglob("metrics.jsonl")), proc, 240)
    (run,) = [p.parent for p in tmp_path.rglob("metrics.jsonl")]
    rank0 = summary(run)["pid"]
    job = int(Path(f"/proc/{Path(f'/proc/{rank0}/stat').read_text().split()[3]}/stat").read_text().split()[3])
    os.kill(job, signal.SIGUSR2)  # submitit's preemption signal, to the job process
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    done = summary(run)
    assert done["status"] == "completed" and done["step"] == 400
    assert done["previous_status"] == "preempted" and 0 < done["resumed_from"] < 400
    assert len(find_run_dirs(tmp_path)) == 1


@pytest.mark.parametrize("sig,status", [(signal.SIGTERM, "preempted"), (signal.SIGUSR1, "preempted"),
                                        (signal.SIGINT, "interrupted")])
def test_a_signal_during_startup_is_recorded_and_releases_the_lock(tmp_path, sig, status):
    """Before the trainer runs (data, model, checkpoint load) a signal used to kill the run,
    leaving summary.json `running` and run.lock behind."""
    run = tmp_path / "run"
    proc = start("run", *LONG, f"hydra.run.dir={run}")
    wait_for(lambda: (run / "summary.json").is_file(), proc)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert train_rows(run) == 0  # it was stopped before training
    done = summary(run)
    assert done["status"] == status and done["reason"] == f"signal {sig.name} before training started"
    assert err.strip().splitlines()[-1].endswith(f"no checkpoint yet; resume with: ablate resume {run}")
    assert "Traceback" not in err and not (run / "run.lock").exists()


def test_a_rank_error_is_one_line_with_its_exit_code_and_torchrun_keeps_its_traceback(tmp_path):
    """A problem every rank meets (here an empty corpus, found while tokenizing: the Hydra flag
    skips the CLI's pre-flight, which would catch it earlier) is printed once, by rank 0."""
    corpus = tmp_path / "blank.jsonl"
    corpus.write_text('{"text": ""}\n{"text": ""}\n')
    run = tmp_path / "run"
    res = run_ablate("run", *TINY, "train.threads=1", "train.nproc=2", "data=text_files",
                     f"data.paths=[{corpus}]", f"hydra.run.dir={run}", "--config-name=config")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == ["error: data=text_files: the corpus is empty (no text found)"]
    assert "Traceback" not in res.stdout + res.stderr
    assert "ChildFailedError" in (run / "torchrun.log").read_text()
    assert summary(run)["status"] == "failed"


def test_a_killed_rank_0_is_reported_in_one_line_naming_torchruns_log(tmp_path):
    run = tmp_path / "run"
    proc = start("run", *LONG, "train.nproc=2", f"hydra.run.dir={run}")
    wait_for(lambda: train_rows(run) >= 1, proc)
    os.kill(summary(run)["pid"], signal.SIGKILL)  # rank 0 (e.g. the OOM killer)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGKILL
    log = run / "torchrun.log"
    # rank 1 may report its own error (the connection to rank 0 broke) before this line
    assert err.strip().splitlines()[-1] == (
        f"error: torchrun exited with code {128 + signal.SIGKILL} before rank 0 recorded the outcome; see {log}")
    assert "Traceback" not in err
    assert summary(run)["status"] == "failed" and "SIGKILL" in log.read_text()
    assert not processes_in(run)
