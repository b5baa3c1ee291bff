"""Every Hydra launcher a sweep knows, each as one description: the package that provides it,
whether its jobs run on this machine and one at a time, how `--jobs-per-gpu` packs its jobs and
what `--dry-run` previews. The sweeper, the checks, the packing and the dry run read only these,
so a new launcher is one entry in LAUNCHERS (and its conf/launcher/<option>.yaml).

A launcher is recognised by the class its config instantiates (hydra.launcher._target_)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import ablate.sweep.machine as machine


def _this_machine(params: Any) -> tuple[int, int]:
    return machine.visible_gpus(), machine.usable_cores()


def _local_submitit(params: Any) -> tuple[int, int]:
    """submitit's local executor hands each task the GPUs its config asks for (gpus_per_node)."""
    return int(params.get("gpus_per_node") or 0), machine.usable_cores()


def _slurm_allocation(params: Any) -> tuple[int, int]:
    """One task's share of the allocation the launcher asks SLURM for, not this (login) machine."""
    tasks = max(1, int(params.get("tasks_per_node") or 1))
    return int(params.get("gpus_per_node") or 0) // tasks, int(params.get("cpus_per_task") or 1)


def _sbatch_preview(params: dict, n_jobs: int, max_batch_size: Optional[int], packing: Any) -> str:
    from ablate.sweep.sbatch import preview

    return preview(params, n_jobs, max_batch_size, packing)


@dataclass(frozen=True)
class Launcher:
    name: str  # Hydra's option: hydra/launcher=<name>
    classes: tuple[str, ...] = ()  # the classes hydra.launcher._target_ names for it
    option: str = ""  # ablate's launcher=<option> (conf/launcher/<option>.yaml), if it has one
    package: str = ""  # `pip install <package>` provides it
    local: bool = True  # jobs run on this machine: checked against it, their data prepared here
    sequential: bool = False  # one job at a time in this process: a stopped job stops the sweep
    submitit: bool = False  # launches submitit jobs, each of which can be waited for and read alone
    command: str = ""  # what launching needs on PATH (sbatch)
    # --jobs-per-gpu: "processes" runs K x GPUs jobs at once through the launcher's own `n_jobs`;
    # "tasks" puts K x GPUs jobs in each submitit task (packed_target runs them); "": cannot pack.
    packs: str = ""
    packed_target: str = ""
    cannot_pack: str = ""  # why it cannot pack, for the error
    resources: Callable[[Any], tuple[int, int]] = _this_machine  # (GPUs, cores) a packed group has
    preview: Optional[Callable[[dict, int, Optional[int], Any], str]] = None  # --dry-run shows it

    def who(self) -> str:
        return f"launcher={self.option or self.name}"


_PACKED = "hydra_plugins.ablate_pack.pack_launcher."
LAUNCHERS: dict[str, Launcher] = {d.name: d for d in (
    Launcher("basic", ("BasicLauncher",), option="basic", sequential=True,
             cannot_pack="one job after another in this process"),
    Launcher("joblib", ("JoblibLauncher",), option="joblib", package="hydra-joblib-launcher",
             packs="processes"),
    Launcher("submitit_local", ("LocalLauncher", "PackedLocalLauncher"), option="submitit_local",
             package="hydra-submitit-launcher", submitit=True, packs="tasks",
             packed_target=_PACKED + "PackedLocalLauncher", resources=_local_submitit),
    Launcher("submitit_slurm", ("SlurmLauncher", "PackedSlurmLauncher"), option="slurm",
             package="hydra-submitit-launcher", local=False, submitit=True, command="sbatch",
             packs="tasks", packed_target=_PACKED + "PackedSlurmLauncher",
             resources=_slurm_allocation, preview=_sbatch_preview),
    Launcher("ray", ("RayLauncher",), package="hydra-ray-launcher"),
    Launcher("rq", ("RQLauncher",), package="hydra-rq-launcher"),
)}
OTHER = Launcher("other")  # a launcher ablate does not describe: local, several jobs per launch


def launcher_of(config: Any) -> Launcher:
    """The description of the launcher a sweep's config (with its hydra node) instantiates."""
    target = str(config.hydra.launcher.get("_target_", ""))
    cls = target.rsplit(".", 1)[-1]
    return next((d for d in LAUNCHERS.values() if cls in d.classes), OTHER)


def packing_launchers() -> str:
    """'launcher=joblib, submitit_local or slurm': those that can pack, as a user names them."""
    names = [d.option for d in LAUNCHERS.values() if d.packs and d.option]
    return "launcher=" + ", ".join(names[:-1]) + f" or {names[-1]}"


def missing_launcher_message(error: str, overrides: list[str]) -> Optional[str]:
    """Hydra's "Could not find 'hydra/launcher/X'" as an install hint, else None."""
    import re

    m = re.search(r"hydra/launcher/([A-Za-z0-9_]+)", error)
    if not m:
        return None
    plugin = m.group(1)
    chosen = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "launcher"), plugin)
    known = LAUNCHERS.get(plugin)
    package = known.package if known and known.package else f"the Hydra launcher plugin '{plugin}'"
    return (f"launcher={chosen} needs the Hydra launcher plugin '{plugin}', which is not installed; "
            f"install it with `pip install {package}` (nothing was launched)")
