"""Sweeps: Hydra runs them (multirun and a launcher); the sweeper plugin in
hydra_plugins/ablate_sweeper/ calls into this package for everything ablate-specific.

    planning.py   which jobs a sweep runs (ofat, grid, a study's list; seeds) and --dry-run's list
    checks.py     the checks before anything is launched (check_job: one job's config)
    composed.py   each job's config composed once, for its checks and the launcher
    launchers.py  each Hydra launcher as one description (local, sequential, packing, preview)
    placement.py  several jobs per GPU (--jobs-per-gpu): devices and threads per job
    sbatch.py     the sbatch script a SLURM sweep submits, for --dry-run
    report.py     a line per job as it ends, the comparison at the end, sweep.json
    machine.py    this machine's GPUs and cores
"""

from ablate.sweep.preflight import check_options, preflight
from ablate.sweep.machine import usable_cores
from ablate.sweep.planning import MODES, Job, plan

__all__ = ["MODES", "Job", "check_options", "plan", "preflight", "usable_cores"]
