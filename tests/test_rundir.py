"""A run directory's files (ablate/run/directory.py): the run lock (one live owner; a dead owner's lock
taken over) and the metrics truncation a resume relies on."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ablate.errors import RunDirError
from ablate.run.directory import LOCK, RunLock, truncate_metrics


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
