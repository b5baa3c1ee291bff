"""Startup. `ablate --help` and `ablate axes` import no torch (so they answer fast);
time_to_first_step_s in summary.json counts from process start (imports, data, build)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import composition_memo
from conftest import ROOT, TINY, in_process, record_calls, run_ablate

PROBE = ("import sys, runpy; sys.argv = ['ablate'] + sys.argv[1:]\n"
         "try:\n    runpy.run_module('cli.main', run_name='__main__')\nexcept SystemExit:\n    pass\n"
         "heavy = [m for m in ('torch', 'torch._dynamo', 'wandb', 'datasets', 'hydra', 'numpy') if m in sys.modules]\n"
         "print('HEAVY=' + ','.join(heavy), file=sys.stderr)")


def heavy_imports(*args: str) -> list[str]:
    res = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    line = [ln for ln in res.stderr.splitlines() if ln.startswith("HEAVY=")][-1]
    return [m for m in line[len("HEAVY="):].split(",") if m]


def test_help_and_axes_import_no_heavy_library():
    assert heavy_imports("--help") == []
    assert heavy_imports("bench", "--help") == []
    assert "torch" not in heavy_imports("axes")


@pytest.mark.parametrize("args", [
    ["bench", "--steps", "0"],
    ["bench", "--decode", "--batch", "x"],
    ["bench", "--decode", "--new-tokens", "500"],  # checked against the composed train.seq_len
    ["bench", "norm=nope"],
])
def test_bench_refuses_bad_input_before_importing_torch(args):
    assert "torch" not in heavy_imports(*args)


def test_eager_decode_bench_does_not_import_the_compiler():
    """torch.use_deterministic_algorithms imports Inductor's config and with it torch._dynamo
    (~2 CPU-s): a process that compiles nothing and never turned determinism on skips it."""
    loaded = heavy_imports("bench", "--decode", *TINY, "--batch", "1", "--new-tokens", "2", "--rounds", "1",
                           "--warmup", "0", "--json")
    assert "torch" in loaded and "torch._dynamo" not in loaded


def test_process_age_counts_from_process_start():
    code = ("import time; time.sleep(1.0)\n"
            "from ablate.train.trainer import process_age_s; print(process_age_s())")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert float(res.stdout) >= 1.0  # the sleep before the import is counted


def test_time_to_first_step_is_in_the_summary(tmp_path):
    t0 = time.time()
    res = run_ablate("run", *TINY, "train.steps=2", f"hydra.run.dir={tmp_path / 'run'}", process=True)
    elapsed = time.time() - t0
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert 0 < summary["time_to_first_step_s"] <= elapsed + 0.05  # /proc/uptime ticks: 10 ms


@pytest.mark.parametrize("mode", [None, "RUN"])
def test_a_run_composes_its_config_as_hydra_does(tmp_path, monkeypatch, mode):
    """The product composes with Hydra alone: its check before Hydra starts composes the config
    once, then Hydra twice (once in multirun mode only to read hydra.mode, whether or not the
    command line sets it, then the run's), and a second run in the same process composes as
    many again: nothing of one command's compositions serves the next. (The suite's memo,
    tests/composition_memo.py, is off here.)"""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    calls = record_calls(monkeypatch, ConfigLoaderImpl, "load_configuration")
    extra = [f"hydra.mode={mode}"] if mode else []
    for seed in (0, 1) if mode is None else (0,):
        with composition_memo.off():
            res = in_process("run", *TINY, "train.steps=1", f"seed={seed}", *extra,
                             f"hydra.run.dir={tmp_path / str(seed)}")  # counted here
        assert res.returncode == 0, res.stderr
        assert json.loads((tmp_path / str(seed) / "summary.json").read_text())["status"] == "completed"
        assert len(calls) == 3 * (seed + 1)
    modes = [kwargs["run_mode"] if "run_mode" in kwargs else args[3] for args, kwargs in calls[:3]]
    assert [str(m) for m in modes] == ["RunMode.RUN", "RunMode.MULTIRUN", "RunMode.RUN"]
