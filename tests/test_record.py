"""A run's record (ablate/run/record.py): summary.json read and written in one place, its public keys
kept, an older record (fewer keys) still read, and a killed run told from a running one."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, TINY, built_once, run_ablate

from ablate.run.record import RecordError, RunInfo, RunRecord, live_status, read_record
from ablate.run.directory import SUMMARY, write_json
from ablate.names import Status

# summary.json's keys after a completed run with logger=wandb on the CPU: a public contract
# (docs/running.md). A key may be added; none may go.
PUBLIC_KEYS = {
    "status", "variant", "axes", "seed", "data_seed", "overrides", "sweep", "host", "started",
    "wall_time_s", "params", "params_breakdown", "non_embedding_params", "active_params", "flops_per_token",
    "vocab_size", "tokenizer_vocab", "data", "world_size", "device", "precision", "provenance",
    "compile", "compile_optimizer", "tokens_per_step", "micro_batch", "grad_accum_steps",
    "warmup_steps", "param", "base_width", "base_depth", "unigram_loss", "wandb", "reason", "step", "steps", "tokens", "train_loss", "val_loss", "val_bpb",
    "tokens_per_s", "skipped_steps", "resumed_from", "time_to_first_step_s", "compile_s", "mfu",
    "peak_flops", "peak_flops_source", "compile_fallback", "block_grad_norm", "deterministic", "finished",
}
NESTED_KEYS = {
    "params_breakdown": {"embedding", "attention", "ffn", "norm", "head", "total"},
    "data": {"source", "tokenizer", "train_tokens", "val_tokens", "cache"},
    "provenance": {"git", "ablate", "torch", "cuda", "python", "device_name", "hostname"},
    "wandb": {"mode", "id", "project", "group", "init_s", "dir"},
}


def _real_run(out):
    args = [o for o in TINY if o != "logger=none"] + ["logger=wandb", "train.eval_every=3"]
    res = run_ablate("run", *args, f"hydra.run.dir={out / 'run'}", env={"WANDB_MODE": "offline"})
    assert res.returncode == 0, res.stderr


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """A run logged to W&B offline, once for the session's workers (its tests only read it)."""
    return built_once(tmp_path_factory, "record", _real_run) / "run"


def test_a_real_summary_reads_and_writes_back_the_same_json(real_run):
    text = (real_run / SUMMARY).read_text()
    record = RunRecord.from_json(json.loads(text))
    assert record.status is Status.COMPLETED and record.info.params_breakdown.total == record.info.params
    assert record.metric("val_loss") == json.loads(text)["val_loss"]
    again = json.dumps(record.to_json(), indent=2) + "\n"
    assert again == text  # every key, in its order, with its value


def test_summary_json_keeps_its_public_keys(real_run):
    summary = json.loads((real_run / SUMMARY).read_text())
    assert set(summary) == PUBLIC_KEYS
    for key, nested in NESTED_KEYS.items():
        assert set(summary[key]) == nested, key
    # every key docs/running.md names in its summary.json row is there
    row = next(line for line in (ROOT / "docs" / "running.md").read_text().splitlines()
               if line.startswith("| `summary.json`"))
    documented = {k for k in re.findall(r"`([a-z_]+)`", row) if k != "summary"}
    assert documented and documented <= set(summary), documented - set(summary)


def test_an_older_record_with_fewer_keys_reads_and_reports(tmp_path):
    """A summary.json as an earlier version wrote it: no provenance, warmup, wall time, ..."""
    from ablate.run.lifecycle import read
    from ablate.run.summary import summary_table
    from ablate.terminal import render

    old = {"status": "completed", "variant": "norm=rmsnorm", "axes": {"norm": "rmsnorm"}, "seed": 0,
           "data_seed": 0, "overrides": ["norm=rmsnorm"], "sweep": None, "params": 1000,
           "flops_per_token": 6000, "tokens_per_s": 100.0, "val_loss": 4.5, "step": 6, "steps": 6}
    write_json(tmp_path / SUMMARY, old)
    record = read_record(tmp_path)
    assert record.info.params == 1000 and record.info.provenance is None and record.info.warmup_steps is None
    assert record.metric("val_loss") == 4.5 and record.wall_time_s is None and record.finished is None
    assert read(tmp_path).finished  # the lifecycle reads it as a finished run
    text = render(summary_table(record, tmp_path))
    assert "1,000 (0 non-embedding)" in text and "4.5000" in text and "6/6" in text
    assert RunRecord.from_json({"status": "running"}).to_json()["status"] == "running"


def test_an_axis_added_after_a_run_was_recorded_reads_as_its_default():
    """A run recorded before an axis existed trained that axis's default (param=sp is the model
    as it was): compare must still name it the baseline with 'no axis changed'."""
    from ablate.config.axes import default_axes

    base = default_axes()
    older = {k: v for k, v in base.items() if k != "param"}
    record = RunRecord.from_json({"status": "completed", "axes": {**older, "norm": "rmsnorm"}})
    assert record.axes == {**base, "norm": "rmsnorm"}
    assert RunRecord.from_json({"status": "completed", "axes": older}).axes == base


def test_a_group_not_known_yet_leaves_its_keys_out():
    """A run refused or failed before it was built records no params, losses or speed (not nulls)."""
    failed = RunRecord(Status.FAILED, variant="baseline", error="bad data").to_json()
    assert "params" not in failed and "val_loss" not in failed and failed["error"] == "bad data"
    assert "reason" not in failed and "finished" not in failed
    built = RunRecord(Status.COMPLETED, info=RunInfo(params=5)).to_json()
    assert built["params"] == 5 and built["flops_per_token"] is None and "wandb" not in built


@pytest.mark.parametrize("text", ['[1, 2]', '{"variant": "x"}', '{"status": "exploded"}',
                                  '{"status": "completed", "data": 3}'])
def test_what_is_not_a_record_is_refused(tmp_path, text):
    with pytest.raises(RecordError):
        RunRecord.from_json(json.loads(text))
    (tmp_path / SUMMARY).write_text(text)
    assert read_record(tmp_path) is None and live_status(tmp_path) is None


def test_live_status_tells_a_killed_run_from_a_running_one(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    write_json(tmp_path / SUMMARY, {"status": "running", "pid": proc.pid, "host": os.uname().nodename})
    assert live_status(tmp_path) == Status.RUNNING
    proc.kill()
    proc.wait()
    assert live_status(tmp_path) == Status.KILLED
    write_json(tmp_path / SUMMARY, {"status": "completed"})
    assert live_status(tmp_path) == Status.COMPLETED
