"""How a command chooses its CPU threads beside other processes (ablate/train/threads.py): from the
cores free at start (the load injected here, never the machine's own), as asked when asked, one
line when the load is above the cores; waiting OpenMP threads sleep (set before torch loads)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ablate.train import threads
from ablate.train.threads import CpuLoad, choose_threads, quiet_openmp
from conftest import ROOT, run_ablate


@pytest.mark.parametrize("cores, machine, load, torch_default, threads", [
    (2, 2, 0.0, 2, 2),  # idle: torch's own count
    (2, 2, 0.4, 2, 2),  # a little background work: 1.6 free rounds to 2
    (2, 2, 0.6, 2, 1),  # 1.4 free
    (2, 2, 1.0, 2, 1),  # one other busy process on 2 cores
    (2, 2, 9.0, 2, 1),  # far above the cores: still one thread
    (16, 16, 3.2, 16, 13),
    (16, 16, 0.0, 8, 8),  # never above torch's default (its physical cores)
    (8, 64, 32.0, 8, 4),  # a cpuset of 8 on a 64-core node half busy: its share of the load
])
def test_the_thread_count_is_the_cores_left_free(cores, machine, load, torch_default, threads):
    choice = choose_threads(0, CpuLoad(cores, machine, load), torch_default)
    assert choice.threads == threads and choice.requested == 0


def test_a_requested_count_is_kept_whatever_the_load():
    assert choose_threads(2, CpuLoad(2, 2, 7.0), 2).threads == 2
    assert choose_threads(4, CpuLoad(2, 2, 0.0), 2).threads == 4  # the user's choice, above the cores


def test_one_line_says_when_the_load_is_above_the_cores():
    busy = choose_threads(0, CpuLoad(2, 2, 4.5), 2, "--threads N").notice
    assert busy == ("notice: the CPU is busy (load 4.5 on 2 cores): computing with 1 thread; times are slower "
                    "than on an idle machine (--threads N chooses the threads)")
    assert choose_threads(2, CpuLoad(2, 2, 4.5), 2).notice is None  # the user's count: theirs to know
    assert choose_threads(0, CpuLoad(2, 2, 2.0), 2).notice is None  # at the cores: no line
    assert choose_threads(0, CpuLoad(2, 2, 0.0), 2).notice is None


def test_the_load_is_read_from_the_machine():
    cpu = CpuLoad.now()
    assert 1 <= cpu.cores <= cpu.machine_cores and cpu.load >= 0


def test_a_process_chooses_from_the_load_it_found_first(monkeypatch):
    """A later choice in the same process (a sweep's next job) must not count this process's
    own work, now in the load average, as another process's."""
    readings = iter([CpuLoad(2, 2, 0.0), CpuLoad(2, 2, 2.0)])
    monkeypatch.setattr(CpuLoad, "now", classmethod(lambda cls: next(readings)))
    monkeypatch.setattr(threads, "_start_cpu", None)
    monkeypatch.setattr(threads, "_torch_default", 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    import torch

    before = torch.get_num_threads()
    try:
        assert [threads.use_threads(0).threads for _ in range(2)] == [2, 2]
    finally:
        torch.set_num_threads(before)


def test_waiting_threads_sleep_unless_the_environment_says_otherwise():
    env = {}
    quiet_openmp(env)
    assert env == {"OMP_WAIT_POLICY": "PASSIVE"}
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    quiet_openmp(env)
    assert env == {"OMP_WAIT_POLICY": "ACTIVE"}


def test_the_cli_sets_the_wait_policy_before_torch_is_imported():
    """libgomp reads OMP_WAIT_POLICY once, when torch loads it: the CLI module sets it first."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    code = "import sys, os, cli.main; print('torch' in sys.modules, os.environ['OMP_WAIT_POLICY'])"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "PASSIVE"], out.stderr


def test_a_negative_thread_count_is_refused():
    res = run_ablate("run", "train.threads=-1", "logger=none")
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1, res.stderr
    assert res.stderr.startswith("error: train.threads must be >= 0 (0: chosen from the cores free at start), got -1")
