"""The learning-rate schedule's warmup fits the run: by default a tenth of train.steps, at most
100 (so the default 1,200-step run keeps its 100 and its learning rates), a count set by hand is
kept, half the steps or more is said in one line, and the warmup a run started with is kept when
it is extended."""

from __future__ import annotations

import json
import math

import pytest

from conftest import TINY, compose, read_jsonl, run_ablate, scripted_trainer

from ablate.train import checkpoint
from ablate.train.schedule import lr_at, resolved_warmup

# TINY without its warmup keys: the defaults' automatic warmup
AUTO = [o for o in TINY if not o.startswith("train.warmup")] + ["train.threads=1"]


def reference_lr(step: int, lr: float, warmup: int, total: int, min_ratio: float = 0.1,
                 schedule: str = "cosine") -> float:
    """Linear warmup to `lr` over `warmup` steps, then cosine (or linear, or no) decay to
    min_ratio x lr at `total`, written out here on its own (0-based step, as the trainer counts
    the step it is taking)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if schedule == "constant":
        return lr
    progress = min(1.0, (step - warmup) / (total - warmup))
    shape = 1 - progress if schedule == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
    return lr * (min_ratio + (1 - min_ratio) * shape)


def auto(steps: int, percent: int = 10, most: int = 100) -> int:
    return resolved_warmup({"steps": steps, "warmup_steps": None, "warmup_fraction": percent / 100,
                            "warmup_max_steps": most})


def test_the_automatic_warmup_is_the_fraction_of_the_steps_rounded_down_and_below_them():
    for steps in range(1, 5001):
        assert auto(steps) == min(100, steps // 10)  # integer arithmetic: no float rounding
    for percent in range(0, 100):
        for steps in range(1, 1201):
            w = auto(steps, percent, most=10**6)
            assert w == percent * steps // 100 and w < steps


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_lr_at_follows_the_written_out_schedule_at_every_step(schedule):
    """lr_at itself: warmup from lr/warmup up to lr, the decay's every step to min_ratio x lr at
    the end, and past the end (an extended run's steps) the floor, for warmups from none to most
    of the run."""
    for total, warmup, min_ratio in [(1200, 100, 0.1), (40, 0, 0.0), (40, 39, 0.5), (7, 3, 0.1)]:
        for step in range(total + 5):
            want = reference_lr(step, 3e-3, warmup, total, min_ratio, schedule)
            assert lr_at(step, 3e-3, warmup, total, schedule, min_ratio) == pytest.approx(want, rel=1e-12), \
                (total, warmup, step)
        if schedule != "constant":
            assert lr_at(total, 3e-3, warmup, total, schedule, min_ratio) == pytest.approx(3e-3 * min_ratio)


def test_a_warmup_set_by_hand_is_kept():
    assert resolved_warmup(compose([*AUTO, "train.steps=40", "train.warmup_steps=30"]).train) == 30
    assert resolved_warmup(compose([*AUTO, "train.steps=40", "train.warmup_max_steps=2"]).train) == 2


def test_the_default_run_keeps_its_100_warmup_steps_and_its_learning_rates(tmp_path):
    t = compose([]).train
    assert (t.steps, t.warmup_steps, t.warmup_fraction, t.warmup_max_steps) == (1200, None, 0.1, 100)
    # the defaults' schedule in the real trainer (a tiny model on random tokens)
    trainer = scripted_trainer(tmp_path, "train.steps=1200", "train.warmup_fraction=0.1",
                               "train.warmup_max_steps=100", "train.lr=3e-3")
    assert trainer.state.warmup_steps == 100
    for step in (0, 49, 98, 99, 100, 101, 650, 1198, 1199):
        _, _, lr = trainer.train_step(step)
        trainer.optimizer.zero_grad(set_to_none=True)
        assert lr == pytest.approx(reference_lr(step, 3e-3, 100, 1200), rel=1e-12), step


def test_a_short_run_warms_up_for_a_tenth_of_its_steps_and_anneals(tmp_path):
    run = tmp_path / "run"
    res = run_ablate("run", *AUTO, "train.steps=40", f"hydra.run.dir={run}")
    assert res.returncode == 0, res.stderr
    assert "warning" not in res.stderr
    assert json.loads((run / "summary.json").read_text())["warmup_steps"] == 4
    lrs = {r["step"]: r["lr"] for r in read_jsonl(run / "metrics.jsonl") if "lr" in r}
    assert sorted(lrs) == list(range(1, 41))
    for step, lr in lrs.items():  # row n is the n-th step, taken at 0-based step n - 1
        assert lr == pytest.approx(reference_lr(step - 1, 3e-3, 4, 40), rel=1e-12), step
    assert max(lrs, key=lrs.get) == 4  # the peak is the warmup's last step
    assert lrs[40] < 0.11 * 3e-3  # and the run ends annealed (min_lr_ratio 0.1)


def test_a_warmup_of_half_the_steps_or_more_is_said_in_one_line(tmp_path):
    run = tmp_path / "run"
    res = run_ablate("run", *TINY, "train.warmup_steps=3", f"hydra.run.dir={run}")  # TINY: 6 steps
    assert res.returncode == 0, res.stderr
    line = ("warning: the warmup (3 steps) covers 50% of train.steps=6: the learning rate decays over "
            "the last 3 steps only; lower train.warmup_steps, or leave it null (40% of the steps, at most 2)")
    assert [ln for ln in res.stderr.splitlines() if "warmup" in ln] == [line]
    assert (run / "ablate.log").read_text().count(line) == 1
    again = run_ablate("run", *TINY, "train.warmup_steps=2", f"hydra.run.dir={tmp_path / 'under'}")
    assert again.returncode == 0 and "warmup" not in again.stderr  # a third of the steps


def test_an_extended_run_keeps_the_warmup_it_started_with(tmp_path):
    run = tmp_path / "run"
    rule = ["train.warmup_fraction=0.4", "train.warmup_max_steps=100"]  # 10 steps: 4; 30 steps: 12
    res = run_ablate("run", *AUTO, *rule, "train.steps=10", f"hydra.run.dir={run}")
    assert res.returncode == 0, res.stderr
    res = run_ablate("resume", str(run), "--extend", "30")
    assert res.returncode == 0, res.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["step"] == 30 and summary["extended_from"] == 10 and summary["warmup_steps"] == 4
    assert checkpoint.load_file(checkpoint.list_checkpoints(run)[-1][1])["warmup_steps"] == 4
    lrs = {r["step"]: r["lr"] for r in read_jsonl(run / "metrics.jsonl") if "lr" in r}
    assert sorted(lrs) == list(range(1, 31))
    for step, lr in lrs.items():  # the schedule of 10 steps with 4 of warmup, then its floor
        assert lr == pytest.approx(reference_lr(step - 1, 3e-3, 4, 10), rel=1e-12), step
