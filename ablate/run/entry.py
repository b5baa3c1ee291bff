"""The one `@hydra.main` entry point behind `ablate run` and `ablate sweep`.

Hydra owns composition, the output directory, logging, sweepers and launchers; this module
turns a composed config into a finished run directory with a truthful record (summary.json:
ablate/run/record.py). It builds the run's context (RunContext: who the run is, where, on which
rank), asks the lifecycle what entering the directory does, opens the record, trains, and
writes and reports the outcome.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import sys
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

import hydra
from omegaconf import DictConfig, OmegaConf

from ablate.run import lifecycle
from ablate.config.axes import CONF_DIR
from ablate.config.schema import axis_values, register_configs, validate
from ablate.run.context import ProcessEnv, RunContext
from ablate.errors import AblateError
from ablate.run.record import Process, RunRecord, known
from ablate.run.directory import CONFIG, SUMMARY, RunLock, owner, write_atomic
from ablate.tracking.sinks import Sink
from ablate.train.signals import Phase, StopRequest, Stopped
from ablate.names import STOPPED, STOPPED_EXIT, VAL_LOSS, Status, variant_name, variant_overrides

log = logging.getLogger("ablate")

def _name_resolver(override_dirname: str) -> str:
    # A name a shell takes as printed (the banner's path pastes into `ablate resume`): a value
    # with shell-special characters or a long one is hashed; a path does not nest the directory.
    from ablate.run.directory import dir_name

    return dir_name(override_dirname or "baseline")


if not OmegaConf.has_resolver("ablate_name"):
    OmegaConf.register_new_resolver("ablate_name", _name_resolver)
register_configs()


@dataclass(frozen=True)
class HydraJob:
    """What Hydra says about this job."""

    run_dir: Path
    overrides: list[str]  # the task overrides
    multirun: bool
    sweep: Optional[str]  # multirun: the sweep directory's name


def _hydra_job() -> HydraJob:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    return HydraJob(Path(hc.runtime.output_dir), list(hc.overrides.task), multirun,
                    Path(hc.sweep.dir).name if multirun else None)


def _identity(job: HydraJob, env: ProcessEnv, previous: Optional[RunRecord]) -> tuple[str, Optional[str]]:
    """(variant, sweep). A sweep's job is named by its sweeper, a torchrun rank by the run that
    started it (both through the environment: ablate/run/context.py); a sweep's job entered on its
    own (`ablate resume JOB_DIR`) keeps the identity its record holds; else its overrides name it."""
    if job.multirun:
        return env.variant or variant_name(job.overrides), job.sweep
    if env.variant or env.sweep:
        return env.variant or variant_name(job.overrides), env.sweep
    if previous is not None and previous.sweep:
        return previous.variant or variant_name(job.overrides), previous.sweep
    return variant_name(job.overrides), None


def _is_fresh(run_dir: Path) -> bool:
    """Only Hydra's own files: safe to remove when the config is refused."""
    return all(p.name in (".hydra",) or p.suffix == ".log" for p in run_dir.iterdir())


def run_experiment(cfg: DictConfig) -> RunRecord:
    from ablate.train.distributed import request_requeue

    job = _hydra_job()
    stop = StopRequest()
    old = stop.install()  # from the start: a stop signal at any point ends with a truthful record
    try:
        record, code = _run(cfg, job, stop)
    finally:
        StopRequest.restore(old)  # submitit's own handlers again: request_requeue calls them
    if record.status == Status.PREEMPTED:
        request_requeue()  # under submitit: requeue (the job resumes) and exit
    if code and not job.multirun:
        raise SystemExit(code)
    return record


def _run(cfg, job: HydraJob, stop: StopRequest) -> tuple[RunRecord, int]:
    """(record, exit code). Everything that can refuse the run does so before the run
    directory is written: a re-entered directory keeps its record (ablate/run/lifecycle.py)."""
    from ablate.train import checkpoint, distributed

    env, lock = ProcessEnv(), RunLock(job.run_dir)
    try:
        distributed.export_submitit_env()  # SLURM tasks_per_node > 1: ranks from submitit
        env = ProcessEnv.read()
        validate(cfg)
        distributed.check_nproc(cfg)
        world = env.world if env.distributed else max(1, int(cfg.train.nproc))
        decision = lifecycle.plan(job.run_dir, cfg, world, warn=checkpoint.warn if env.rank == 0 else _quiet)
        variant, sweep = _identity(job, env, decision.found.record)
        ctx = RunContext(job.run_dir, job.overrides, variant, sweep, job.multirun, stop, rank=env.rank,
                         world=world, resume_state=decision.state)
        if decision.action == lifecycle.RETURN:
            if ctx.is_main:
                print(decision.notice, file=sys.stderr)
            return decision.found.record, 0
        if distributed.needs_launch(cfg):  # train.nproc > 1: torchrun runs the ranks, we wait
            lock.check_free()
            return _run_ranks(cfg, ctx)
        if ctx.is_main:
            lock.acquire()
            if decision.notice:
                print(decision.notice, file=sys.stderr)
    except AblateError as e:
        lock.release()
        if env.rank == 0:
            print(f"error: {e}", file=sys.stderr)
            if job.run_dir.is_dir() and _is_fresh(job.run_dir):
                shutil.rmtree(job.run_dir, ignore_errors=True)
        return RunRecord(Status.FAILED, error=str(e)), e.exit_code
    try:
        return _run_locked(cfg, ctx, decision)
    finally:
        lock.release()


def _quiet(message: str) -> None:
    pass


def _read_text(path: Path) -> Optional[str]:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def _written_by(before: Optional[str], after: Optional[str]) -> Optional[RunRecord]:
    """The record a launch wrote (every write holds its writer's pid or times), if any."""
    if after is None or after == before:
        return None
    try:
        return RunRecord.from_json(json.loads(after))
    except ValueError:
        return None


def _run_ranks(cfg, ctx: RunContext) -> tuple[RunRecord, int]:
    """torchrun runs the ranks; rank 0 writes the record and reports. Here: the outcome when
    rank 0 could not record it (only a record this launch wrote tells this launch's outcome)."""
    from ablate.train.checkpoint import list_checkpoints
    from ablate.train.distributed import TORCHRUN_LOG, launch_ranks

    before = _read_text(ctx.run_dir / SUMMARY)
    code = launch_ranks(cfg, ctx.run_dir, ctx.overrides, ProcessEnv.for_ranks(ctx.variant, ctx.sweep),
                        ctx.stop, __spec__.name)
    written = _written_by(before, _read_text(ctx.run_dir / SUMMARY))
    status = written.status if written is not None else None
    # rank 0 stopped with a checkpoint, but not by a signal of ours: torchrun stopped it
    # because another rank failed
    other_rank_failed = status in STOPPED and code not in (0, STOPPED_EXIT)
    if status not in (None, Status.RUNNING) and not other_rank_failed:
        return written, code
    record = written or RunRecord(Status.FAILED)
    log = ctx.run_dir / TORCHRUN_LOG
    if other_rank_failed:
        record.status, record.error = Status.FAILED, f"a rank failed (exit code {code}); see its error above and {log}"
    elif ctx.stop.signum is not None:  # stopped while the ranks started, before rank 0 could record it
        found = list_checkpoints(ctx.run_dir)
        record.status, record.reason = ctx.stop.status, ctx.stop.reason
        record.step = found[-1][0] if found else 0
        print(_stopped_line(record, ctx.run_dir), file=sys.stderr)
        code = STOPPED_EXIT
    else:
        record.status = Status.FAILED
        record.error = f"torchrun exited with code {code} before rank 0 recorded the outcome; see {log}"
        print(f"error: {record.error}", file=sys.stderr)
    if written is not None:  # this launch's "running" record: make it truthful
        record.finished, record.process = time.strftime("%Y-%m-%dT%H:%M:%S"), Process()
        record.write(ctx.run_dir)
    return record, code or 1


_runs_in_process = 0  # the basic launcher runs a sweep's jobs one after another in one process


@dataclass
class WallClock:
    """A run's wall time: this segment's so far, plus its earlier segments' when it continues
    (resumed or extended), as the record it continues holds it."""

    started: float  # time.time() at this segment's start
    earlier: float = 0.0

    def total(self) -> float:
        return round(self.earlier + time.time() - self.started, 3)


class RunningRecord(Sink):
    """The "running" summary.json, rewritten with the wall time so far at each evaluation's row
    and at a training row once EVERY_S seconds have passed since it was last written (an
    fsync'ed write every row would cost a tiny run a quarter of its speed): a segment killed
    without warning (SIGKILL, OOM, a lost node) still counts, up to that write, in the wall time
    of the run that resumes it."""

    EVERY_S = 5.0

    def __init__(self, run_dir: Path, record: RunRecord, clock: WallClock):
        self.run_dir, self.record, self.clock = run_dir, record, clock
        self.written = clock.started  # _open_record wrote it

    def log(self, row: dict) -> None:
        if VAL_LOSS in row or time.time() - self.written >= self.EVERY_S:
            self.record.wall_time_s = self.clock.total()
            self.record.write(self.run_dir)
            self.written = time.time()


def _run_locked(cfg, ctx: RunContext, decision: lifecycle.Plan) -> tuple[RunRecord, int]:
    global _runs_in_process
    from ablate.train.launch import Launch

    # the same run continued (resumed or extended): its wall time is the sum of its segments
    continued = decision.found.record if ctx.resume_state is not None else None
    clock = WallClock(time.time(), (continued.wall_time_s or 0.0) if continued is not None else 0.0)
    # Time to first step: a process's first run counts its imports; a later one, from its start.
    ctx = replace(ctx, job_started=clock.started if _runs_in_process else None)
    _runs_in_process += 1
    record = _open_record(cfg, ctx, decision, clock)
    if ctx.is_main and decision.action == lifecycle.START:
        _warn_warmup(cfg.train, console=not ctx.multirun)
    launch = Launch(cfg, ctx, RunningRecord(ctx.run_dir, record, clock))
    exit_code = _train(cfg, ctx, launch, record)
    _close_record(record, cfg, ctx, continued, clock)
    if ctx.is_main:
        _report(record, ctx, launch.sinks)
    return record, exit_code


def _close_record(record: RunRecord, cfg, ctx: RunContext, continued: Optional[RunRecord],
                  clock: WallClock) -> None:
    """The end of the record: wall time, finish time; the process is gone."""
    wall = clock.total()
    if continued is not None:  # the same run continued: its wall time is the sum of its segments
        result, earlier = record.result, continued.result
        if ctx.resume_state["step"] >= cfg.train.steps:  # its last checkpoint was final: this segment did nothing
            wall = clock.earlier
            if known(result) and known(earlier):
                result.tokens_per_s, result.mfu = earlier.tokens_per_s, earlier.mfu
        if known(result) and earlier.time_to_first_step_s is not None:
            result.time_to_first_step_s = earlier.time_to_first_step_s
    record.wall_time_s = wall
    record.finished = time.strftime("%Y-%m-%dT%H:%M:%S")
    record.process = Process()


def _warn_warmup(train: Any, console: bool) -> None:
    """One line when the warmup takes half the steps or more (config.warmup_warning), in
    ablate.log and, but for a sweep's job, on the console."""
    from ablate.config.schema import warmup_warning
    from ablate.train.schedule import resolved_warmup

    line = warmup_warning(train, resolved_warmup(train))
    if line:
        log.info(line)
        if console:
            print(line, file=sys.stderr)


def _open_record(cfg, ctx: RunContext, decision: lifecycle.Plan, clock: WallClock) -> RunRecord:
    """summary.json's "running" record (rank 0 writes it with the resolved config), with the
    wall time of the segments it continues."""
    previous = decision.found.record
    who = owner()  # a reader can tell a killed run (RunRecord.live_status)
    record = RunRecord(
        status=Status.RUNNING, variant=ctx.variant, axes=axis_values(cfg), seed=cfg.seed,
        data_seed=cfg.data_seed, overrides=variant_overrides(ctx.overrides), sweep=ctx.sweep,
        process=Process(pid=who["pid"], job=who["job"]), host=who["host"],
        started=time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(clock.started)),
        wall_time_s=clock.earlier, previous_status=previous.status if previous is not None else None,
        # stays with the run through later resumes
        extended_from=decision.extended_from or (previous.extended_from if previous is not None
                                                 and ctx.resume_state is not None else None))
    if ctx.is_main:
        resolved = OmegaConf.to_container(cfg, resolve=True)
        write_atomic(ctx.run_dir / CONFIG, OmegaConf.to_yaml(OmegaConf.create(resolved)))
        record.write(ctx.run_dir)
    return record


def _train(cfg, ctx: RunContext, launch, record: RunRecord) -> int:
    """Train, with the outcome written into `record`; returns the exit code."""
    try:
        ctx.stop.phase = Phase.STARTUP  # no step to finish yet: a stop signal ends the run where it is
        ctx.stop.raise_if_stopped()
        outcome = launch.train()
        record.info = launch.info
        record.ended(outcome)
        return STOPPED_EXIT if outcome.status in STOPPED else 0
    except AblateError as e:
        record.status, record.error = Status.FAILED, str(e)
        if ctx.is_main:  # every rank meets the same error: one line
            print(f"error: {e}", file=sys.stderr)
            log.info(f"error: {e}")  # ablate.log (info: the console handler passes warnings on)
        return e.exit_code
    except (KeyboardInterrupt, Stopped) as e:  # before training started (the trainer handles it after)
        signum = signal.SIGINT if isinstance(e, KeyboardInterrupt) else e.signum
        record.status = Status.INTERRUPTED if signum == signal.SIGINT else Status.PREEMPTED
        record.reason = f"signal {signal.Signals(signum).name} before training started"
        record.step = ctx.resume_state["step"] if ctx.resume_state else 0
        record.steps = cfg.train.steps
        return STOPPED_EXIT
    except Exception as e:  # a bug: keep the traceback in a file, one line on the console
        record.status = Status.FAILED
        record.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        _report_bug(ctx, record.error)
        return 1
    finally:
        ctx.stop.phase = Phase.WAIT  # the outcome is known: a late signal must not interrupt its record


def _report_bug(ctx: RunContext, error: str) -> None:
    """The traceback of the exception being handled in a file, one line on the console."""
    log.debug("".join(traceback.format_exc()))
    where = ctx.run_dir / ("error.txt" if ctx.is_main else f"error.rank{ctx.rank}.txt")
    where.write_text(traceback.format_exc())
    who = f"rank {ctx.rank}: " if ctx.world > 1 else ""
    print(f"error: {who}{error} (traceback in {where})", file=sys.stderr)
    log.info(f"error: {who}{error} (traceback in {where})")


def _report(record: RunRecord, ctx: RunContext, sinks: Optional[Sink]) -> None:
    """Write the outcome, then report it: a failing dashboard or console must not change it."""
    record.write(ctx.run_dir)
    try:
        if sinks is not None:
            sinks.finish(record)
        from ablate.run.summary import print_summary

        print_summary(record, ctx.run_dir, console=not ctx.multirun)  # a sweep prints a line per job
    except Exception as e:
        print(f"warning: reporting failed ({type(e).__name__}: {e}); see {ctx.run_dir / SUMMARY}",
              file=sys.stderr)
    if record.status in STOPPED:
        log.info(_stopped_line(record, ctx.run_dir))
        if not ctx.multirun and ctx.sweep is None:  # a sweep says it for all its jobs
            print(_stopped_line(record, ctx.run_dir), file=sys.stderr)


def _stopped_line(record: RunRecord, run_dir: Path) -> str:
    from ablate.run.directory import resume_command
    from ablate.train.checkpoint import list_checkpoints

    found = list_checkpoints(run_dir)
    saved = f"checkpoint {found[-1][1]}" if found else "no checkpoint yet"
    return (f"stopped at step {record.step or 0} ({record.reason}); {saved}; "
            f"resume with: {resume_command(run_dir)}")


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def hydra_entry(cfg: DictConfig) -> RunRecord:
    return run_experiment(cfg)


if __name__ == "__main__":  # a torchrun rank (launch_ranks): the same entry point, in run mode
    sys.argv[0] = "ablate"
    hydra_entry()
