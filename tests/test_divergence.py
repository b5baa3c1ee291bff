"""Divergence is a result, not a crash. A run made to diverge (post-norm, a huge
learning rate, no warmup, no clipping) stops as `diverged` with its metrics kept and exit code 0,
and a sweep containing it goes on with the other variants."""

from __future__ import annotations

import json
import math

import pytest

from conftest import TINY, find_run_dirs, invoke_ablate, read_jsonl, run_ablate, scripted_trainer

UNSTABLE = [o for o in TINY if not o.startswith(("train.steps", "train.warmup_steps"))] + [
    "norm_pos=post", "train.warmup_steps=0", "train.grad_clip=0", "train.steps=40", "train.threads=1"]


def test_a_diverging_run_ends_diverged_with_metrics_intact_and_exit_0(tmp_path):
    run = tmp_path / "run"
    res = run_ablate("run", *UNSTABLE, "train.lr=30", f"hydra.run.dir={run}")
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "diverged"
    # which blows up first (the loss or the gradient norm) depends on the device's kernels
    assert summary["reason"].startswith(("non-finite loss", "non-finite grad norm", "spike")), summary["reason"]
    assert 0 < summary["step"] < 40
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "train_loss" in r]
    # every step up to the divergence is kept, and the step that diverged is recorded too
    assert [r["step"] for r in rows] == list(range(1, summary["step"] + 2))
    last = rows[-1]["train_loss"]  # "nan"/"inf" (JSON has no NaN) or a huge loss
    assert isinstance(last, str) or last > 10 * math.log(256) or isinstance(rows[-1]["grad_norm"], str)
    assert summary["train_loss"] == rows[-1]["train_loss"]


def make_trainer(tmp_path, *overrides, spike_at=None, spike=50.0, loss_from=None):
    """A tiny in-process Trainer whose measured loss is replaced by `spike` at step `spike_at`
    (a spike) or from step `loss_from` on (a lasting shift)."""
    def losses(step):
        hit = step + 1 == spike_at if loss_from is None else step + 1 >= loss_from
        return spike if hit else None

    return scripted_trainer(tmp_path, *overrides, losses=losses)


def test_a_spike_stops_the_run_as_diverged(tmp_path):
    trainer = make_trainer(tmp_path, spike_at=15)
    outcome = trainer.fit()
    assert outcome.status == "diverged" and outcome.reason.startswith("spike")
    assert outcome.step == 14 and trainer.updates == 14  # the spiking update is not applied
    assert [r["step"] for r in trainer.sinks.rows if "train_loss" in r][-1] == 15


def test_the_spike_threshold_is_configurable(tmp_path):
    trainer = make_trainer(tmp_path, "train.diverge_threshold=100", spike_at=15)
    assert trainer.fit().status == "completed"


def test_skip_spikes_skips_the_update_counts_it_and_completes(tmp_path):
    trainer = make_trainer(tmp_path, "train.skip_spikes=true", spike_at=15)
    outcome = trainer.fit()
    assert outcome.status == "completed" and outcome.step == 30
    assert outcome.result.skipped_steps == 1 and trainer.updates == 29
    steps = [r["step"] for r in trainer.sinks.rows if "train_loss" in r]
    assert steps == list(range(1, 31))


def test_a_non_finite_loss_is_never_skipped(tmp_path):
    trainer = make_trainer(tmp_path, "train.skip_spikes=true", spike_at=15, spike=float("nan"))
    outcome = trainer.fit()
    assert outcome.status == "diverged" and "non-finite loss" in outcome.reason



def test_skip_spikes_ends_a_lasting_loss_shift_as_diverged(tmp_path):
    """The loss jumps at step 15 and stays there: 9 updates are skipped, the 10th ends the run."""
    outcome = make_trainer(tmp_path, "train.skip_spikes=true", loss_from=15).fit()
    assert outcome.status == "diverged", outcome
    assert "10 updates in a row skipped as loss spikes" in outcome.reason
    assert outcome.result.skipped_steps == 9 and outcome.step == 23


@pytest.mark.slow
def test_a_sweep_with_a_diverging_variant_finishes_the_others(tmp_path):
    res = run_ablate("sweep", *UNSTABLE, "train.lr=30,3e-3", "--mode", "grid", f"out_dir={tmp_path}")
    assert res.returncode == 0, res.stderr
    statuses = {d.name: json.loads((d / "summary.json").read_text())["status"]
                for d in find_run_dirs(tmp_path)}
    assert sorted(statuses.values()) == ["completed", "diverged"], statuses
    assert [s for name, s in statuses.items() if "lr=30" in name] == ["diverged"]
    res = invoke_ablate("compare", str(tmp_path), "--json")
    assert res.returncode == 0, res.stderr
    shown = {row["variant"]: row["status"] for row in json.loads(res.stdout)}
    assert shown == {"train.lr=30": {"diverged": 1}, "train.lr=0.003": {"completed": 1}}
    # the jobs ran one after another in one process: the second job's wait for its first step is
    # its own (within its wall time), not the sweep's age
    second = json.loads((next(d for d in find_run_dirs(tmp_path) if d.name.startswith("1_")) / "summary.json")
                        .read_text())
    assert 0 < second["time_to_first_step_s"] <= second["wall_time_s"]
