"""Issue 7, in-process: checkpoint files (atomic, checksummed, keep-last-K, safe loading), the
run lock and the metrics truncation a resume relies on."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from ablate.errors import CheckpointError, RunDirError
from ablate.rundir import LOCK, SUMMARY, RunLock, truncate_metrics, write_json
from ablate.train import checkpoint


def state(step):
    torch.manual_seed(step)
    return {"step": step, "model": {"w": torch.randn(8, 8)}, "rng": checkpoint.plain_rng_state()}


def test_checkpoints_round_trip_and_keep_the_last_k(tmp_path):
    for step in (10, 20, 30):
        checkpoint.save(tmp_path, step, state(step), keep=2)
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path)] == [20, 30]
    loaded = checkpoint.latest_valid(tmp_path)
    assert loaded["step"] == 30 and torch.equal(loaded["model"]["w"], state(30)["model"]["w"])
    assert not [p for p in checkpoint.ckpt_dir(tmp_path).iterdir() if p.name.startswith(".")]


def test_rng_states_restore_python_numpy_and_torch():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    saved = checkpoint.plain_rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(2), np.random.seed(2), torch.manual_seed(2)
    checkpoint.set_rng_state(saved)
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_a_damaged_newest_checkpoint_is_reported_in_one_line_and_the_previous_used(tmp_path, damage):
    checkpoint.save(tmp_path, 10, state(10), keep=3)
    newest = checkpoint.save(tmp_path, 20, state(20), keep=3)
    data = newest.read_bytes()
    newest.write_bytes({"truncate": data[: len(data) // 2], "empty": b"",
                        "flip": data[:100] + bytes([data[100] ^ 1]) + data[101:]}[damage])
    warnings = []
    loaded = checkpoint.latest_valid(tmp_path, warn=warnings.append)
    assert loaded["step"] == 10
    assert len(warnings) == 1 and "step_00000020.pt" in warnings[0] and "\n" not in warnings[0]


def test_no_usable_checkpoint_is_refused_not_silently_restarted(tmp_path):
    path = checkpoint.save(tmp_path, 10, state(10))
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        checkpoint.latest_valid(tmp_path)
    with pytest.raises(CheckpointError):
        checkpoint.check_resumable(tmp_path)  # the torch-free pre-flight agrees
    assert checkpoint.latest_valid(tmp_path / "elsewhere") is None  # none at all: a fresh start


def test_loading_refuses_pickled_code(tmp_path):
    """weights_only=True: a checkpoint cannot run code, even with a valid checksum."""
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    import hashlib
    import io

    buf = io.BytesIO()
    torch.save({"step": 1, "x": Evil()}, buf)
    payload = buf.getvalue()
    path = checkpoint.ckpt_dir(tmp_path) / "step_00000001.pt"
    path.parent.mkdir(parents=True)
    path.write_bytes(payload + b"\nSHA256:" + hashlib.sha256(payload).hexdigest().encode())
    with pytest.raises(CheckpointError, match="cannot be loaded"):
        checkpoint.load_file(path)


def test_temp_files_of_a_dead_writer_are_removed(tmp_path):
    d = checkpoint.ckpt_dir(tmp_path)
    d.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    (d / f".step_00000005.pt.tmp-{dead}").write_bytes(b"half")
    checkpoint.save(tmp_path, 10, state(10))
    assert sorted(p.name for p in d.iterdir()) == ["step_00000010.pt"]


def test_truncate_metrics_keeps_rows_up_to_the_checkpoint_and_drops_a_torn_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "train_loss": 1.0} for s in range(1, 8)] + [{"step": 5, "val_loss": 2.0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 8, "train_lo')
    assert truncate_metrics(path, 5) == 3  # steps 6 and 7, and the torn line
    kept = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in kept] == [1, 2, 3, 4, 5, 5]


def test_run_lock_refuses_a_live_owner_and_takes_over_a_dead_ones(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / LOCK).write_text(json.dumps({"pid": holder.pid, "host": os.uname().nodename}))
        with pytest.raises(RunDirError, match=f"in use by process {holder.pid}"):
            RunLock(tmp_path).acquire()
        with pytest.raises(RunDirError):
            RunLock(tmp_path).check_free()
    finally:
        holder.kill()
        holder.wait()
    lock = RunLock(tmp_path)
    lock.acquire()  # the owner is gone: the lock is stale
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / LOCK).exists()
