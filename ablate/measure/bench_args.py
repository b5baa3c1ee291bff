"""The arguments of `ablate bench` (and `bench --decode`), checked without torch: bad input is
one line before the ~3 CPU-s import of torch (ablate/measure/bench.py, ablate/measure/decode_bench.py need it)."""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from ablate.errors import ConfigError

# wall: elapsed time, what a user waits (the default; use a quiet machine). cpu: CPU time of
# this process, which a busy shared machine disturbs far less (descheduled time is not
# counted); meaningful on CPU, best with train.threads=1 (idle OpenMP threads spin).
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}

DEFAULT_BATCHES = (1, 8, 32)
DEFAULT_NEW_TOKENS = 32


def check_options(steps: int, warmup: int, rounds: int, reference: bool, axes: bool, vs: list, only: list,
                  clock: str, jobs_per_device: Optional[list[int]], sweep_jobs: int, moe: bool = False) -> None:
    """The benchmark's own arguments, checked once here (the CLI hands them on); ConfigError."""
    for name, value, low in (("--steps", steps, 1), ("--warmup", warmup, 0), ("--rounds", rounds, 1),
                             ("--sweep-jobs", sweep_jobs, 1)):
        if value < low:
            raise ConfigError(f"{name} must be >= {low}, got {value}")
    if (axes or vs or moe) and reference:
        raise ConfigError("--reference and --axes/--vs/--moe are separate benchmarks: pick one")
    if clock not in CLOCKS:
        raise ConfigError(f"--clock must be {' or '.join(CLOCKS)}, got '{clock}'")
    if only and not axes:
        raise ConfigError("--only selects rows of --axes")
    if jobs_per_device is not None and (not jobs_per_device or min(jobs_per_device) < 1):
        raise ConfigError("--jobs-per-device takes a list of integers >= 1, e.g. 1,2,4,8")
    if jobs_per_device and (reference or axes or vs or moe or clock != "wall"):
        raise ConfigError("--jobs-per-device times whole processes by the wall clock; use it without "
                          "--reference, --axes, --vs, --moe and --clock cpu")


def check_decode(batches: Optional[list[int]], context: Optional[int], new_tokens: Optional[int],
                 reference: bool, jobs_per_device: Optional[str]) -> None:
    """The decode benchmark's own arguments (ConfigError: one line each)."""
    if batches is not None and (not batches or min(batches) < 1):
        raise ConfigError("--batch takes a list of integers >= 1, e.g. 1,8,32")
    for name, value in (("--context", context), ("--new-tokens", new_tokens)):
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    if reference or jobs_per_device is not None:
        raise ConfigError("--decode times generation; --reference and --jobs-per-device time training "
                          "steps: use them without --decode")


def default_context(cfg: Any, new_tokens: int) -> int:
    """The prompt that, with the new tokens, fills the training length (train.seq_len)."""
    context = int(cfg.train.seq_len) - new_tokens
    if context < 1:
        raise ConfigError(f"--new-tokens {new_tokens} leaves no prompt within train.seq_len="
                          f"{cfg.train.seq_len}; give --context N")
    return context
