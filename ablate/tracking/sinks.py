"""Metric sinks: the trainer hands every logged row to `Sinks.log`; it never imports wandb.

Row keys (the metrics.jsonl contract): step, tokens, train_loss, grad_norm, lr, tokens_per_s;
eval rows add val_loss, val_bpb; diagnostics rows add `diag/...` keys.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ablate.run.record import RunInfo, RunRecord, active_note
from ablate.names import MFU, TOKENS_PER_S, TRAIN_LOSS, VAL_BPB, VAL_LOSS


class Sink:
    def start(self, info: RunInfo) -> None:
        """Called once before the first step with what the run built. `info` becomes part of
        summary.json: a sink may fill in its own field (the W&B sink: where its records went)."""

    def log(self, row: dict) -> None:
        raise NotImplementedError

    def finish(self, record: RunRecord) -> None:
        """Called once at the end with the run's record (also on failure)."""


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

    def finish(self, record):
        self.f.close()


log = logging.getLogger("ablate")


def say(line: str, console: bool = True, write=None) -> None:
    """One line to the run's ablate.log (Hydra's job log file: the `ablate` logger's handler) and,
    unless `console` is off (a sweep job: its sweep prints one line per job), to stdout."""
    log.info(line)
    if console:
        (write or print)(line)
        sys.stdout.flush()


def format_duration(seconds: float) -> str:
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def train_line(row: dict, total: int, eta_s: Optional[float]) -> str:
    """`step   120/5000 | loss 4.1234 | 12,345 tok/s | mfu 31.2% | eta 12m03s`"""
    width = len(str(total))
    parts = [f"step {row['step']:>{width}}/{total}", f"loss {row[TRAIN_LOSS]:.4f}"]
    if row.get(TOKENS_PER_S) is not None:
        parts.append(f"{row[TOKENS_PER_S]:,.0f} tok/s")
    if row.get(MFU) is not None:  # a fraction of the device's peak FLOP/s
        parts.append(f"mfu {100 * row[MFU]:.1f}%")
    parts.append(f"eta {format_duration(eta_s)}" if eta_s is not None else "eta ?")
    return " | ".join(parts)


def eval_line(row: dict, total: int) -> str:
    width = len(str(total))
    return f"step {row['step']:>{width}}/{total} | val_loss {row[VAL_LOSS]:.4f} | val_bpb {row[VAL_BPB]:.4f}"


@dataclass(frozen=True)
class About:
    """Which run the banner announces."""

    variant: str
    seed: int
    run_dir: str


def banner(about: About, info: RunInfo, steps: int, start_step: int = 0) -> list[str]:
    """What is about to train, before its first step (the summary table repeats it at the end)."""
    resumed = f" (resuming at step {start_step})" if start_step else ""
    accum = info.grad_accum_steps or 1
    return [
        f"ablate run: {about.variant} (seed {about.seed})",
        f"  params {info.params or 0:,} ({info.non_embedding_params or 0:,} non-embedding{active_note(info)})"
        f" | FLOPs/token {info.flops_per_token or 0:,} | tokens/step {info.tokens_per_step or 0:,}"
        + (f" ({accum} passes of {info.micro_batch} sequences)" if accum > 1 else ""),
        f"  device {info.device} | precision {info.precision} | compile "
        f"{'on' if info.compile else 'off'}{' (+ optimizer step)' if info.compile_optimizer else ''}"
        f" | {steps} steps{resumed}",
        f"  run dir {about.run_dir}",
    ]


class ConsoleSink(Sink):
    """What a person reads while a run trains. On a terminal: a progress bar (step, loss, tok/s,
    MFU) with eval lines printed above it. Off a terminal (piped to a file, a cluster job's log):
    plain lines every logged step instead of the bar's `\\r` frames. Eval lines always.
    `train.progress=false`: no bar and no step lines, eval lines still. `quiet` (a sweep job):
    nothing on the console. The run's ablate.log gets the banner and every line in each case."""

    def __init__(self, total_steps: int, enabled: bool = True, start_step: int = 0,
                 quiet: bool = False, tty: Optional[bool] = None, about: Optional[About] = None):
        self.about = about or About("?", 0, "?")  # for the banner
        self.enabled = enabled
        self.total = total_steps
        self.bar = None
        self.start_step = start_step
        self.quiet = quiet
        self.tty = sys.stdout.isatty() if tty is None else tty
        self.rate_from = None  # (step, time) of the first logged row: the ETA's origin

    def start(self, info):
        from ablate.terminal import print_wrapped  # on a terminal: broken at fields, not mid-number

        for line in banner(self.about, info, self.total, self.start_step):
            say(line, console=not self.quiet, write=print_wrapped if self.tty else None)
        if not self.enabled or self.quiet or not self.tty:
            return
        from tqdm import tqdm

        self.bar = tqdm(total=self.total, initial=self.start_step, desc="train", unit="step",
                        dynamic_ncols=True, mininterval=0.5)

    def _eta(self, step: int) -> Optional[float]:
        now = time.monotonic()
        if self.rate_from is None:
            self.rate_from = (step, now)
            return None
        done, elapsed = step - self.rate_from[0], now - self.rate_from[1]
        return (self.total - step) * elapsed / done if done > 0 else None

    def log(self, row):
        write = self.bar.write if self.bar is not None else None
        if row.get("step") == 0 and "diag/grad_norm/block0" in row:  # train.steps=0: init profile
            from ablate.train.diagnostics import format_profile, profile_from_row

            for line in format_profile(profile_from_row(row)).splitlines():
                say(line, console=not self.quiet, write=write)
        if TRAIN_LOSS in row:
            line = train_line(row, self.total, self._eta(row["step"]))
            say(line, console=self.enabled and not self.quiet and self.bar is None)
            if self.bar is not None:
                self.bar.n = row["step"]
                self.bar.set_postfix_str(line.split(" | ", 1)[1].rsplit(" | eta", 1)[0], refresh=True)
        if VAL_LOSS in row:
            say(eval_line(row, self.total), console=not self.quiet, write=write)

    def finish(self, record):
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

    def finish(self, record):
        for s in self.sinks:
            try:
                s.finish(record)
            except Exception as e:  # a failing dashboard must not hide the run's real outcome
                print(f"warning: {type(s).__name__}.finish failed: {e}")
