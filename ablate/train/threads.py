"""How many CPU threads a command computes with, on a CPU that other processes may be using
(docs/performance.md, "Threads on a shared CPU").

torch's CPU build runs its intra-op parallelism on GNU OpenMP (libgomp), whose waiting threads
spin by default. Beside another busy process, one thread of an op spins on a core while the
other waits to be scheduled, and a small model's thousands of small ops each pay for it
(measured 2026-11-29 on the 2-core host: 2 threads beside other load 5-12x slower than 1).
Two defaults keep a command within reach of its time alone:

- OMP_WAIT_POLICY=PASSIVE (`quiet_openmp`, called by the CLI before torch is imported, since
  libgomp reads it once, when it is loaded): a waiting thread sleeps instead of spinning. An
  OMP_WAIT_POLICY already in the environment is kept.
- the thread count from the cores free at start (`choose_threads`): the cores this process may
  run on (its CPU affinity: a SLURM job's cpuset) minus the load of other processes on them
  (the 1-minute load average, scaled from the machine's cores to those), rounded, at least 1,
  at most torch's own default. `train.threads=N` (or `--threads N`) chooses it instead, and so
  does OMP_NUM_THREADS in the environment (as torch itself reads it).

A load above the cores is said in one line when the count was chosen here
(`ThreadChoice.notice`): every figure the command measures is then slower than on an idle machine.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from typing import Callable, Optional

WAIT_POLICY = "OMP_WAIT_POLICY"


def quiet_openmp(environ=os.environ) -> None:
    """Waiting OpenMP threads sleep instead of spinning (unless the environment says otherwise).
    Effective only before torch is imported in this process; child processes inherit it."""
    environ.setdefault(WAIT_POLICY, "PASSIVE")


@dataclass(frozen=True)
class CpuLoad:
    """The CPU as a command finds it at its start."""

    cores: int  # the cores this process may run on
    machine_cores: int  # every core of the machine (what the load average counts against)
    load: float  # the machine's 1-minute load average: runnable processes, other ones mostly

    @classmethod
    def now(cls) -> "CpuLoad":
        machine = os.cpu_count() or 1
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # not Linux
            cores = machine
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):  # no load average here: an idle machine, as torch assumes
            load = 0.0
        return cls(max(1, cores), max(1, machine), max(0.0, load))

    @property
    def busy(self) -> float:
        """Other processes' load on this process's cores (the machine's spread evenly)."""
        return self.load * self.cores / self.machine_cores

    @property
    def oversubscribed(self) -> bool:
        return self.busy > self.cores


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    requested: int  # train.threads / --threads (0: chosen here)
    cpu: CpuLoad
    spelling: str  # how the user chooses it: `--threads N` or `train.threads=N`

    @property
    def notice(self) -> Optional[str]:
        """One line when other processes keep the cores busy and the count was chosen here (a
        count the user gave is theirs to know); None otherwise."""
        if not self.cpu.oversubscribed or self.requested:
            return None
        plural = "s" if self.threads > 1 else ""
        return (f"notice: the CPU is busy (load {self.cpu.load:.1f} on {self.cpu.machine_cores} cores): "
                f"computing with {self.threads} thread{plural}; times are slower than on an idle machine "
                f"({self.spelling} chooses the threads)")


def choose_threads(requested: int, cpu: CpuLoad, torch_default: int, spelling: str = "train.threads=N") -> ThreadChoice:
    """`requested` when it is above 0; else the cores left free (CpuLoad.busy), rounded half up,
    between 1 and torch_default (torch's own thread count: its physical cores)."""
    if requested > 0:
        return ThreadChoice(int(requested), int(requested), cpu, spelling)
    free = math.floor(cpu.cores - cpu.busy + 0.5)
    return ThreadChoice(max(1, min(torch_default, free)), 0, cpu, spelling)


def env_threads() -> int:
    """OMP_NUM_THREADS when the environment sets it (a job script's choice, or the test suite's):
    the count is then the user's, as torch itself takes it; 0 otherwise."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() else 0


_torch_default: Optional[int] = None
_start_cpu: Optional[CpuLoad] = None  # the CPU as this process's first choice found it


def cpu_at_start() -> CpuLoad:
    """The CPU as this process found it when it first chose: a later choice in the same process
    (a sweep's next job, eval's next run) would count this process's own work in the load
    average as other processes' load."""
    global _start_cpu
    if _start_cpu is None:
        _start_cpu = CpuLoad.now()
    return _start_cpu


def torch_default_threads() -> int:
    """torch's thread count before this process first set it (its default, or OMP_NUM_THREADS)."""
    global _torch_default
    if _torch_default is None:
        import torch

        _torch_default = torch.get_num_threads()
    return _torch_default


def use_threads(requested: int, spelling: str = "train.threads=N",
                say: Optional[Callable[[str], None]] = None, cpu: Optional[CpuLoad] = None) -> ThreadChoice:
    """Choose the thread count (choose_threads) and set it in torch; the notice, if any, goes
    to `say` (default: stderr; a sweep's jobs pass a no-op)."""
    import torch

    requested = int(requested or 0) or env_threads()
    choice = choose_threads(requested, cpu or cpu_at_start(), torch_default_threads(), spelling)
    torch.set_num_threads(choice.threads)
    if choice.notice:
        (say or (lambda line: print(line, file=sys.stderr, flush=True)))(choice.notice)
    return choice


def check_threads(value: Optional[int], option: str = "--threads") -> None:
    """A thread count a user gave: a positive integer (0: chosen from the free cores)."""
    from ablate.errors import ConfigError

    if value is not None and value < 0:
        raise ConfigError(f"{option} must be 0 (chosen from the free cores) or a number of threads, got {value}")
