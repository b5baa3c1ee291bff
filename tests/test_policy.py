"""The trainer's policies on their own (ablate/train/policy.py): when a step logs, evaluates and
saves a checkpoint (Cadence), what a step's loss does to the run (Guard), and the rule that counts
loss spikes."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from ablate.train.policy import MAX_SKIPS_IN_A_ROW, Action, Cadence, Guard, Verdict, is_loss_spike


def _train(steps, log_every=1, eval_every=0, ckpt_every=None):
    return SimpleNamespace(steps=steps, log_every=log_every, eval_every=eval_every, ckpt_every=ckpt_every)


def test_cadence_logs_evaluates_and_saves_on_its_multiples_and_at_the_end():
    c = Cadence.from_config(_train(10, log_every=4, eval_every=3))
    steps = range(1, 11)
    assert [n for n in steps if c.logs(n)] == [4, 8, 10]  # and the last step
    assert [n for n in steps if c.evaluates(n)] == [3, 6, 9, 10]
    # train.ckpt_every=null: a checkpoint at every evaluation; the final one is the run's own
    assert [n for n in steps if c.saves(n)] == [3, 6, 9]


@pytest.mark.parametrize("eval_every, ckpt_every, evaluates, saves", [
    (0, None, [10], []),  # neither: only the end evaluates, and the end saves as the run completes
    (0, 4, [10], [4, 8]),
    (5, 0, [5, 10], []),  # train.ckpt_every=0: only at the end (and on a stop signal)
])
def test_cadence_with_nothing_periodic_acts_at_the_end(eval_every, ckpt_every, evaluates, saves):
    c = Cadence.from_config(_train(10, log_every=100, eval_every=eval_every, ckpt_every=ckpt_every))
    assert [n for n in range(1, 11) if c.logs(n)] == [10]
    assert [n for n in range(1, 11) if c.evaluates(n)] == evaluates
    assert [n for n in range(1, 11) if c.saves(n)] == saves


def test_a_non_finite_loss_or_grad_norm_always_ends_the_run():
    guard = Guard(threshold=0, skip_spikes=True)
    assert guard.judge(3, float("nan"), 1.0) == Verdict(Action.DIVERGE, "non-finite loss (nan) at step 3")
    assert guard.judge(4, 2.0, float("inf")) == Verdict(Action.DIVERGE, "non-finite grad norm (inf) at step 4")


def _after(losses, threshold=3.0, skip_spikes=False) -> Guard:
    guard = Guard(threshold, skip_spikes)
    for step, loss in enumerate(losses, 1):
        guard.updated(guard.judge(step, loss, 1.0))
    return guard


def test_a_loss_above_threshold_times_the_running_mean_is_a_spike_after_ten_steps():
    assert _after([2.0] * 9).judge(10, 100.0, 1.0).action is Action.UPDATE  # nine: too few to judge
    assert _after([2.0] * 10).judge(11, 3.0 * 2.0 - 0.01, 1.0).action is Action.UPDATE
    verdict = _after([2.0] * 10).judge(11, 3.0 * 2.0 + 0.01, 1.0)
    assert verdict == Verdict(Action.DIVERGE, "spike: loss 6.010 > 3.0 x running mean 2.000 at step 11")
    assert _after([2.0] * 10, threshold=0).judge(11, 1e9, 1.0).action is Action.UPDATE  # 0: off


def test_skip_spikes_drops_updates_until_too_many_in_a_row():
    guard = _after([1.0] * 10, threshold=2.0, skip_spikes=True)
    for k in range(1, MAX_SKIPS_IN_A_ROW):
        verdict = guard.judge(10 + k, 50.0, 1.0)
        assert verdict.action is Action.SKIP, k
        guard.updated(verdict)
    assert (guard.skipped, list(guard.recent)) == (MAX_SKIPS_IN_A_ROW - 1, [1.0] * 10)  # skipped losses not kept
    last = guard.judge(10 + MAX_SKIPS_IN_A_ROW, 50.0, 1.0)
    assert last.action is Action.DIVERGE and f"{MAX_SKIPS_IN_A_ROW} updates in a row skipped" in last.reason
    guard.updated(Verdict())
    assert guard.skips_in_a_row == 0  # an applied update ends the row


def test_a_guard_restored_from_its_state_judges_as_the_uninterrupted_one():
    losses = [2.0, 2.1, 1.9, 2.0, 2.2, 1.8, 2.0, 2.1, 1.9, 2.0, 9.0, 2.0, 9.5, 2.1, 30.0]
    whole, first = Guard(3.0, True), Guard(3.0, True)
    verdicts = []
    for step, loss in enumerate(losses, 1):
        verdicts.append(whole.judge(step, loss, 1.0))
        whole.updated(verdicts[-1])
    for step, loss in enumerate(losses[:12], 1):
        first.updated(first.judge(step, loss, 1.0))
    resumed = Guard(3.0, True)
    resumed.load_state_dict(first.state_dict())
    for step, loss in enumerate(losses[12:], 13):
        verdict = resumed.judge(step, loss, 1.0)
        resumed.updated(verdict)
        assert verdict == verdicts[step - 1]
    assert resumed.state_dict() == whole.state_dict()


def test_loss_spike_rule():
    flat = [2.0 + 0.01 * ((-1) ** i) for i in range(30)]
    assert not is_loss_spike(flat, 2.015)
    assert is_loss_spike(flat, 2.5)
    assert not is_loss_spike(flat[:5], 5.0)  # too little history to judge
    falling = [5.0 - 0.05 * i for i in range(50)]  # early training: steadily down
    assert not is_loss_spike(falling, falling[-1] - 0.05)
    assert not is_loss_spike(flat, float("nan"))
    # the rule: above mean + 4 standard deviations of the window, at least 1% of the mean above
    assert not is_loss_spike([2.0] * 30, 2.02 - 1e-9) and is_loss_spike([2.0] * 30, 2.02 + 1e-9)
    noisy = [2.0 + 0.1 * ((-1) ** i) for i in range(30)]
    std = math.sqrt(sum((v - 2.0) ** 2 for v in noisy) / 30)
    assert not is_loss_spike(noisy, 2.0 + 4 * std - 1e-9) and is_loss_spike(noisy, 2.0 + 4 * std + 1e-9)
