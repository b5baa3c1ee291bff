"""The trainer's policies, one job each (as torchtitan's components): when a step logs, evaluates
and saves a checkpoint (Cadence), and whether a step's loss ends the run or skips its update
(Guard, with the rule that counts loss spikes). Pure Python: the loop in trainer.py asks them and
does the work."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Any, Optional, Sequence

SPIKE_WINDOW = 50  # the guard's running window of recent losses
SPIKE_Z = 4.0  # a spike: loss above mean + SPIKE_Z * std of the window
SPIKE_MIN_HISTORY = 10


def is_loss_spike(history: Sequence[float], loss: float, z: float = SPIKE_Z,
                  min_history: int = SPIKE_MIN_HISTORY) -> bool:
    """Whether `loss` exceeds the mean of the recent losses by more than z standard deviations
    (with a floor of 1% of the mean, so a flat loss curve does not count noise as spikes): the
    count diagnostics log (`diag/loss_spikes`); it never stops a run."""
    n = len(history)
    if n < min_history or not math.isfinite(loss):
        return False
    mean = sum(history) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in history) / n)
    return loss - mean > max(z * std, 0.01 * abs(mean))


# With train.skip_spikes, this many skipped updates in a row end the run as diverged: a spike is
# a few bad batches; a loss that stays above its old level is a lasting shift, and skipping it
# would skip every remaining update of a run that still reports `completed`.
MAX_SKIPS_IN_A_ROW = 10


@dataclass(frozen=True)
class Cadence:
    """Steps are counted after the update: step n is the n-th finished optimizer step."""

    steps: int
    log_every: int
    eval_every: int  # 0: only at the end
    ckpt_every: int  # 0: only at the end (and on a stop signal)

    @classmethod
    def from_config(cls, cfg: Any) -> "Cadence":
        # train.ckpt_every=null (the default): a checkpoint at every evaluation, so a run killed
        # without warning (SIGKILL, OOM, a lost node) loses at most one evaluation interval.
        ckpt = cfg.ckpt_every if cfg.ckpt_every is not None else cfg.eval_every
        return cls(cfg.steps, cfg.log_every, cfg.eval_every, ckpt)

    def logs(self, step: int) -> bool:
        return step % self.log_every == 0 or step == self.steps

    def evaluates(self, step: int) -> bool:
        return bool(self.eval_every and step % self.eval_every == 0) or step == self.steps

    def saves(self, step: int) -> bool:
        """A periodic checkpoint; the final one is saved when the run completes."""
        return bool(self.ckpt_every) and step % self.ckpt_every == 0 and step < self.steps


class Action(Enum):
    """What a step's verdict does with its update."""

    UPDATE = "update"
    SKIP = "skip"  # drop this step's update (train.skip_spikes): OLMo-core's SkipStep
    DIVERGE = "diverge"  # the run ends here, diverged


@dataclass(frozen=True)
class Verdict:
    action: Action = Action.UPDATE
    reason: str = ""  # why it diverged (DIVERGE)


class Guard:
    """Divergence: a non-finite loss or grad norm always ends the run; a loss above
    `threshold` x its recent running mean (after 10 steps of history) is a spike, which ends it
    too, or with `skip_spikes` drops that update (OLMo-core's SkipStep) until
    MAX_SKIPS_IN_A_ROW in a row. Its state travels in checkpoints, so a resumed run judges
    exactly as an uninterrupted one."""

    def __init__(self, threshold: float, skip_spikes: bool):
        self.threshold, self.skip_spikes = threshold, skip_spikes
        self.recent: deque[float] = deque(maxlen=SPIKE_WINDOW)  # recent accepted train losses
        self.loss_spikes = 0  # losses far above the recent window (is_loss_spike)
        self.skipped = 0
        self.skips_in_a_row = 0

    def judge(self, step: int, loss: float, gnorm: float) -> Verdict:
        """The verdict on step `step`'s (1-based) loss and grad norm, before its update."""
        reason = self._reason(step, loss, gnorm)
        skip = bool(reason) and self.skip_spikes and reason.startswith("spike")
        if skip and self.skips_in_a_row + 1 >= MAX_SKIPS_IN_A_ROW:
            skip, reason = False, (f"{MAX_SKIPS_IN_A_ROW} updates in a row skipped as loss spikes "
                                   f"(train.skip_spikes): a lasting shift; {reason}")
        self.loss_spikes += is_loss_spike(self.recent, loss)
        if reason and not skip:
            return Verdict(Action.DIVERGE, reason)
        if skip:
            return Verdict(Action.SKIP)
        self.recent.append(loss)
        return Verdict()

    def _reason(self, step: int, loss: float, gnorm: float) -> Optional[str]:
        if not math.isfinite(loss):
            return f"non-finite loss ({loss}) at step {step}"
        if not math.isfinite(gnorm):
            return f"non-finite grad norm ({gnorm}) at step {step}"
        if self.threshold > 0 and len(self.recent) >= 10:
            mean = sum(self.recent) / len(self.recent)
            if loss > self.threshold * mean:
                return f"spike: loss {loss:.3f} > {self.threshold} x running mean {mean:.3f} at step {step}"
        return None

    def updated(self, verdict: Verdict) -> None:
        """After the step's update was applied or skipped as `verdict` said."""
        if verdict.action is Action.SKIP:
            self.skipped += 1
            self.skips_in_a_row += 1
        else:
            self.skips_in_a_row = 0

    def state_dict(self) -> dict:
        return {"recent": list(self.recent), "loss_spikes": self.loss_spikes, "skipped": self.skipped,
                "skips_in_a_row": self.skips_in_a_row}

    def load_state_dict(self, state: dict) -> None:
        self.recent.extend(state.get("recent", []))
        self.loss_spikes = int(state.get("loss_spikes", 0))
        self.skipped = int(state.get("skipped", 0))
        self.skips_in_a_row = int(state.get("skips_in_a_row", 0))
