"""MFU on CPU is a measurement: one peak per machine and thread count (measured once, cached
on disk), never above 100%, the same in every run, so runs differ in MFU only as in speed."""

from __future__ import annotations

import json

import pytest

from conftest import TINY, run_ablate


def test_identical_runs_divide_by_one_cached_peak(tmp_path):
    summaries = []
    for i in range(3):
        run = tmp_path / f"run{i}"
        res = run_ablate("run", *TINY, "train.steps=12", "train.log_every=4", f"hydra.run.dir={run}")
        assert res.returncode == 0, res.stderr
        summaries.append(json.loads((run / "summary.json").read_text()))
    peaks = {s["peak_flops"] for s in summaries}
    assert len(peaks) == 1 and "cached in" in summaries[0]["peak_flops_source"]
    for s in summaries:
        assert 0 < s["mfu"] <= 1
        assert s["mfu"] == pytest.approx(s["tokens_per_s"] * s["flops_per_token"] / s["peak_flops"])


def test_the_peak_is_measured_once_and_then_read_from_the_cache(tmp_path, monkeypatch):
    from ablate.train import peak

    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path))
    monkeypatch.setattr(peak, "_cpu_peaks", {})
    first = peak.cpu_peak()
    cache = json.loads((tmp_path / peak.PEAK_FILE).read_text())
    assert list(cache.values()) == [first.flops]
    key = next(iter(cache))
    (tmp_path / peak.PEAK_FILE).write_text(json.dumps({key: 1.25e11}))  # another process's measurement
    monkeypatch.setattr(peak, "_cpu_peaks", {})
    assert peak.cpu_peak().flops == 1.25e11


def test_mfu_is_none_rather_than_above_one():
    from ablate.train.peak import Peak, mfu

    assert mfu(100.0, 1e6, Peak(1e9, "x")) == pytest.approx(0.1)
    assert mfu(100.0, 1e6, Peak(1e9, "x"), devices=2) == pytest.approx(0.05)
    assert mfu(2000.0, 1e6, Peak(1e9, "x")) is None  # 200%: the peak is not this machine's ceiling
    assert mfu(None, 1e6, Peak(1e9, "x")) is None and mfu(100.0, 1e6, Peak(None, "unknown GPU")) is None
