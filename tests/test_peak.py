"""MFU is a measurement or absent: against a GPU's spec-sheet peak, never above 100%; a CPU has
no repeatable peak (a timed matmul reads 3x lower while other work shares the machine), so a
CPU run reports none, the same in every run, and says why."""

from __future__ import annotations

import json

import pytest

from conftest import TINY, run_ablate


def test_identical_cpu_runs_report_no_mfu_and_say_why(tmp_path):
    for i in range(3):
        run = tmp_path / f"run{i}"
        res = run_ablate("run", *TINY, "train.steps=8", "train.log_every=4", f"hydra.run.dir={run}")
        assert res.returncode == 0, res.stderr
        s = json.loads((run / "summary.json").read_text())
        assert s["mfu"] is None and s["tokens_per_s"] > 0
        assert s["peak_flops_source"].startswith("CPU: no MFU")
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert all(r.get("mfu") is None for r in rows)


def test_mfu_is_none_rather_than_above_one():
    from ablate.train.peak import Peak, gpu_peak, mfu

    assert mfu(100.0, 1e6, Peak(1e9, "x")) == pytest.approx(0.1)
    assert mfu(100.0, 1e6, Peak(1e9, "x"), devices=2) == pytest.approx(0.05)
    assert mfu(2000.0, 1e6, Peak(1e9, "x")) is None  # 200%: not a measurement
    assert mfu(None, 1e6, Peak(1e9, "x")) is None and mfu(100.0, 1e6, Peak(None, "unknown GPU")) is None
    h100 = gpu_peak("NVIDIA H100 80GB HBM3", "bf16")
    assert h100.flops == 989e12 and "spec sheet" in h100.source
