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
from pathlib import Path
from typing import Any, Optional


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
    parts = [f"step {row['step']:>{width}}/{total}", f"loss {row['train_loss']:.4f}"]
    if row.get("tokens_per_s") is not None:
        parts.append(f"{row['tokens_per_s']:,.0f} tok/s")
    if row.get("mfu") is not None:  # a fraction of the device's peak FLOP/s
        parts.append(f"mfu {100 * row['mfu']:.1f}%")
    parts.append(f"eta {format_duration(eta_s)}" if eta_s is not None else "eta ?")
    return " | ".join(parts)


def eval_line(row: dict, total: int) -> str:
    width = len(str(total))
    return f"step {row['step']:>{width}}/{total} | val_loss {row['val_loss']:.4f} | val_bpb {row['val_bpb']:.4f}"


def banner(info: dict) -> list[str]:
    """What is about to train, before its first step (the summary table repeats it at the end)."""
    resumed = f" (resuming at step {info['start_step']})" if info.get("start_step") else ""
    return [
        f"ablate run: {info.get('variant', '?')} (seed {info.get('seed')})",
        f"  params {info.get('params', 0):,} ({info.get('non_embedding_params', 0):,} non-embedding)"
        f" | FLOPs/token {info.get('flops_per_token', 0):,} | tokens/step {info.get('tokens_per_step', 0):,}"
        + (f" ({info['grad_accum_steps']} passes of {info['micro_batch']} sequences)"
           if info.get("grad_accum_steps", 1) > 1 else ""),
        f"  device {info.get('device')} | precision {info.get('precision')} | compile "
        f"{'on' if info.get('compile') else 'off'}{' (+ optimizer step)' if info.get('compile_optimizer') else ''}"
        f" | {info.get('steps')} steps{resumed}",
        f"  run dir {info.get('run_dir')}",
    ]


class ConsoleSink(Sink):
    """What a person reads while a run trains. On a terminal: a progress bar (step, loss, tok/s,
    MFU) with eval lines printed above it. Off a terminal (piped to a file, a cluster job's log):
    plain lines every logged step instead of the bar's `\\r` frames. Eval lines always.
    `train.progress=false`: no bar and no step lines, eval lines still. `quiet` (a sweep job):
    nothing on the console. The run's ablate.log gets the banner and every line in each case."""

    def __init__(self, total_steps: int, enabled: bool = True, start_step: int = 0,
                 quiet: bool = False, tty: Optional[bool] = None, about: Optional[dict] = None):
        self.about = dict(about or {})  # variant, seed, run_dir: for the banner
        self.enabled = enabled
        self.total = total_steps
        self.bar = None
        self.start_step = start_step
        self.quiet = quiet
        self.tty = sys.stdout.isatty() if tty is None else tty
        self.rate_from = None  # (step, time) of the first logged row: the ETA's origin

    def start(self, info):
        from ablate.report import print_wrapped  # on a terminal: broken at fields, not mid-number

        for line in banner({**self.about, **info, "start_step": self.start_step, "steps": self.total}):
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
            from ablate.diagnostics import format_profile, profile_from_row

            for line in format_profile(profile_from_row(row)).splitlines():
                say(line, console=not self.quiet, write=write)
        if "train_loss" in row:
            line = train_line(row, self.total, self._eta(row["step"]))
            say(line, console=self.enabled and not self.quiet and self.bar is None)
            if self.bar is not None:
                self.bar.n = row["step"]
                self.bar.set_postfix_str(line.split(" | ", 1)[1].rsplit(" | eta", 1)[0], refresh=True)
        if "val_loss" in row:
            say(eval_line(row, self.total), console=not self.quiet, write=write)

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
