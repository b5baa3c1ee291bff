"""Where a run is: the run's state as one component (torchtitan's TrainState). It travels in
checkpoints with the guard's state (policy.py), so a resumed run continues, counts and reports
exactly as an uninterrupted one would."""

from __future__ import annotations

from dataclasses import dataclass, field

from ablate.names import TOKENS, TOKENS_PER_S, TRAIN_LOSS, VAL_BPB, VAL_LOSS


def _no_metrics() -> dict:
    return {TRAIN_LOSS: None, VAL_LOSS: None, VAL_BPB: None, TOKENS_PER_S: None}


@dataclass
class RunState:
    tokens_per_step: int
    # The steps the learning-rate schedule spans: train.steps, except in a run extended past
    # them (ablate/run/lifecycle.py), whose extra steps keep the rate the schedule ended with.
    schedule_steps: int
    # The warmup the run started with (train.warmup_steps, resolved): an automatic one is a
    # fraction of train.steps, which an extended run changes; the schedule must not.
    warmup_steps: int
    step: int = 0  # finished optimizer steps
    # Tokens are counted from the checkpoint resumed (it stores them), not recomputed from the
    # step: a run may have changed its batch layout since (tokens_at).
    resumed_step: int = 0
    resumed_tokens: int = 0
    last: dict = field(default_factory=_no_metrics)  # the last reported metrics (the summary's)

    def tokens_at(self, step: int) -> int:
        return self.resumed_tokens + (step - self.resumed_step) * self.tokens_per_step

    def state_dict(self) -> dict:
        return {"step": self.step, TOKENS: self.tokens_at(self.step),
                "schedule_steps": self.schedule_steps, "warmup_steps": self.warmup_steps,
                "last": dict(self.last)}

    def load_state_dict(self, state: dict) -> None:
        self.step = self.resumed_step = int(state["step"])
        self.resumed_tokens = int(state.get(TOKENS, self.step * self.tokens_per_step))
        self.schedule_steps = int(state.get("schedule_steps", self.schedule_steps))
        self.warmup_steps = int(state.get("warmup_steps", self.warmup_steps))
        self.last.update(state.get("last", {}))
