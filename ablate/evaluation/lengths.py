"""A model's loss at other context lengths: `ablate eval` and train.eval_lengths.

The scored tokens are fixed per run, whatever lengths are asked: the targets of training's
validation windows (ablate/data/batches.py: val_windows), the first train.eval_tokens of the
validation split. At every length and protocol the same tokens are scored, so lengths differ only
in the context each token sees; at the training length the windows are training's own, and the
loss is the run's val_loss. Loss and bits per byte are computed by training's evaluate().

Protocols (Press et al. 2022):
  windows    non-overlapping windows of `length` tokens, every target scored (their main one);
  stride S   windows of `length` tokens S apart, each scoring only its last S targets, the first
             scored whole (their App. B; Hugging Face's "perplexity of fixed-length models"): every
             token after the first window sees at least length - S + 1 tokens of context.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from ablate.errors import ConfigError
from ablate.evaluation.length_record import (LENGTH_EVAL, EvalKey, EvalStatus, LengthRecord, LengthResult,
                                             read_lengths_checked, write_lengths)

BEYOND = "*"  # marks a length beyond the training length


def check_lengths(values: list, where: str) -> list[int]:
    """Positive integer lengths, sorted and unique; ConfigError naming `where` otherwise."""
    example = f"e.g. {where}{' ' if where.startswith('--') else '='}" + (
        "256,512,1024" if where.startswith("--") else "[256,512,1024]")
    if not values:
        raise ConfigError(f"{where} is empty: give context lengths in tokens, {example}")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{where} must be positive integers (tokens), got '{v}'; {example}")
    return sorted(set(values))


def parse_lengths(text: str) -> list[int]:
    """`256,512,1024` -> [256, 512, 1024]; ConfigError (one line) for anything else."""
    items = [t.strip() for t in text.split(",")] if text.strip() else []
    return check_lengths([int(t) if t.lstrip("-").isdigit() else t for t in items], "--lengths")


def check_stride(stride: Optional[int], lengths: list[int]) -> None:
    if stride is not None and not 1 <= stride < min(lengths):
        raise ConfigError(f"--stride must be at least 1 and below every length (the smallest is "
                          f"{min(lengths)}), got {stride}")


def windows(tokens: np.ndarray, length: int, eval_tokens: int, stride: Optional[int] = None) -> list[tuple]:
    """The windows that score the run's validation tokens at `length`: training's (start, length)
    windows, or with a stride (start, length, scored) windows each scoring its last `scored`
    targets, the last one ending at the last scored token (full context)."""
    from ablate.data.batches import val_windows

    plain = val_windows(tokens, length, eval_tokens)
    if stride is None:
        return plain
    usable = sum(n for _, n in plain)
    end = min(length, usable)
    out = [(0, end, end)]
    while end < usable:
        new_end = min(end + stride, usable)
        out.append((new_end - length, length, new_end - end))
        end = new_end
    return out


@dataclass
class EvalData:
    """What evaluation reads of a run's data."""

    val: np.ndarray  # the validation split's tokens
    byte_lengths: np.ndarray  # UTF-8 bytes per token id (bits per byte)
    eval_tokens: int  # train.eval_tokens: how many validation tokens are scored
    batch_tokens: int  # tokens per forward pass (windows per batch: batch_tokens // length)

    @property
    def scored_tokens(self) -> int:
        return sum(n for _, n in windows(self.val, self.eval_tokens, self.eval_tokens))

    def batch(self, length: int) -> int:
        """Windows per forward pass at `length`."""
        return max(1, self.batch_tokens // length)


def unreachable(model: Any, length: int, scored: int) -> Optional[str]:
    """Why the model cannot be evaluated at `length` (one line), or None."""
    reach = model.pos.max_positions
    if reach is not None and length > reach:
        return (f"pos={model.spec.pos} has {reach} position rows (model.max_seq_len): "
                f"no position beyond them")
    if length > scored:
        return (f"only {scored} validation tokens are scored (train.eval_tokens, the validation "
                f"split), fewer than one window of {length}")
    return None


def has_rope(model: Any) -> bool:
    from ablate.model.positions import RoPE

    return isinstance(model.pos, RoPE)


@contextlib.contextmanager
def rope_scaled(model: Any, scaling: Optional[str]):
    """The model's RoPE stretched by `scaling` (pi:F, ntk:F) inside the block, as trained after."""
    if scaling is None:
        yield
        return
    from ablate.model.positions import RopeScaling

    model.pos.scaling = RopeScaling.parse(scaling)
    try:
        yield
    finally:
        model.pos.scaling = None


def evaluate_key(model: Any, key: EvalKey, data: EvalData, device, autocast, step: Optional[int]) -> LengthResult:
    """The loss and bits per byte at one (length, stride, RoPE scaling), or n/a with its reason."""
    from ablate.train.evaluate import evaluate
    from ablate.names import VAL_BPB, VAL_LOSS

    scored = data.scored_tokens
    reason = unreachable(model, key.length, scored)
    if reason is not None:
        return LengthResult(key, EvalStatus.NOT_AVAILABLE, scored_tokens=scored, step=step, reason=reason)
    with rope_scaled(model, key.rope_scaling):
        try:
            m = evaluate(model, data.val, windows(data.val, key.length, data.eval_tokens, key.stride),
                         data.byte_lengths, device, data.batch(key.length), autocast)
        except (RuntimeError, MemoryError) as e:
            from ablate.evaluation.budget import is_out_of_memory

            if not is_out_of_memory(e):
                raise
            raise ConfigError(f"out of memory evaluating {key.length:,} tokens ({str(e).splitlines()[0][:120]}); "
                              "evaluate shorter lengths, or free memory") from None
    return LengthResult(key, EvalStatus.OK, m[VAL_LOSS], m[VAL_BPB], scored, step)


def check_memory(model: Any, keys: list[EvalKey], data: EvalData, train_seq_len: int, device="cpu",
                 free: Optional[int] = None) -> None:
    """ConfigError (one line, with the estimate) when a length beyond the training length needs
    more memory than is free (ablate/evaluation/budget.py), before any length is evaluated."""
    from ablate.evaluation.budget import HEADROOM, check_fits, forward_bytes, free_bytes

    free = free_bytes(device) if free is None else free
    for length in sorted({k.length for k in keys if k.length > train_seq_len}):
        if unreachable(model, length, data.scored_tokens) is not None:
            continue  # n/a: never evaluated
        batch = data.batch(length)
        need = forward_bytes(model.spec, batch, length)
        if free is None or need is None or need * HEADROOM <= free:
            continue
        fits = length // 2
        while fits > train_seq_len and (forward_bytes(model.spec, data.batch(fits), fits) or 0) * HEADROOM > free:
            fits //= 2
        most = f"{fits:,} tokens fit" if fits > train_seq_len else "the training length fits"
        check_fits(need, f"--lengths {length}: {batch} window{'s' if batch > 1 else ''} of {length:,} tokens "
                   f"(pos={model.spec.pos})", f"evaluate shorter lengths ({most}) or free memory", device, free)


@dataclass
class RunEval:
    """One run's results for the keys asked, in their order; `stored`: those returned as stored."""

    run_dir: Path
    train_seq_len: int
    results: list[LengthResult]
    stored: set[EvalKey] = field(default_factory=set)
    attention: str = ""  # its sliding windows in words (ablate/model/sliding.py describe); "" without

    def to_json(self) -> dict:
        return {"run": str(self.run_dir), "train_seq_len": self.train_seq_len, "attention": self.attention,
                "results": [r.to_json() | {"beyond_training": r.key.length > self.train_seq_len,
                                           "stored": r.key in self.stored} for r in self.results]}


def evaluate_run(run_dir: Path, model: Any, train_seq_len: int, keys: list[EvalKey], data: EvalData,
                 step: int, device="cpu", autocast=contextlib.nullcontext, write: bool = True) -> RunEval:
    """Each key's result: the stored one when the record holds it for these weights (`step`), else
    evaluated now and added to length_eval.json (a result of older weights, from before the run was
    trained further, is replaced). The run's other files are never touched."""
    from ablate.model.sliding import describe

    record = read_lengths_checked(run_dir) or LengthRecord(train_seq_len)
    out = RunEval(Path(run_dir), train_seq_len, [], attention=describe(model.spec))
    todo = [k for k in keys if record.get(k) is None or record.get(k).step != step]
    try:
        check_memory(model, todo, data, train_seq_len, device)
    except ConfigError as e:
        raise ConfigError(f"{run_dir}: {e}") from None
    new = []
    for key in keys:
        if key not in todo:
            out.results.append(record.get(key))
            out.stored.add(key)
            continue
        new.append(evaluate_key(model, key, data, device, autocast, step))
        out.results.append(new[-1])
    if new and write:
        record = read_lengths_checked(run_dir) or LengthRecord(train_seq_len)  # as it is now: others may have added
        for result in new:
            record.put(result)
        write_lengths(run_dir, record)
    return out


def format_run(ev: RunEval, protocol: str, scored: Optional[int] = None, title: str = "") -> list[str]:
    """The per-run table: length (marked beyond the training length), loss, bpb, n/a with its reason."""
    tokens = f", {scored:,} validation tokens scored" if scored else ""
    # the run (a path: as long as it is) and what was measured, each a line of its own
    lines = [f"{title or ev.run_dir}", f"  {protocol}; trained at {ev.train_seq_len} tokens{tokens}",
             f"  {'length':>8}  {'loss':>7}  {'bpb':>7}"]
    for r in ev.results:
        mark = BEYOND if r.key.length > ev.train_seq_len else " "
        head = f"  {r.key.length:>7}{mark}"
        lines.append(f"{head}  {r.loss:>7.4f}  {r.bpb:>7.4f}" if r.status == EvalStatus.OK
                     else f"{head}  {'n/a':>7}  {r.reason}")
    if any(r.key.length > ev.train_seq_len for r in ev.results):
        lines.append(f"  {BEYOND} beyond the training length ({ev.train_seq_len})")
    if ev.attention:
        from ablate.model.sliding import LOCAL_LAYERS

        lines.append(f"  sliding windows: {ev.attention}; {LOCAL_LAYERS}")
    n_stored = len(ev.stored)
    if n_stored:
        lines.append(f"  {n_stored} of {len(ev.results)} stored earlier in length_eval.json for these "
                     "weights: returned as stored, not evaluated again")
    if n_stored < len(ev.results):
        lines.append(f"  {len(ev.results) - n_stored} added to {Path(ev.run_dir) / LENGTH_EVAL}")
    return lines


def evaluate_at_end(trainer: Any, cfg: Any, val: np.ndarray, byte_lengths: np.ndarray, run_dir: Path,
                    say: Callable[[str], None]) -> None:
    """train.eval_lengths: the final weights at each length (windows), into length_eval.json. Every
    rank evaluates (a sharded model needs them all); rank 0 writes. A failure is a warning: the run
    has completed."""
    t = cfg.train
    keys = [EvalKey(n) for n in t.eval_lengths]
    data = EvalData(val, byte_lengths, t.eval_tokens, trainer.micro_batch * t.seq_len)
    try:
        ev = evaluate_run(run_dir, trainer.model, t.seq_len, keys, data, trainer.state.step,
                          trainer.device, trainer.autocast, write=trainer.is_main)
    except Exception as e:  # noqa: BLE001 - the run's training results stand; say why and how to redo
        say(f"warning: train.eval_lengths failed ({type(e).__name__}: {str(e).splitlines()[0][:160]}); "
            f"run `ablate eval {run_dir} --lengths {','.join(map(str, t.eval_lengths))}`")
        return
    if trainer.is_main:
        for line in format_run(ev, "windows", data.scored_tokens, title="length eval"):
            say(line)


