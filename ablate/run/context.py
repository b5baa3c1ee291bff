"""What a process learns from its environment, read here only.

Environment variables cross process boundaries that nothing else crosses: a sweeper hands a
job its identity through Hydra's `hydra.job.env_set` (the job may run in another process or on
another node: submitit), a run hands its torchrun ranks theirs, torchrun and submitit tell a
rank where it is (RANK, WORLD_SIZE), SLURM names the job. Inside a process the run's identity
and settings travel as a typed RunContext (ablate/run/entry.py builds it), never through os.environ.

Light: nothing heavy is imported (the sweeper imports it while Hydra scans its plugins).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ablate.train.signals import StopRequest

VARIANT_ENV = "ABLATE_VARIANT"  # a sweep job's variant name (what differs from the baseline)
JOB_ENV = "ABLATE_JOB"  # a sweep job's directory name (its variant and seed): conf/config.yaml
SWEEP_ENV = "ABLATE_SWEEP"  # the sweep a torchrun rank's run belongs to (its W&B group)


@dataclass(frozen=True)
class ProcessEnv:
    rank: int = 0
    local_rank: int = 0
    world: int = 1
    variant: Optional[str] = None  # VARIANT_ENV: set by the sweeper or the run of a torchrun rank
    sweep: Optional[str] = None  # SWEEP_ENV
    slurm_job: Optional[str] = None  # SLURM_JOB_ID
    submitit: bool = False  # started by submitit (SUBMITIT_EXECUTOR)

    @classmethod
    def read(cls) -> "ProcessEnv":
        """The environment as it is now (submitit's ranks are exported into it at the start of
        a run: ablate.train.distributed.export_submitit_env)."""
        env = os.environ
        return cls(rank=int(env.get("RANK", "0")), local_rank=int(env.get("LOCAL_RANK", "0")),
                   world=int(env.get("WORLD_SIZE", "1")), variant=env.get(VARIANT_ENV) or None,
                   sweep=env.get(SWEEP_ENV) or None, slurm_job=env.get("SLURM_JOB_ID") or None,
                   submitit=bool(env.get("SUBMITIT_EXECUTOR")))

    @property
    def distributed(self) -> bool:
        """One rank of several (torchrun, or submitit's tasks)."""
        return self.world > 1

    @staticmethod
    def for_ranks(variant: str, sweep: Optional[str]) -> dict[str, str]:
        """What a run passes to the torchrun ranks it starts: its own identity."""
        return {VARIANT_ENV: variant, **({SWEEP_ENV: sweep} if sweep else {})}


@dataclass
class RunContext:
    """A run's identity and settings, built once when it starts (ablate/run/entry.py) and handed to
    what runs it: the launch, the sinks, the trainer."""

    run_dir: Path
    overrides: list[str]  # the job's overrides, as Hydra received them
    variant: str  # the run's name: what differs from the defaults (its sweeper's name for a job)
    sweep: Optional[str]  # the sweep it belongs to (its W&B group)
    multirun: bool  # a sweep's job: nothing on the console but errors (the sweep reports it)
    stop: StopRequest  # installed from the run's start to its record
    rank: int = 0
    world: int = 1  # processes (ranks) that train it
    job_started: Optional[float] = None  # time.time() the job began; None: when the process did
    resume_state: Optional[dict] = None  # the checkpoint it continues, loaded and checked

    @property
    def is_main(self) -> bool:
        """Rank 0: writes the files and reports."""
        return self.rank == 0
