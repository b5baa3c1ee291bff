"""Checkpoint files (ablate/train/checkpoint.py): atomic, checksummed, the last K kept, RNG states
restored, a damaged newest file skipped for the previous one, pickled code refused."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from ablate.errors import CheckpointError
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
