"""The `ablate` Hydra sweeper: plans the jobs (ablate.sweep), checks every job's config before
anything is launched, hands the jobs to whichever Hydra launcher is configured, and prints the
comparison at the end. Each job learns its variant name through hydra.job.env_set, which names
its directory and its run (a job never stops the others: the run entry returns a status).

No `from __future__ import annotations` here: Hydra's plugin scanner executes this module
before it is in sys.modules, and dataclasses then cannot resolve string annotations."""

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)

VARIANT_ENV = "ABLATE_VARIANT"  # the variant's name (what differs from the baseline)
JOB_ENV = "ABLATE_JOB"  # the variant and its seed: the job directory's name


@dataclass
class AblateSweeperConf:
    _target_: str = "hydra_plugins.ablate_sweeper.ablate_sweeper.AblateSweeper"
    mode: str = "ofat"  # ofat | grid
    seeds: int = 0  # >0: every variant with seed=0..seeds-1
    jobs: Optional[List[Any]] = None  # an explicit job list [{name, overrides}] (studies)
    dry_run: bool = False  # list the jobs, launch nothing
    json: bool = False  # with dry_run: a JSON list of the jobs' override lists
    max_batch_size: Optional[int] = None  # jobs handed to the launcher at once (null: all)


ConfigStore.instance().store(group="hydra/sweeper", name="ablate", node=AblateSweeperConf,
                             provider="ablate")


class AblateSweeper(Sweeper):
    def __init__(self, mode: str = "ofat", seeds: int = 0, jobs: Optional[List[Any]] = None,
                 dry_run: bool = False, json: bool = False, max_batch_size: Optional[int] = None):
        self.mode, self.seeds, self.dry_run, self.as_json = mode, seeds, dry_run, json
        self.jobs = OmegaConf.to_container(jobs, resolve=True) if OmegaConf.is_config(jobs) else jobs
        self.max_batch_size = max_batch_size
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.task_function: Optional[TaskFunction] = None
        self.launcher = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def _fail(self, message: str) -> None:
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)

    def sweep(self, arguments: List[str]) -> Any:
        from ablate import sweep as S
        from ablate.errors import AblateError

        assert self.config is not None and self.hydra_context is not None
        try:
            jobs = S.plan(arguments, self.mode, self.seeds, self.jobs)
        except AblateError as e:
            self._fail(str(e))
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        local = S.is_local_launcher(self.config)
        if self.dry_run:
            mode = "study" if self.jobs else self.mode
            S.print_plan(jobs, self.as_json, f"{mode} sweep: {len(jobs)} jobs -> {sweep_dir}")
            if not local and not self.as_json:
                params = OmegaConf.to_container(self.config.hydra.launcher, resolve=True)
                print("\nsbatch script per job (hydra-submitit-launcher, rendered by submitit):")
                print(S.sbatch_script(params, str(sweep_dir / ".submitit" / "%j")))
            return []

        batches = [self._job_overrides(j) for j in jobs]
        self._check(jobs, batches, local)  # every job composes and validates, or nothing runs

        from hydra.core.plugins import Plugins

        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=self.hydra_context, task_function=self.task_function, config=self.config)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        # In-process launchers get one job at a time, so a Ctrl-C or SIGTERM (which stops the
        # running job with a checkpoint) stops the sweep too instead of starting the next job.
        sequential = str(self.config.hydra.launcher.get("_target_", "")).endswith("BasicLauncher")
        size = self.max_batch_size or (1 if sequential else len(batches))
        results = []
        for start in range(0, len(batches), size):
            if sequential and any(r.status in S.STOPPED for r in results):
                results += [S.JobResult(j, "not run") for j in jobs[start:start + size]]
                continue
            chunk = batches[start:start + size]
            try:
                returns = self.launcher.launch(chunk, initial_job_idx=start)
            except Exception as e:  # noqa: BLE001 - e.g. a submitit job that died: record, go on
                log.error(f"jobs {start}..{start + len(chunk) - 1} failed to run: {e}")
                returns = [None] * len(chunk)
            for job, ret in zip(jobs[start:start + size], returns):
                results.append(S.result_of(job, ret) if ret is not None
                               else S.JobResult(job, "failed", None, "the launcher lost the job"))
        code = S.finish(results, sweep_dir)
        if code:
            raise SystemExit(code)
        return results

    @staticmethod
    def _job_overrides(job) -> list[str]:
        from ablate.sweep import dir_safe, quote

        # env_set is applied around the task function; the sweep subdir reads it too.
        return list(job.overrides) + [
            f"+hydra.job.env_set.{VARIANT_ENV}={quote(job.variant)}",
            f"+hydra.job.env_set.{JOB_ENV}={quote(dir_safe(job.name))}"]

    def _check(self, jobs, batches, local: bool) -> None:
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        from ablate import sweep as S
        from ablate.compose import hydra_message
        from ablate.errors import AblateError

        loader = self.hydra_context.config_loader
        for i, (job, overrides) in enumerate(zip(jobs, batches)):
            try:
                cfg = loader.load_sweep_config(self.config, overrides)
                S.check_job(cfg, local)
            except AblateError as e:
                self._fail(f"job #{i} ({job.name}): {e} (nothing was launched)")
            except (HydraException, OmegaConfBaseException) as e:
                self._fail(f"job #{i} ({job.name}): {hydra_message(e)} (nothing was launched)")
