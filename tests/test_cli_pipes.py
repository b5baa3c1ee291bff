"""A reader that goes away early (`ablate run ... | head`) does not end a run as failed: it trains
to its end, its record says completed, and the exit code is 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT, TINY


def _read_first_line_then_close(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline()  # the banner's first line
    proc.stdout.close()  # `| head -1` has what it wanted
    proc.wait(timeout=600)
    return proc


def test_a_run_piped_into_a_reader_that_closes_early_completes(tmp_path):
    run_dir = tmp_path / "run"
    proc = _read_first_line_then_close(["run", *TINY, "train.steps=20", f"hydra.run.dir={run_dir}"])
    err = proc.stderr.read()
    assert proc.returncode == 0, err
    assert "BrokenPipe" not in err
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"

