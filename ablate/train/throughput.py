"""Training speed of one fit segment: tokens/s per log row and the steady state for the summary."""

from __future__ import annotations

import time
from typing import Callable, Optional


class Throughput:
    """Training speed of one fit segment. Rows get tokens/s per log window; the summary gets the
    steady state: from the end of the segment's WARM_STEPS-th step to the last log row. The
    first step holds torch.compile and the optimizer state's allocation; the second still ran
    at ~40% of the steady speed on CPU (allocator, caches), with or without compile. Evaluation
    time is excluded from both (checkpoints and diagnostics are part of training and stay in)."""

    WARM_STEPS = 2

    def __init__(self, tokens_per_step: int, sync: Callable[[], None]):
        self.tokens_per_step, self.sync = tokens_per_step, sync
        self.steps_done = 0
        self.t_log, self.tokens_log = time.perf_counter(), 0
        self.t_first: Optional[float] = None  # when the segment's first step began
        self.warm_s: Optional[float] = None  # how long the warm-up steps took
        self.steady_from: Optional[float] = None
        self.steady_step0 = 0
        self.steady_steps, self.steady_time, self.eval_s = 0, 0.0, 0.0
        self.total_tokens, self.total_time = 0, 0.0

    def start(self) -> None:
        """The clock of the first row's window starts here (after the evaluation at init)."""
        self.t_log = time.perf_counter()

    def step_started(self) -> None:
        if self.t_first is None:
            self.t_first = time.perf_counter()

    def step_done(self, step: int) -> None:
        self.tokens_log += self.tokens_per_step
        self.steps_done += 1
        if self.steps_done == self.WARM_STEPS:  # wait for the device: warm-up is all counted
            self.sync()
            self.steady_from = time.perf_counter()
            self.warm_s = self.steady_from - self.t_first
            self.steady_step0 = step

    def log(self, step: int) -> float:
        """A row at `step`: this window's tokens/s; the steady state is measured up to here."""
        now = time.perf_counter()
        tps = self.tokens_log / max(now - self.t_log, 1e-9)
        self.total_tokens += self.tokens_log
        self.total_time += now - self.t_log
        self.t_log, self.tokens_log = now, 0
        if self.steady_from is not None and step > self.steady_step0:
            self.steady_steps = step - self.steady_step0
            self.steady_time = now - self.steady_from - self.eval_s
        return tps

    def exclude(self, seconds: float) -> None:
        """Time that is not training (evaluation)."""
        self.t_log += seconds
        if self.steady_from is not None:
            self.eval_s += seconds

    @property
    def step_s(self) -> Optional[float]:
        return self.steady_time / self.steady_steps if self.steady_steps and self.steady_time > 0 else None

    @property
    def tokens_per_s(self) -> Optional[float]:
        """Steady state; a segment of WARM_STEPS or fewer has none: its whole time instead."""
        if self.step_s:
            return self.tokens_per_step / self.step_s
        return self.total_tokens / self.total_time if self.total_time > 0 else None
