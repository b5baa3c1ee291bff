"""Several jobs per device (`--jobs-per-gpu K`): small models leave most of a GPU idle, so K
jobs share each GPU (or, on a CPU-only machine, the cores), each with its share of the threads.
How the K jobs run at once is the launcher's (launchers.py: `packs`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ablate.errors import ConfigError
from ablate.sweep.launchers import Launcher, launcher_of, packing_launchers


@dataclass
class Packing:
    """How `jobs_per_gpu` places a sweep's jobs. n_jobs: jobs running at once (on this machine,
    or in one SLURM array task); devices: job i runs on devices[i % len(devices)] ([]: train.device
    is left as it is); threads: train.threads per job (0: left as it is); group: jobs per submitit
    task (1: one task per job, as hydra-submitit-launcher submits them)."""

    jobs_per_gpu: int
    n_jobs: int
    devices: list[str] = field(default_factory=list)
    threads: int = 0
    group: int = 1

    def overrides(self, index: int) -> list[str]:
        """The placement of job `index` (hydra.job.num): its device and its CPU threads."""
        out = [f"train.device={self.devices[index % len(self.devices)]}"] if self.devices else []
        return out + ([f"train.threads={self.threads}"] if self.threads else [])

    def describe(self) -> str:
        where = (f"{len(self.devices)} GPU{'s' if len(self.devices) > 1 else ''}" if self.devices
                 else "one device")
        text = f"{self.jobs_per_gpu} jobs per device on {where}: {self.n_jobs} at once"
        if self.group > 1:
            text += f", {self.group} jobs per array task"
        return text + (f", train.threads={self.threads} each" if self.threads else "")


def check_jobs_per_gpu(value: Any) -> Optional[int]:
    """None (not set) or an int >= 1; anything else is a ConfigError."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"jobs_per_gpu must be an integer >= 1, got {value!r} "
                          "(e.g. --jobs-per-gpu 4: four jobs share each GPU)")
    return value


def check_launcher_packs(launcher: Launcher) -> None:
    """jobs_per_gpu needs a launcher that runs jobs at once in their own processes."""
    if launcher.packs:
        return
    if launcher.cannot_pack:
        raise ConfigError(f"jobs_per_gpu runs several jobs at once, which {launcher.who()} "
                          f"({launcher.cannot_pack}) cannot: use {packing_launchers()}")
    raise ConfigError(f"jobs_per_gpu works with {packing_launchers()}")


def packing(jobs_per_gpu: int, launcher: Launcher, device: str, threads: int, n_gpus: int,
            cores: int, n_jobs: Optional[int] = None) -> Packing:
    """Where `jobs_per_gpu` jobs share each device. device, threads: the jobs' train.device and
    train.threads (a device other than auto/cuda, or threads > 0, was chosen by the user and is
    kept); n_gpus, cores: what one group of jobs has (this machine, or one SLURM task's
    allocation); n_jobs: the launcher's n_jobs when the user set it. Job i goes to GPU i mod
    n_gpus; each job gets cores / (jobs at once) threads so k processes do not each start a
    thread per core. A CPU-only machine is one device: k processes share its cores."""
    spread = device in ("auto", "cuda") and n_gpus > 0
    devices = [f"cuda:{i}" for i in range(n_gpus)] if spread else []
    at_once = max(1, len(devices)) * jobs_per_gpu
    group = at_once if launcher.packs == "tasks" else 1
    if launcher.packs == "processes" and n_jobs:
        at_once = n_jobs  # the user's n_jobs wins; placement still cycles over the GPUs
    per_job = 0 if threads > 0 else max(1, cores // at_once)
    return Packing(jobs_per_gpu, at_once, devices, per_job, group)


def plan_packing(jobs_per_gpu: int, config: Any, job_config: Any) -> Packing:
    """packing() for a sweep: config is the sweep's (with its hydra node and the user's
    overrides), job_config a composed job. GPUs and cores are what the launcher gives a group
    of jobs (this machine, or a SLURM task's allocation)."""
    launcher = launcher_of(config)
    check_launcher_packs(launcher)
    params = config.hydra.launcher
    if int(params.get("tasks_per_node") or 1) > 1 or int(job_config.train.nproc) > 1:
        raise ConfigError("jobs_per_gpu packs single-process jobs; a job with several ranks "
                          "(train.nproc or tasks_per_node > 1) already has its GPUs to itself")
    n_gpus, cores = launcher.resources(params)
    user_set = {o.split("=", 1)[0].lstrip("+~") for o in config.hydra.overrides.get("task", [])}
    n_jobs = (int(params.n_jobs) if launcher.packs == "processes" and "hydra.launcher.n_jobs" in user_set
              else None)
    return packing(jobs_per_gpu, launcher, str(job_config.train.device), int(job_config.train.threads),
                   n_gpus, cores, n_jobs)


def placement(packing: Packing, index: int, cfg: Any) -> list[str]:
    """Job `index`'s device and threads, except what its own config chose (a preset or an
    override that sets train.device or train.threads wins)."""
    chosen = {"train.device": str(cfg.train.device) not in ("auto", "cuda"),
              "train.threads": int(cfg.train.threads) > 0}
    return [o for o in packing.overrides(index) if not chosen[o.split("=", 1)[0]]]


def pack_launcher(launcher_params: Any, launcher: Launcher, packing: Packing) -> bool:
    """Set the sweep's launcher config to run `packing`: the launcher's n_jobs, or the packed
    launcher (hydra_plugins/ablate_pack) when a submitit task holds more than one job. Returns
    whether the packed launcher now runs the jobs."""
    from omegaconf import open_dict

    with open_dict(launcher_params):
        if launcher.packs == "processes":
            launcher_params.n_jobs = packing.n_jobs
        elif launcher.packs == "tasks" and packing.group > 1:
            launcher_params._target_ = launcher.packed_target
            launcher_params.jobs_per_task = packing.group
            return True
    return False
