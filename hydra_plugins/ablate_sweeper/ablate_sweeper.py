"""The `ablate` Hydra sweeper: plans the jobs (ablate.sweep), checks every job's config (and, for
local launchers, prepares the data) before anything is launched, hands the jobs to whichever
Hydra launcher is configured, and prints the comparison at the end. Each job learns its variant
name through hydra.job.env_set, which names its directory and its run. A job never stops the
others: the run entry returns a status, and a job the launcher loses (killed, OOM, node failure)
is read from its own directory; sweep.json records every job's outcome.

No `from __future__ import annotations` here: Hydra's plugin scanner executes this module
before it is in sys.modules, and dataclasses then cannot resolve string annotations."""

import contextlib
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from ablate.run.context import JOB_ENV, VARIANT_ENV
from ablate.sweep.composed import ComposedJobs


@dataclass
class AblateSweeperConf:
    _target_: str = "hydra_plugins.ablate_sweeper.ablate_sweeper.AblateSweeper"
    mode: str = "ofat"  # ofat | grid
    seeds: int = 0  # >0: every variant with seed=0..seeds-1
    jobs: Optional[List[Any]] = None  # an explicit job list [{name, overrides}] (studies)
    dry_run: bool = False  # list the jobs, launch nothing
    json: bool = False  # with dry_run: a JSON list of the jobs' override lists
    max_batch_size: Optional[int] = None  # jobs handed to the launcher at once (null: all)
    strict: bool = False  # exit non-zero if any job failed, diverged or did not finish
    # K jobs share each GPU (or the CPU): the launcher runs K x GPUs at once, each job placed on
    # GPU (job number mod GPUs) with its share of the cores (ablate/sweep/placement.py).
    jobs_per_gpu: Optional[int] = None
    lr_grid: Optional[str] = None  # LO:HI:N: every variant at N LRs, then the seeds at its best
    ladder: Optional[str] = None  # every variant on every rung of conf/ladder/NAME.yaml


ConfigStore.instance().store(group="hydra/sweeper", name="ablate", node=AblateSweeperConf,
                             provider="ablate")


class AblateSweeper(Sweeper):
    def __init__(self, mode: str = "ofat", seeds: int = 0, jobs: Optional[List[Any]] = None,
                 dry_run: bool = False, json: bool = False, max_batch_size: Optional[int] = None,
                 strict: bool = False, jobs_per_gpu: Optional[int] = None,
                 lr_grid: Optional[str] = None, ladder: Optional[str] = None):
        self.mode, self.seeds, self.dry_run, self.as_json = mode, seeds, dry_run, json
        self.strict, self.jobs_per_gpu = strict, jobs_per_gpu
        self.lr_grid, self.ladder = lr_grid, ladder
        self.jobs = OmegaConf.to_container(jobs, resolve=True) if OmegaConf.is_config(jobs) else jobs
        self.max_batch_size = max_batch_size
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.task_function: Optional[TaskFunction] = None
        self.launcher = None
        self.composed = ComposedJobs()

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def sweep(self, arguments: List[str]) -> Any:
        from ablate.sweep.preflight import check_can_launch, check_configs, check_jobs
        from ablate.sweep.launchers import launcher_of
        from ablate.sweep.placement import check_jobs_per_gpu, check_launcher_packs
        from ablate.sweep.planning import plan
        from ablate.sweep.progress import Progress, finish

        assert self.config is not None and self.hydra_context is not None
        kind = launcher_of(self.config)
        transfer = None
        with _refusing(""):
            if self.lr_grid or self.ladder:
                transfer = self._transfer_plan(arguments)
                jobs = transfer.jobs
            else:
                jobs = plan(arguments, self.mode, self.seeds, self.jobs)
            check_jobs_per_gpu(self.jobs_per_gpu)
            if self.jobs_per_gpu:  # before any data is prepared
                check_launcher_packs(kind)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        with _refusing():
            if not self.dry_run:
                check_can_launch(kind, sweep_dir)
            # every job is valid, or nothing runs; a dry run refuses what the sweep would
            configs, run_dirs = check_jobs(jobs, self._load, kind)
            if transfer is not None:  # the later phase's configs too: they differ only in their LR
                check_configs(transfer.later_shapes(), self._load)
            packing = self._packing(configs) if self.jobs_per_gpu else None
            if transfer is not None and not self.dry_run:
                transfer.record_in(sweep_dir)
        if self.dry_run:
            self._print_dry_run(jobs, sweep_dir, kind, packing, configs[0], transfer)
            return []
        if kind.local:
            self._prepare_data(jobs, configs)
        progress = Progress(len(jobs) + (transfer.later if transfer else 0))
        results = self._launch(jobs, configs, run_dirs, sweep_dir, kind, packing, progress)
        if transfer is not None and transfer.later and not _stopped(results, kind):
            more = transfer.next_jobs(results)
            with _refusing():
                configs, run_dirs = check_jobs(more, self._load, kind, start=len(jobs))
                packing = self._packing(configs) if self.jobs_per_gpu else None
            results += self._launch(more, configs, run_dirs, sweep_dir, kind, packing, progress,
                                    start=len(jobs))
        code = finish(results, sweep_dir, self.strict, self.config.logger if transfer else None)
        if code:
            raise SystemExit(code)
        return results

    def _transfer_plan(self, arguments: List[str]):
        """An --lr-grid or --ladder sweep's plan (ablate/sweep/transfer_plan.py); the ladder's steps
        come from the baseline's parameters at each rung, composed here."""
        from ablate.sweep.transfer_plan import Rung, TransferPlan, rung_size

        def plan_rung(baseline, rung: Rung):
            return rung_size(rung, lambda: self._load(type(baseline)(baseline.overrides + rung.overrides())))

        def base_lr(variant) -> float:
            return float(self._load(variant).train.lr)

        def param_of(variant) -> str:
            return str(self._load(variant).param.name)

        def tied_lrs(variant) -> dict:
            from ablate.train.optimizers.optim_settings import OptimSpec

            return OptimSpec.from_config(self._load(variant)).tied_lrs()

        return TransferPlan.make(arguments, self.mode, self.seeds, self.jobs, self.lr_grid,
                                 self.ladder, plan_rung, base_lr, param_of, tied_lrs)

    def _load(self, job) -> DictConfig:
        """A job's composed config (with its hydra node), as the launcher will compose it."""
        return self.composed.load(self.hydra_context.config_loader, self.config, _job_overrides(job))

    def _packing(self, configs):
        """The placement, from the first job's config; every job is checked (one with
        train.nproc=2 cannot share a GPU)."""
        from ablate.sweep.placement import plan_packing

        for cfg in configs[1:]:
            plan_packing(self.jobs_per_gpu, self.config, cfg)
        return plan_packing(self.jobs_per_gpu, self.config, configs[0])

    def _print_dry_run(self, jobs, sweep_dir: Path, kind, packing, first: DictConfig, transfer) -> None:
        from ablate.sweep.placement import placement
        from ablate.sweep.planning import print_plan

        mode = "study" if self.jobs else self.mode
        header = transfer.header(len(jobs), sweep_dir) if transfer else f"{mode} sweep: {len(jobs)} jobs -> {sweep_dir}"
        print_plan(jobs, self.as_json, header)
        if self.as_json:
            return
        if transfer is not None and transfer.later:
            print(transfer.then())
        if packing is not None:
            placed = placement(packing, 0, first)
            print(f"placement: {packing.describe()}; job #0 adds {' '.join(placed) or 'nothing'}"
                  f"{' (job i: cuda:(i mod GPUs))' if len(packing.devices) > 1 else ''}")
        if kind.preview is not None:
            params = OmegaConf.to_container(self.config.hydra.launcher, resolve=True)
            print(kind.preview(params, len(jobs), self.max_batch_size, packing))

    def _launch(self, jobs, configs, run_dirs, sweep_dir: Path, kind, packing, progress,
                start: int = 0) -> list:
        """Hand the jobs (numbered from `start`) to the launcher, a batch at a time, with a line
        per job as it ends; their results."""
        from hydra.core.plugins import Plugins

        from ablate.sweep import progress as R
        from ablate.sweep.placement import pack_launcher, placement
        from ablate.names import Status

        progress.expect(jobs, configs)
        batches = [_job_overrides(j) for j in jobs]
        packed = False
        if packing is not None:
            batches = [b + placement(packing, start + i, cfg)
                       for i, (b, cfg) in enumerate(zip(batches, configs))]
            packed = pack_launcher(self.config.hydra.launcher, kind, packing)
            print(f"sweep: {packing.describe()}", flush=True)
        if self.launcher is None:
            self.launcher = Plugins.instance().instantiate_launcher(
                hydra_context=self.hydra_context, task_function=self.task_function, config=self.config)
            if type(self.launcher).__name__ == "BasicLauncher":  # it composes each job again, here
                self.launcher.hydra_context = replace(
                    self.hydra_context, config_loader=self.composed.loader(self.hydra_context.config_loader))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        # In-process launchers get one job at a time, so a Ctrl-C or SIGTERM (which stops the
        # running job with a checkpoint) stops the sweep too instead of starting the next job.
        size = self.max_batch_size or (1 if kind.sequential else len(batches))
        # a packed task returns its group's results: its jobs are read from their directories
        collect = kind.submitit and not packed
        results: list = []
        # a sweep launched in phases (an LR scan, then its picks) numbers its jobs as the progress does
        span = f"{len(jobs)} jobs" if len(jobs) == progress.total else \
            f"jobs {start + 1}-{start + len(jobs)} of {progress.total}"
        print(f"sweep: {span} -> {sweep_dir}", flush=True)
        for first in range(0, len(batches), size):
            end = first + size
            if _stopped(results, kind):
                results += [R.JobResult(j, Status.NOT_RUN) for j in jobs[first:end]]
                continue
            began = time.monotonic()
            chunk = self._launch_batch(batches[first:end], start + first, jobs[first:end],
                                       run_dirs[first:end], collect)
            took = time.monotonic() - began if len(chunk) == 1 else None  # the launch's time is the job's
            for r in chunk:
                results.append(r)
                progress.report(r, took)
        return results

    def _launch_batch(self, batch, start: int, jobs, run_dirs, collect: bool) -> list:
        """One launch: each job's result, or, for a job the launcher lost, what its directory says."""
        from ablate.sweep import progress as R

        stamps = [R.summary_stamp(d) for d in run_dirs]
        earlier = [R.earlier_outcome(d) for d in run_dirs]
        submitted: list = []
        try:
            with _keep_submitit_jobs(submitted, collect), \
                    R.quiet_launcher_logs(self.config.hydra.get("verbose")):
                returns = [(ret, "" if ret is not None else "its process ended without a result")
                           for ret in self.launcher.launch(batch, initial_job_idx=start)]
        except Exception as e:  # noqa: BLE001 - e.g. a job that died: read each job's own outcome
            print(f"warning: the launcher failed ({_one_line(e)}); reading each job's outcome "
                  "from its directory", file=sys.stderr)
            returns = _collect(submitted, len(batch), _one_line(e))
        results = [R.result_of(job, ret) if ret is not None else
                   R.recover(job, run_dir, stamp, f"the launcher lost the job: {why}")
                   for job, (ret, why), run_dir, stamp in zip(jobs, returns, run_dirs, stamps)]
        for r, before in zip(results, earlier):
            r.earlier = r.status in R.FINISHED and R.done_earlier(before, r.run_dir)
        return results

    def _prepare_data(self, jobs, configs) -> None:
        """Tokenize each of the sweep's datasets once, here, before any job starts: the jobs then
        find the cache instead of waiting on one job's lock, and a data error is one line with
        nothing launched. Only for local launchers: a SLURM sweep's jobs prepare their own (or
        `ablate data prepare` on the login node)."""
        from ablate.config.compose import prepare_checked
        from ablate.errors import AblateError

        seen = set()
        for i, (job, cfg) in enumerate(zip(jobs, configs)):
            key = json.dumps([OmegaConf.to_container(cfg.data, resolve=True), cfg.tokenizer.name,
                              cfg.train.batch_size, cfg.train.seq_len], sort_keys=True, default=str)
            if key in seen:
                continue
            seen.add(key)
            with _refusing():
                try:
                    prepare_checked(cfg)  # tokenized once, and holds one batch
                except AblateError as e:
                    raise type(e)(f"job #{i} ({job.name}): {e}") from None


def _stopped(results: list, kind) -> bool:
    """A sequential launcher's job was stopped by a signal: the sweep stops there."""
    from ablate.names import STOPPED

    return kind.sequential and any(r.status in STOPPED for r in results)


@contextlib.contextmanager
def _refusing(suffix: str = " (nothing was launched)"):
    """An AblateError inside refuses the sweep in one line (`error: ...`, exit 2)."""
    from ablate.errors import AblateError

    try:
        yield
    except AblateError as e:
        print(f"error: {e}{suffix}", file=sys.stderr)
        raise SystemExit(e.exit_code) from None


def _job_overrides(job) -> list:
    from ablate.config.overrides import quote

    # env_set is applied around the task function; the sweep subdir reads it too.
    return list(job.overrides) + [
        f"+hydra.job.env_set.{VARIANT_ENV}={quote(job.variant)}",
        f"+hydra.job.env_set.{JOB_ENV}={quote(job.dir_name)}"]


def _one_line(e: BaseException) -> str:
    """An exception in one line; two lines of its message, since submitit's UncompletedJobError
    puts the job's state on the second ("has not produced any output (state: OUT_OF_MEMORY)")."""
    text = " ".join(str(e).strip().splitlines()[:2])
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


@contextlib.contextmanager
def _keep_submitit_jobs(into: list, enabled: bool):
    """hydra-submitit-launcher returns [j.results()[0] for j in jobs]: the first job that died
    raises, and the other jobs are dropped while they may still be running. Keep the jobs that
    executor.map_array submits, so that each can be waited for and read on its own."""
    if not enabled:
        yield
        return
    from submitit.core.core import Executor

    original = Executor.map_array

    def map_array(executor, fn, *iterable):
        jobs = original(executor, fn, *iterable)
        into.extend(jobs)
        return jobs

    Executor.map_array = map_array
    try:
        yield
    finally:
        Executor.map_array = original


def _collect(submitted: list, n: int, error: str) -> list:
    """(JobReturn, "") per job from its own submitit job, waiting for those still running; (None,
    why) for a job that returned nothing (its directory is read then)."""
    if len(submitted) != n:  # the launcher failed before or while submitting
        return [(None, error)] * n
    out = []
    for job in submitted:
        job.wait()
        if not job.paths.result_pickle.exists():  # died (results() would wait 15 s more to say so)
            out.append((None, f"submitit job {job.job_id} has not produced any output (state: {job.state})"))
            continue
        try:
            out.append((job.results()[0], ""))
        except Exception as e:  # noqa: BLE001 - this job failed outside the task; read its directory
            out.append((None, _one_line(e)))
    return out
