"""A run killed (SIGKILL) or interrupted (Ctrl-C) and resumed in its directory ends
with exactly the final loss and weights of the uninterrupted run, its metrics.jsonl has each
step once, and a damaged newest checkpoint falls back to the previous one."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import (ROOT, TINY, read_jsonl, read_summary as summary, run_ablate, stop_after_first_checkpoint,
                      weights_hash)

from ablate.run.record import live_status
from ablate.train import checkpoint

STEPS = 150
BASE = [o for o in TINY if not o.startswith("train.steps")] + [
    f"train.steps={STEPS}", "train.ckpt_every=10", "train.threads=1"]


def read_rows(path) -> list[dict]:
    """metrics.jsonl's rows so far (none before it exists; a half-written last line skipped)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    rows = []
    for line in lines:
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass
    return rows


def train_losses(run_dir) -> dict:
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "train_loss" in r]
    steps = [r["step"] for r in rows]
    assert steps == list(range(1, STEPS + 1)), "each step logged exactly once"
    return {r["step"]: r["train_loss"] for r in rows}


def check_resume_is_exact(tmp_path, extra, sig):
    ref, run = tmp_path / "ref", tmp_path / "run"
    res = run_ablate("run", *BASE, *extra, f"hydra.run.dir={ref}")
    assert res.returncode == 0, res.stderr

    args = ("run", *BASE, *extra, f"hydra.run.dir={run}")
    code, err = stop_after_first_checkpoint(args, sig, run)
    stopped = max(s for s, _ in checkpoint.list_checkpoints(run))
    assert 0 < stopped < STEPS
    first = summary(run)

    res = run_ablate(*args)
    assert res.returncode == 0, res.stderr
    final = summary(run)
    assert final["status"] == "completed" and final["step"] == STEPS
    assert final["resumed_from"] == stopped
    assert final["train_loss"] == summary(ref)["train_loss"]
    assert weights_hash(run) == weights_hash(ref)
    assert train_losses(run) == train_losses(ref)  # the whole curve, not just the end
    return code, err, first, final, stopped


@pytest.mark.slow
def test_sigkill_then_resume_is_bit_exact(tmp_path):
    code, _, first, final, _ = check_resume_is_exact(tmp_path, [], signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert first["status"] == "running"  # SIGKILL leaves no chance to write; the pid tells
    assert final["previous_status"] == "running"


@pytest.mark.slow
def test_ctrl_c_writes_interrupted_and_resume_with_dropout_is_bit_exact(tmp_path):
    """Dropout draws from the torch RNG every step: exact only if its state is restored."""
    code, err, first, _, stopped = check_resume_is_exact(tmp_path, ["dropout=on"], signal.SIGINT)
    assert code == 130 and "Traceback" not in err
    # Ctrl-C finishes the step, checkpoints it and says so
    assert first["status"] == "interrupted" and first["step"] == stopped


@pytest.mark.slow
def test_truncated_newest_checkpoint_is_reported_and_the_previous_one_used(tmp_path):
    run = tmp_path / "run"
    args = ("run", *[o for o in BASE if not o.startswith("train.steps")], "train.steps=30",
            "train.keep_ckpts=3", f"hydra.run.dir={run}")
    res = run_ablate(*args)
    assert res.returncode == 0, res.stderr
    done = summary(run)
    newest = checkpoint.ckpt_dir(run) / "step_00000030.pt"
    newest.write_bytes(newest.read_bytes()[:1000])  # a crash mid-copy, a full disk...
    (run / "summary.json").write_text(json.dumps({**done, "status": "failed"}))  # so it is resumed

    res = run_ablate(*args)
    assert res.returncode == 0, res.stderr
    warnings = [ln for ln in res.stderr.splitlines() if "step_00000030.pt" in ln]
    assert len(warnings) == 1 and warnings[0].startswith("warning:")
    again = summary(run)
    assert again["resumed_from"] == 20 and again["status"] == "completed"
    assert again["train_loss"] == done["train_loss"]  # steps 21..30 redone identically


def test_a_killed_run_reads_as_killed_and_a_second_process_is_refused_while_one_runs(tmp_path):
    run = tmp_path / "run"
    args = ["run", *[o for o in BASE if not o.startswith("train.steps")], "train.steps=100000",
            f"hydra.run.dir={run}"]
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", *args], cwd=ROOT, env=dict(os.environ),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        end = time.time() + 120
        while not (run / "metrics.jsonl").is_file() and time.time() < end:
            time.sleep(0.05)
        assert live_status(run) == "running"
        res = run_ablate(*args)
        assert res.returncode != 0
        assert res.stderr.strip() == (f"error: run directory {run} is in use by process {proc.pid} "
                                      f"on {os.uname().nodename}; wait for it or choose another hydra.run.dir")
        assert summary(run)["pid"] == proc.pid and proc.poll() is None  # the owner is untouched
    finally:
        proc.kill()
        proc.wait()
    assert live_status(run) == "killed"


def step_lines(log) -> list[tuple[float, bool]]:
    """(time, whether an evaluation's) of each step line of a run's ablate.log, e.g.
    `[2026-11-26 17:19:08,654] step 20/60 | val_loss 3.7353 | val_bpb 5.3889`."""
    from datetime import datetime

    out = []
    for line in log.read_text().splitlines():
        m = re.match(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] step +\d+/\d+ \| (.*)", line)
        if m:
            out.append((datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp(), "val_loss" in m[2]))
    return out


def test_wall_time_sums_a_segment_killed_without_warning_and_its_resume(tmp_path):
    """The killed segment counts up to its last record (rewritten at each evaluation), so the
    resumed run's wall time holds both segments' step lines, timed by ablate.log's stamps."""
    run = tmp_path / "run"
    args = ["run", *[o for o in BASE if not o.startswith(("train.steps", "train.ckpt_every"))],
            "train.steps=300", "train.eval_every=20", "train.log_every=5", f"hydra.run.dir={run}"]
    began = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", *args], cwd=ROOT, env=dict(os.environ),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    end = time.time() + 240
    while time.time() < end and proc.poll() is None and not any(
            "val_loss" in r and r["step"] >= 200 for r in read_rows(run / "metrics.jsonl")):
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed: " + proc.stderr.read()
    proc.kill()
    proc.wait()
    killed_at = time.time()
    killed = summary(run)
    assert killed["status"] == "running"
    first = step_lines(run / "ablate.log")
    evals = [t for t, is_eval in first if is_eval]
    # written at the evaluation before the last one logged, at the latest (at each one, and after
    # its line); at most the segment's life
    assert evals[-2] - first[0][0] - 0.01 <= killed["wall_time_s"] <= killed_at - began

    res = run_ablate("resume", str(run))
    assert res.returncode == 0, res.stderr
    resumed_for = time.time() - killed_at
    final = summary(run)
    assert final["status"] == "completed" and final["resumed_from"] >= 200
    second = [t for t, _ in step_lines(run / "ablate.log") if t > killed_at]
    assert killed["wall_time_s"] + (second[-1] - second[0]) - 0.01 <= final["wall_time_s"]
    assert final["wall_time_s"] <= killed["wall_time_s"] + resumed_for
