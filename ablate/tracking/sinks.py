"""Metric sinks: the trainer hands every logged row to `Sinks.log`; it never imports wandb.

Row keys (the metrics.jsonl contract): step, tokens, train_loss, grad_norm, lr, tokens_per_s;
eval rows add val_loss, val_bpb; diagnostics rows add `diag/...` keys.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class Sink:
    def start(self, info: dict) -> None:
        """Called once before the first step with the run's description. `info` becomes part
        of summary.json: a sink may add one entry under its own name (where its records went)."""

    def log(self, row: dict) -> None:
        raise NotImplementedError

    def finish(self, summary: dict) -> None:
        """Called once at the end with summary.json's content (also on failure)."""


def _json_safe(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN/inf; "nan"/"inf" keep the fact
    return v


class JsonlSink(Sink):
    """metrics.jsonl: one object per logged step, flushed each time so a killed run keeps its curve."""

    def __init__(self, path: Path, append: bool = False):
        self.path = Path(path)
        self.f = self.path.open("a" if append else "w", encoding="utf-8")

    def log(self, row):
        self.f.write(json.dumps({k: _json_safe(v) for k, v in row.items()}) + "\n")
        self.f.flush()

    def finish(self, summary):
        self.f.close()


class ConsoleSink(Sink):
    """A progress bar with step, loss and tokens/s; eval lines are printed above it."""

    def __init__(self, total_steps: int, enabled: bool = True, start_step: int = 0):
        self.enabled = enabled
        self.total = total_steps
        self.bar = None
        self.start_step = start_step

    def start(self, info):
        if not self.enabled:
            return
        from tqdm import tqdm

        self.bar = tqdm(total=self.total, initial=self.start_step, desc="train", unit="step",
                        dynamic_ncols=True, mininterval=0.5)

    def log(self, row):
        if row.get("step") == 0 and "diag/grad_norm/block0" in row:  # train.steps=0: init profile
            from ablate.diagnostics import format_profile, profile_from_row

            (self.bar.write if self.bar is not None else print)(format_profile(profile_from_row(row)))
        if self.bar is None:
            return
        if "train_loss" in row:
            self.bar.n = row["step"]
            self.bar.set_postfix_str(
                f"loss {row['train_loss']:.4f} | {row.get('tokens_per_s', 0):,.0f} tok/s", refresh=True)
        if "val_loss" in row:
            self.bar.write(f"step {row['step']:>6}  val_loss {row['val_loss']:.4f}  "
                           f"val_bpb {row['val_bpb']:.4f}")

    def finish(self, summary):
        if self.bar is not None:
            self.bar.close()


class Sinks(Sink):
    def __init__(self, sinks: list[Sink]):
        self.sinks = sinks

    def start(self, info):
        for s in self.sinks:
            s.start(info)

    def log(self, row):
        for s in self.sinks:
            s.log(row)

    def finish(self, summary):
        for s in self.sinks:
            try:
                s.finish(summary)
            except Exception as e:  # a failing dashboard must not hide the run's real outcome
                print(f"warning: {type(s).__name__}.finish failed: {e}")
