"""`ablate run` (ablate/run/entry.py) end to end through the real CLI: the run directory contract, the
Hydra pass-through, bad options refused before training, and a torchrun launch that reports only
the summary its rank 0 wrote."""

from __future__ import annotations

import json
import math

import yaml

from conftest import TINY, compose, find_run_dirs, invoke_ablate, read_jsonl, run_ablate, run_context

from ablate.run.directory import SUMMARY, write_json

METRIC_KEYS = {"step", "tokens", "train_loss", "grad_norm", "lr", "tokens_per_s"}
SUMMARY_KEYS = {"status", "train_loss", "val_loss", "val_bpb", "params", "flops_per_token",
                "tokens_per_s", "wall_time_s", "axes", "seed", "data_seed", "variant"}


def test_end_to_end_run_writes_the_documented_files(tmp_path):
    run_dir = tmp_path / "run"
    res = run_ablate("run", *TINY, "train.steps=20", "train.eval_every=10",
                     f"hydra.run.dir={run_dir}")
    assert res.returncode == 0, res.stderr
    assert "completed" in res.stdout
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert cfg["train"]["steps"] == 20 and cfg["norm"]["name"] == "layernorm"
    assert "${" not in (run_dir / "config.yaml").read_text()  # resolved
    rows = read_jsonl(run_dir / "metrics.jsonl")
    train_rows = [r for r in rows if "train_loss" in r]
    assert [r["step"] for r in train_rows] == list(range(1, 21))
    assert all(METRIC_KEYS <= set(r) for r in train_rows)
    assert all(math.isfinite(r["train_loss"]) for r in train_rows)
    assert train_rows[-1]["tokens"] == 20 * 4 * 32
    evals = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in evals] == [0, 10, 20]
    assert all({"val_loss", "val_bpb"} <= set(r) for r in evals)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary)
    assert summary["status"] == "completed"
    assert summary["axes"]["norm"] == "layernorm"
    assert summary["val_loss"] == evals[-1]["val_loss"]
    assert summary["params"] > 0 and summary["flops_per_token"] > 6 * summary["params"] * 0.5


def test_training_reduces_validation_loss(tmp_path):
    run_dir = tmp_path / "run"
    res = run_ablate("run", *TINY, "train.steps=60", "train.eval_every=20", "train.lr=1e-2",
                     f"hydra.run.dir={run_dir}")
    assert res.returncode == 0, res.stderr
    evals = [r["val_loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if "val_loss" in r]
    assert evals[-1] < evals[0] - 0.3 and evals[-1] < math.log(257)


def test_default_output_dir_is_named_by_the_overrides(tmp_path):
    res = run_ablate("run", *TINY, "act=relu", f"out_dir={tmp_path}")
    assert res.returncode == 0, res.stderr
    (run_dir,) = find_run_dirs(tmp_path)
    assert run_dir.name.endswith("act=relu," + ",".join(
        sorted(o for o in TINY if o.split("=")[0] not in ("logger.mode", "train.progress")
               and not o.startswith("logger")))) or "act=relu" in run_dir.name
    assert json.loads((run_dir / "summary.json").read_text())["variant"].startswith("act=relu")


def test_hydra_cfg_flag_passes_through(tmp_path):
    res = run_ablate("run", "norm=rmsnorm", "--cfg", "job", f"out_dir={tmp_path}")
    assert res.returncode == 0, res.stderr
    printed = yaml.safe_load(res.stdout)
    assert printed["norm"]["name"] == "rmsnorm"
    assert not any(tmp_path.iterdir())  # printing the config trains nothing


def test_wrong_option_lists_valid_options_without_traceback(tmp_path):
    res = invoke_ablate("run", "norm=rmsnrm", f"out_dir={tmp_path}")  # refused before Hydra starts a job
    assert res.returncode != 0
    assert "rmsnrm" in res.stderr and "layernorm" in res.stderr and "rmsnorm" in res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    assert len(res.stderr.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())


def test_wrong_type_is_refused_before_training(tmp_path):
    res = invoke_ablate("run", "train.steps=abc", f"out_dir={tmp_path}")
    assert res.returncode != 0
    assert "train.steps" in res.stderr and "Traceback" not in res.stderr
    assert not any(tmp_path.iterdir())


def test_a_torchrun_launch_reports_only_the_summary_it_wrote(tmp_path, monkeypatch, capsys):
    """torchrun failing before rank 0 writes anything: the summary of an earlier run in the
    directory is neither reported as this launch's outcome nor changed."""
    from ablate.run import entry as run
    from ablate.train import distributed

    stale = {"status": "completed", "step": 6}
    write_json(tmp_path / SUMMARY, stale)
    monkeypatch.setattr(distributed, "launch_ranks", lambda *args, **kwargs: 1)
    record, code = run._run_ranks(compose(TINY), run_context(tmp_path))
    assert record.status == "failed" and code == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: torchrun exited with code 1 before rank 0 recorded the outcome; see {tmp_path / 'torchrun.log'}"]
    assert json.loads((tmp_path / SUMMARY).read_text()) == stale


def test_a_rank_0_killed_mid_run_leaves_a_failed_summary_not_running(tmp_path, monkeypatch):
    from ablate.run import entry as run
    from ablate.train import distributed

    def killed(*args, **kwargs):  # rank 0 recorded "running", then the OOM killer came
        write_json(tmp_path / SUMMARY, {"status": "running", "pid": 1})
        return 137

    monkeypatch.setattr(distributed, "launch_ranks", killed)
    record, code = run._run_ranks(compose(TINY), run_context(tmp_path))
    assert code == 137 and record.status == "failed" and "code 137" in record.error
    assert json.loads((tmp_path / SUMMARY).read_text())["status"] == "failed"
