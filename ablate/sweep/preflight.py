"""The checks before a sweep launches anything: bad input is refused in one line, with no
directory made. `preflight` runs before Hydra starts (the first job composes, the plan is made,
the launcher is installed); `check_jobs` runs in the sweeper on every job's composed config and
run directory, for a real sweep and for its --dry-run alike: a check of one job goes in
`check_job`, of the jobs together in `check_jobs` (check_base_shapes)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ablate.errors import AblateError, ConfigError
from ablate.sweep.launchers import Launcher, missing_launcher_message
from ablate.sweep.placement import check_jobs_per_gpu
from ablate.sweep.planning import Job, check_mode, check_seeds, naming, parse, plan


def check_options(mode: str, seeds: Optional[int], jobs_per_gpu: Optional[int],
                  lr_grid: Optional[str] = None, ladder: Optional[str] = None) -> None:
    """The sweep's own options, as `ablate sweep` takes them (--mode, --seeds, --jobs-per-gpu,
    --lr-grid, --ladder; None: not given)."""
    check_mode(mode)
    check_seeds(seeds)
    check_jobs_per_gpu(jobs_per_gpu)
    if lr_grid is not None or ladder is not None:
        from ablate.sweep.transfer_plan import check_transfer

        check_transfer(lr_grid, ladder)


def preflight(arguments: Sequence[str], mode: str = "ofat", seeds: int = 0, ladder: bool = False) -> list[Job]:
    """Compose the sweep's first job (with the hydra node) and plan the jobs, so a wrong option,
    a launcher that is not installed or an empty ofat sweep is refused in one line before
    Hydra makes any directory. The sweeper checks every job (check_jobs) before launching."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from ablate.config.axes import CONF_DIR
    from ablate.config.compose import check_no_secrets, check_quoted, hydra_message, load_plugins
    from ablate.config.schema import register_configs
    from ablate.sweep.transfer_plan import variant_tokens

    check_no_secrets(list(arguments))  # before Hydra sees it: its errors and files echo values
    check_quoted(list(arguments))
    load_plugins(list(arguments))  # their options are swept like built-in ones
    p = parse(arguments)
    _check_ladder_keys(p, ladder)
    first = variant_tokens(p.fixed + [values[0] for _, values in p.swept])[1]  # --ladder's own keys out
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=first, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as e:
        message = hydra_message(e)
        raise ConfigError(missing_launcher_message(message, first) or message) from None
    finally:
        GlobalHydra.instance().clear()
    sweeper = cfg.hydra.sweeper
    if not str(sweeper.get("_target_", "")).startswith("hydra_plugins.ablate_sweeper"):
        return []  # another sweeper was chosen (hydra/sweeper=...): it plans its own jobs
    jobs = sweeper.get("jobs")
    return plan(arguments, mode, seeds, OmegaConf.to_container(jobs, resolve=True) if jobs else None)


def _check_ladder_keys(p: Any, ladder: bool) -> None:
    """ladder.* keys are not config keys: ladder.tokens_per_param is a --ladder sweep's variant,
    swept; the others set the ladder for the whole sweep (ablate/sweep/transfer_plan.py)."""
    from ablate.sweep.transfer_plan import LADDER_PREFIX, TOKENS_KEY, ladder_settings

    keys = [o.lstrip("+").split("=", 1)[0] for o in p.fixed] + [k.lstrip("+") for k, _ in p.swept]
    given = [k for k in keys if k.startswith(LADDER_PREFIX)]
    if given and not ladder:
        what = ("makes the tokens a variant of a --ladder sweep (e.g. "
                f"{TOKENS_KEY}=20,40" if given[0] == TOKENS_KEY else
                "sets the ladder of a --ladder sweep (e.g. ladder.lr_rule=mup")
        raise ConfigError(f"{given[0]} {what} --ladder cpu)")
    fixed = [o for o in p.fixed if o.lstrip("+").split("=", 1)[0] == TOKENS_KEY]
    if fixed:
        raise ConfigError(f"{fixed[0]} alone would set every variant's tokens: edit tokens_per_param "
                          f"in the ladder file, or sweep it ({TOKENS_KEY}=20,40)")
    ladder_settings(p)


def check_job(config: Any, launcher: Launcher, run_dir: Optional[str]) -> None:
    """One job's checks, before anything of the sweep is launched (a real sweep and its dry run
    alike): its composed config (with its hydra node), ablate's invariants, and where the job
    will run on this machine, torchrun's process count and what tokenizing needs (hub, files).
    run_dir: where the launcher will put the job (None: its subdir resolves only in the job)."""
    from ablate.config.schema import validate

    validate(config)
    if run_dir is not None:  # a re-run into the sweep's directory: the one re-entry rule
        from ablate.run.lifecycle import check_reentry

        # a sweep is extended as a whole (`ablate resume <sweep dir> --extend N`), not job by job
        check_reentry(Path(run_dir), config, extend_dir=Path(run_dir).parent)
    if launcher.local:
        from ablate.data.cache import preflight as data_preflight
        from ablate.train.distributed import check_nproc

        check_nproc(config)
        data_preflight(config.data, config.tokenizer.name)


def check_jobs(jobs: Sequence[Job], load: Callable[[Job], Any], launcher: Launcher,
               start: int = 0) -> tuple[list, list]:
    """Every job's config, composed by `load`, and its run directory, checked by check_job, then
    the jobs together (check_base_shapes); the first bad job refuses the sweep (an AblateError
    naming it). Jobs are numbered from `start` (a sweep's second phase). Returns (configs, run dirs)."""
    configs, run_dirs = [], []
    for i, job in enumerate(jobs, start):
        with naming(f"job #{i} ({job.name})"):
            config = load(job)
            run_dir = job_dir(config, i)
            check_job(config, launcher, run_dir)
        configs.append(config)
        run_dirs.append(run_dir)
    check_base_shapes(configs)
    return configs, run_dirs


def check_base_shapes(configs: Sequence[Any]) -> None:
    """Runs of one param option with width rules (mup, completep) at several widths name their
    base width, and completep's at several depths its base depth: left null, each run's base is
    its own shape, so each would train as sp and the sweep would not be the one asked for."""
    from ablate.model import options

    for key, size, lost in (("base_width", "d_model", "train as sp"),
                            ("base_depth", "n_layers", "lose the depth rules")):
        own: dict = {}  # param option -> the sizes of its runs at their own base
        for c in configs:
            option = options.get("param", str(c.param.name))
            rules = option.width if key == "base_width" else option.depth_alpha is not None
            if rules and c.model.get(key) is None:
                own.setdefault(str(c.param.name), set()).add(int(c.model[size]))
        for name, sizes in own.items():
            if len(sizes) > 1:
                listed = ", ".join(map(str, sorted(sizes)))
                raise ConfigError(f"param={name} with model.{key}=null takes each run's own model.{size} "
                                  f"as its base, so the runs at model.{size}={listed} would each {lost}: "
                                  f"name the base for all of them, e.g. model.{key}={min(sizes)}")


def job_dir(config: Any, num: int) -> Optional[str]:
    """Where the launcher puts job `num` (hydra.sweep.dir/hydra.sweep.subdir). Resolved as
    Hydra's run_job resolves it: ${hydra:...} in the subdir reads the job's own config."""
    import os

    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    hydra_config = HydraConfig.instance()
    previous = hydra_config.cfg
    try:
        with open_dict(config.hydra.job):
            config.hydra.job.num = num
        hydra_config.set_config(config)
        return os.path.abspath(os.path.join(str(config.hydra.sweep.dir), str(config.hydra.sweep.subdir)))
    except Exception:  # noqa: BLE001 - an unresolvable subdir: only the launcher can tell then
        return None
    finally:
        hydra_config.cfg = previous


def check_can_launch(launcher: Launcher, sweep_dir: Path) -> None:
    """What launching needs here: the launcher's command (sbatch) and a writable sweep directory."""
    from ablate.config.compose import check_writable

    if launcher.command and shutil.which(launcher.command) is None:
        raise ConfigError(f"{launcher.who()} submits with {launcher.command}, which is not on PATH here: "
                          "run the sweep on the cluster's login node, or preview it with --dry-run")
    try:
        check_writable(sweep_dir, "sweep directory")
    except AblateError as e:
        raise type(e)(f"{e}; choose another out_dir or hydra.sweep.dir") from None
