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
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

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
    strict: bool = False  # exit non-zero if any job failed, diverged or did not finish
    # K jobs share each GPU (or the CPU): the launcher runs K x GPUs at once, each job placed on
    # GPU (job number mod GPUs) with its share of the cores (ablate.sweep.plan_packing).
    jobs_per_gpu: Optional[int] = None


ConfigStore.instance().store(group="hydra/sweeper", name="ablate", node=AblateSweeperConf,
                             provider="ablate")


class AblateSweeper(Sweeper):
    def __init__(self, mode: str = "ofat", seeds: int = 0, jobs: Optional[List[Any]] = None,
                 dry_run: bool = False, json: bool = False, max_batch_size: Optional[int] = None,
                 strict: bool = False, jobs_per_gpu: Optional[int] = None):
        self.mode, self.seeds, self.dry_run, self.as_json = mode, seeds, dry_run, json
        self.strict, self.jobs_per_gpu = strict, jobs_per_gpu
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
        from ablate.compose import check_writable
        from ablate.errors import AblateError

        assert self.config is not None and self.hydra_context is not None
        try:
            jobs = S.plan(arguments, self.mode, self.seeds, self.jobs)
            S.check_jobs_per_gpu(self.jobs_per_gpu)
            if self.jobs_per_gpu:  # before any data is prepared
                S.check_launcher_packs(S.launcher_kind(self.config))
        except AblateError as e:
            self._fail(str(e))
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        local = S.is_local_launcher(self.config)
        if self.dry_run:
            packing, placed = None, []
            if self.jobs_per_gpu:
                first = self.hydra_context.config_loader.load_sweep_config(
                    self.config, self._job_overrides(jobs[0]))
                packing = self._packing(first)
                placed = _placement(packing, 0, first)
            self._print_plan(jobs, sweep_dir, local, packing, placed)
            return []
        if not local and shutil.which("sbatch") is None:
            self._fail("launcher=slurm submits with sbatch, which is not on PATH here: run the sweep "
                       "on the cluster's login node, or preview it with --dry-run (nothing was launched)")
        try:
            check_writable(sweep_dir, "sweep directory")
        except AblateError as e:
            self._fail(f"{e}; choose another out_dir or hydra.sweep.dir (nothing was launched)")

        batches = [self._job_overrides(j) for j in jobs]
        configs = self._check(jobs, batches, local)  # every job composes and validates, or nothing runs
        if local:
            self._prepare_data(jobs, configs)
        run_dirs = [_run_dir(cfg, i) for i, cfg in enumerate(configs)]
        if self.jobs_per_gpu:
            packing = self._packing(configs[0], configs[1:])
            batches = [b + _placement(packing, i, cfg) for i, (b, cfg) in enumerate(zip(batches, configs))]
            self._pack_launcher(packing)
            print(f"sweep: {packing.describe()}", flush=True)

        from hydra.core.plugins import Plugins

        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=self.hydra_context, task_function=self.task_function, config=self.config)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        # In-process launchers get one job at a time, so a Ctrl-C or SIGTERM (which stops the
        # running job with a checkpoint) stops the sweep too instead of starting the next job.
        target = str(self.config.hydra.launcher.get("_target_", ""))
        sequential = target.endswith("BasicLauncher")
        size = self.max_batch_size or (1 if sequential else len(batches))
        results = []
        progress = S.Progress(len(jobs))
        print(f"sweep: {len(jobs)} jobs -> {sweep_dir}", flush=True)
        for start in range(0, len(batches), size):
            end = start + size
            if sequential and any(r.status in S.STOPPED for r in results):
                results += [S.JobResult(j, "not run") for j in jobs[start:end]]
                continue
            chunk = batches[start:end]
            stamps = [S.summary_stamp(d) for d in run_dirs[start:end]]
            submitted: list = []
            began = time.monotonic()
            try:
                with _keep_submitit_jobs(submitted, "submitit" in target), \
                        S.quiet_launcher_logs(self.config.hydra.get("verbose")):
                    returns = [(ret, "" if ret is not None else "its process ended without a result")
                               for ret in self.launcher.launch(chunk, initial_job_idx=start)]
            except Exception as e:  # noqa: BLE001 - e.g. a job that died: read each job's own outcome
                print(f"warning: the launcher failed ({_one_line(e)}); reading each job's outcome "
                      "from its directory", file=sys.stderr)
                returns = _collect(submitted, len(chunk), _one_line(e))
            # one job per launch: the launch's wall time is the job's (setup included)
            took = time.monotonic() - began if len(chunk) == 1 else None
            for job, (ret, why), run_dir, stamp in zip(jobs[start:end], returns, run_dirs[start:end], stamps):
                results.append(S.result_of(job, ret) if ret is not None else
                               S.recover(job, run_dir, stamp, f"the launcher lost the job: {why}"))
                progress.report(results[-1], took)
        code = S.finish(results, sweep_dir, self.strict)
        if code:
            raise SystemExit(code)
        return results

    def _print_plan(self, jobs, sweep_dir: Path, local: bool, packing=None, placed=()) -> None:
        from ablate import sweep as S

        mode = "study" if self.jobs else self.mode
        S.print_plan(jobs, self.as_json, f"{mode} sweep: {len(jobs)} jobs -> {sweep_dir}")
        if self.as_json:
            return
        if packing is not None:
            print(f"placement: {packing.describe()}; job #0 adds {' '.join(placed) or 'nothing'}"
                  f"{' (job i: cuda:(i mod GPUs))' if len(packing.devices) > 1 else ''}")
        if local:
            return
        params = OmegaConf.to_container(self.config.hydra.launcher, resolve=True)
        size = min(self.max_batch_size or len(jobs), len(jobs))
        group = packing.group if packing is not None else 1
        tasks = -(-size // group)  # array tasks of the first submission
        n_submits = -(-len(jobs) // size)
        what = (f"one array job of {tasks} tasks" if n_submits == 1 and tasks > 1 else
                "one job" if n_submits == 1 else f"the first of {n_submits} submissions")
        if group > 1:
            what += f", {group} sweep jobs at once in each task"
        by = "ablate's packed submitit launcher" if group > 1 else "hydra-submitit-launcher"
        print(f"\nsbatch script, as {by} submits it ({what}; rendered by submitit):")
        print(S.sbatch_script(params, tasks))

    def _packing(self, job_config, others=()):
        """The placement, from the first job's config; `others` (the other jobs) are checked too."""
        from ablate import sweep as S
        from ablate.errors import AblateError

        try:
            for cfg in others:
                S.plan_packing(self.jobs_per_gpu, self.config, cfg)  # e.g. one job with train.nproc=2
            return S.plan_packing(self.jobs_per_gpu, self.config, job_config)
        except AblateError as e:
            self._fail(f"{e} (nothing was launched)")

    def _pack_launcher(self, packing) -> None:
        """The launcher settings that run `packing`: joblib's n_jobs; for submitit, ablate's packed
        launcher (hydra_plugins/ablate_pack) when a task holds more than one job."""
        from hydra_plugins.ablate_pack.pack_launcher import PACKED

        launcher = self.config.hydra.launcher
        target = str(launcher.get("_target_", ""))
        with open_dict(launcher):
            if target.endswith("JoblibLauncher"):
                launcher.n_jobs = packing.n_jobs
            elif packing.group > 1:
                launcher._target_ = PACKED[target.rsplit(".", 1)[-1]]
                launcher.jobs_per_task = packing.group

    @staticmethod
    def _job_overrides(job) -> list[str]:
        from ablate.overrides import quote
        from ablate.sweep import dir_safe

        # env_set is applied around the task function; the sweep subdir reads it too.
        return list(job.overrides) + [
            f"+hydra.job.env_set.{VARIANT_ENV}={quote(job.variant)}",
            f"+hydra.job.env_set.{JOB_ENV}={quote(dir_safe(job.name))}"]

    def _check(self, jobs, batches, local: bool) -> list:
        """Every job's composed config, checked; refuses the sweep at the first bad job."""
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        from ablate import sweep as S
        from ablate.compose import hydra_message
        from ablate.errors import AblateError

        loader = self.hydra_context.config_loader
        configs = []
        for i, (job, overrides) in enumerate(zip(jobs, batches)):
            try:
                cfg = loader.load_sweep_config(self.config, overrides)
                S.check_job(cfg, local)
            except AblateError as e:
                self._fail(f"job #{i} ({job.name}): {e} (nothing was launched)")
            except (HydraException, OmegaConfBaseException) as e:
                self._fail(f"job #{i} ({job.name}): {hydra_message(e)} (nothing was launched)")
            configs.append(cfg)
        return configs

    def _prepare_data(self, jobs, configs) -> None:
        """Tokenize each of the sweep's datasets once, here, before any job starts: the jobs then
        find the cache instead of waiting on one job's lock, and a data error is one line with
        nothing launched. Only for local launchers: a SLURM sweep's jobs prepare their own (or
        `ablate data prepare` on the login node)."""
        from ablate.compose import prepare_checked
        from ablate.errors import AblateError

        seen = set()
        for i, (job, cfg) in enumerate(zip(jobs, configs)):
            key = json.dumps([OmegaConf.to_container(cfg.data, resolve=True), cfg.tokenizer.name,
                              cfg.train.batch_size, cfg.train.seq_len], sort_keys=True, default=str)
            if key in seen:
                continue
            seen.add(key)
            try:
                prepare_checked(cfg)  # tokenized once, and holds one batch
            except AblateError as e:
                self._fail(f"job #{i} ({job.name}): {e} (nothing was launched)")


def _placement(packing, index: int, cfg: DictConfig) -> list:
    """Job `index`'s device and threads, except what its own config chose (a preset or an
    override that sets train.device or train.threads wins)."""
    chosen = {"train.device": str(cfg.train.device) not in ("auto", "cuda"),
              "train.threads": int(cfg.train.threads) > 0}
    return [o for o in packing.overrides(index) if not chosen[o.split("=", 1)[0]]]


def _run_dir(cfg: DictConfig, num: int) -> Optional[str]:
    """Where the launcher puts job `num` (hydra.sweep.dir/hydra.sweep.subdir), to read the job's
    summary.json when the launcher loses the job. Resolved as run_job resolves it: ${hydra:...}
    in the subdir reads the job's own config through HydraConfig."""
    from hydra.core.hydra_config import HydraConfig

    hydra_config = HydraConfig.instance()
    previous = hydra_config.cfg
    try:
        with open_dict(cfg.hydra.job):
            cfg.hydra.job.num = num
        hydra_config.set_config(cfg)
        return os.path.abspath(os.path.join(str(cfg.hydra.sweep.dir), str(cfg.hydra.sweep.subdir)))
    except Exception:  # noqa: BLE001 - an unresolvable subdir: only the launcher can tell then
        return None
    finally:
        hydra_config.cfg = previous


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
