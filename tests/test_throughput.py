"""Throughput (ablate/train/throughput.py). summary.json's tokens_per_s is the steady state (the
first step, which holds torch.compile and warm-up, is excluded), compile_s and time_to_first_step_s sit
beside it, and every metrics row carries MFU."""

from __future__ import annotations

import json
import statistics

import pytest

from conftest import TINY, built_once, read_jsonl, scripted_trainer, trained_run

# Compiled with dynamo's eager backend: a first step of ~1 s of tracing, then ~10 ms steps.
COMPILED = ["train.compile=true", "train.compile_backend=eager", "train.threads=1"]


@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory):
    """One compiled run for the session's workers (its tests only read it)."""
    def build(d):
        trained_run(d / "run", *TINY, *COMPILED, "train.steps=12")

    run_dir = built_once(tmp_path_factory, "compiled", build) / "run"
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "tokens_per_s" in r]
    return json.loads((run_dir / "summary.json").read_text()), rows


def test_summary_tokens_per_s_is_the_steady_state_of_the_rows(compiled_run):
    summary, rows = compiled_run
    assert len(rows) == 12  # TINY logs every step
    # rows of equal tokens: their time-weighted rate is the harmonic mean (a slow window under
    # load weighs in the summary as in the rows; the median would not)
    steady = statistics.harmonic_mean([r["tokens_per_s"] for r in rows[2:]])
    assert rows[0]["tokens_per_s"] < 0.5 * steady  # the first row holds the compile ...
    # ... the summary does not (it also counts the logging between rows: ~3% here)
    assert summary["tokens_per_s"] == pytest.approx(steady, rel=0.15)
    assert summary["time_to_first_step_s"] > 0


def test_a_cpu_run_reports_tokens_per_s_and_no_mfu(compiled_run):
    summary, rows = compiled_run
    assert all(r["tokens_per_s"] > 0 and r["mfu"] is None for r in rows)
    assert summary["mfu"] is None and summary["peak_flops"] is None
    assert summary["peak_flops_source"].startswith("CPU: no MFU")


def test_summary_reports_compile_s(compiled_run):
    summary, rows = compiled_run
    assert summary["compile"] is True and summary["compile_fallback"] is False
    assert summary["compile_s"] > 0


def test_outcome_carries_compile_s_and_says_why_there_is_no_mfu(tmp_path):
    trainer = scripted_trainer(tmp_path, *COMPILED, "train.steps=6", "model.n_layers=1")
    out = trainer.fit()
    x = out.result
    assert out.status == "completed" and trainer.compiled and x.compile_fallback is False
    assert x.compile_s > 0
    assert x.peak_flops_source.startswith("CPU: no MFU") and x.mfu is None


def test_mfu_divides_by_one_peak_of_all_devices(tmp_path):
    """What a GPU run gets: every row's MFU against the spec sheet's peak (CPU has none)."""
    from ablate.train.peak import Peak

    trainer = scripted_trainer(tmp_path, "train.steps=4")
    trainer._peak = Peak(1e12, "a 1 TFLOP/s device")
    out = trainer.fit()
    assert out.result.mfu == pytest.approx(out.result.tokens_per_s * trainer.flops_per_token / 1e12)
    rows = [r for r in trainer.sinks.rows if "tokens_per_s" in r]
    assert rows and all(r["mfu"] == pytest.approx(r["tokens_per_s"] * trainer.flops_per_token / 1e12)
                        for r in rows)


def test_uncompiled_run_has_no_compile_time(tmp_path):
    trainer = scripted_trainer(tmp_path, "train.steps=3", "train.compile=false")
    out = trainer.fit()
    assert not trainer.compiled and out.result.compile_s is None
    assert out.result.compile_fallback is False and out.result.tokens_per_s > 0


def test_a_one_step_run_still_reports_a_speed(tmp_path):
    """No steady state after one step: its whole time is reported rather than nothing."""
    out = scripted_trainer(tmp_path, "train.steps=1").fit()
    assert out.result.tokens_per_s > 0
