"""SLURM's part of `--dry-run`: the sbatch script hydra-submitit-launcher (or ablate's packed
launcher) would submit, rendered by submitit itself, so no cluster is needed to check it."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any, Optional


def sbatch_script(launcher_params: dict, n_jobs: int) -> str:
    """The sbatch script hydra-submitit-launcher submits for `n_jobs` jobs at once. The launcher
    calls executor.map_array: two or more jobs are one array job (--array=0-N%P, logs under
    %A_%a), one job is a plain job. Parameters are renamed as AutoExecutor renames them
    (timeout_min -> time, mem_gb -> mem, ...)."""
    from submitit.slurm.slurm import SlurmExecutor, _convert_mem, _make_sbatch_string

    rename = SlurmExecutor._equivalence_dict()
    kwargs = {}
    for key, value in launcher_params.items():
        if key in ("_target_", "submitit_folder", "max_num_timeout") or value is None:
            continue  # None: unset, as submitit treats it
        kwargs[rename.get(key, key)] = _convert_mem(value) if key == "mem_gb" else value
    folder = Path(str(launcher_params["submitit_folder"])).expanduser().absolute()
    command = f"{shlex.quote(sys.executable)} -u -m submitit.core._submit {shlex.quote(str(folder))}"
    return _make_sbatch_string(command=command, folder=folder,
                               map_count=n_jobs if n_jobs > 1 else None, **kwargs)


def preview(params: dict, n_jobs: int, max_batch_size: Optional[int], packing: Any) -> str:
    """What --dry-run prints for a SLURM sweep of `n_jobs`: which submission the script is (one
    array job, or the first of several when max_batch_size splits the sweep) and the script."""
    size = min(max_batch_size or n_jobs, n_jobs)
    group = packing.group if packing is not None else 1
    tasks = -(-size // group)  # array tasks of the first submission
    n_submits = -(-n_jobs // size)
    what = (f"one array job of {tasks} tasks" if n_submits == 1 and tasks > 1 else
            "one job" if n_submits == 1 else f"the first of {n_submits} submissions")
    if group > 1:
        what += f", {group} sweep jobs at once in each task"
    by = "ablate's packed submitit launcher" if group > 1 else "hydra-submitit-launcher"
    return f"\nsbatch script, as {by} submits it ({what}; rendered by submitit):\n{sbatch_script(params, tasks)}"
