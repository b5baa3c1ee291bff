"""The one `@hydra.main` entry point behind `ablate run` and `ablate sweep`.

Hydra owns composition, the output directory, logging, sweepers and launchers; this module
turns a composed config into a finished run directory with a truthful summary.json.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import hydra
from omegaconf import DictConfig, OmegaConf

from ablate import lifecycle
from ablate.axes import CONF_DIR
from ablate.config import axis_values, register_configs, validate
from ablate.errors import AblateError
from ablate.rundir import CONFIG, SUMMARY, RunLock, owner, write_atomic, write_json
from ablate.tracking.sinks import Sink
from ablate.vocab import STOPPED, STOPPED_EXIT, variant_name, variant_overrides

log = logging.getLogger("ablate")

def _name_resolver(override_dirname: str) -> str:
    # A name a shell takes as printed (the banner's path pastes into `ablate resume`): a value
    # with shell-special characters or a long one is hashed; a path does not nest the directory.
    from ablate.rundir import dir_name

    return dir_name(override_dirname or "baseline")


if not OmegaConf.has_resolver("ablate_name"):
    OmegaConf.register_new_resolver("ablate_name", _name_resolver)
register_configs()


def _hydra_info() -> tuple[Path, list[str], bool, Optional[str]]:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    # torchrun ranks of a sweep job run in run mode; their parent passes the sweep's name on
    sweep_name = Path(hc.sweep.dir).name if multirun else os.environ.get("ABLATE_SWEEP")
    return Path(hc.runtime.output_dir), list(hc.overrides.task), multirun, sweep_name


def _is_fresh(run_dir: Path) -> bool:
    """Only Hydra's own files: safe to remove when the config is refused."""
    return all(p.name in (".hydra",) or p.suffix == ".log" for p in run_dir.iterdir())


def run_experiment(cfg: DictConfig) -> dict:
    from ablate.train.distributed import StopRequest, request_requeue

    run_dir, overrides, multirun, sweep_name = _hydra_info()
    stop = StopRequest()
    old = stop.install()  # from the start: a stop signal at any point ends with a truthful summary
    try:
        summary, code = _run(cfg, run_dir, overrides, multirun, sweep_name, stop)
    finally:
        StopRequest.restore(old)  # submitit's own handlers again: request_requeue calls them
    if summary.get("status") == "preempted":
        request_requeue()  # under submitit: requeue (the job resumes) and exit
    if code and not multirun:
        raise SystemExit(code)
    return summary


def _run(cfg, run_dir, overrides, multirun, sweep_name, stop) -> tuple[dict, int]:
    """(summary, exit code). Everything that can refuse the run does so before the run
    directory is written: a re-entered directory keeps its record (ablate/lifecycle.py)."""
    from ablate.train import checkpoint, distributed

    rank, lock = 0, RunLock(run_dir)
    try:
        distributed.export_submitit_env()  # SLURM tasks_per_node > 1: ranks from submitit
        rank = int(os.environ.get("RANK", "0"))
        validate(cfg)
        distributed.check_nproc(cfg)
        world = (int(os.environ["WORLD_SIZE"]) if distributed.in_distributed_env()
                 else max(1, int(cfg.train.nproc)))
        decision = lifecycle.plan(run_dir, cfg, world, warn=checkpoint.warn if rank == 0 else _quiet)
        if decision.action == lifecycle.RETURN:
            if rank == 0:
                print(decision.notice, file=sys.stderr)
            return decision.record.summary, 0
        if distributed.needs_launch(cfg):  # train.nproc > 1: torchrun runs the ranks, we wait
            lock.check_free()
            return _run_ranks(cfg, run_dir, overrides, sweep_name, stop)
        if rank == 0:
            lock.acquire()
            if decision.notice:
                print(decision.notice, file=sys.stderr)
    except AblateError as e:
        lock.release()
        if rank == 0:
            print(f"error: {e}", file=sys.stderr)
            if run_dir.is_dir() and _is_fresh(run_dir):
                shutil.rmtree(run_dir, ignore_errors=True)
        return {"status": "failed", "error": str(e)}, e.exit_code
    try:
        return _run_locked(cfg, run_dir, overrides, multirun, sweep_name, rank, decision, stop)
    finally:
        lock.release()


def _quiet(message: str) -> None:
    pass


def _read_text(path: Path) -> Optional[str]:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def _run_ranks(cfg, run_dir, overrides, sweep_name, stop) -> tuple[dict, int]:
    """torchrun runs the ranks; rank 0 writes the summary and reports. Here: the outcome when
    rank 0 could not record it (only a summary this launch wrote tells this launch's outcome)."""
    from ablate.train.checkpoint import list_checkpoints
    from ablate.train.distributed import TORCHRUN_LOG, launch_ranks

    before = _read_text(run_dir / SUMMARY)
    code = launch_ranks(cfg, run_dir, overrides, sweep_name, stop, __spec__.name)
    after = _read_text(run_dir / SUMMARY)
    summary = None
    if after is not None and after != before:  # every write holds its writer's pid or times
        try:
            summary = json.loads(after)
        except ValueError:
            pass
    status = (summary or {}).get("status")
    # rank 0 stopped with a checkpoint, but not by a signal of ours: torchrun stopped it
    # because another rank failed
    other_rank_failed = status in STOPPED and code not in (0, STOPPED_EXIT)
    if status not in (None, "running") and not other_rank_failed:
        return summary, code
    log = run_dir / TORCHRUN_LOG
    if other_rank_failed:
        result = {"status": "failed", "error": f"a rank failed (exit code {code}); see its error above and {log}"}
    elif stop.signum is not None:  # stopped while the ranks started, before rank 0 could record it
        found = list_checkpoints(run_dir)
        result = {"status": stop.status, "reason": f"signal {signal.Signals(stop.signum).name}",
                  "step": found[-1][0] if found else 0}
        print(_stopped_line(result, run_dir), file=sys.stderr)
        code = STOPPED_EXIT
    else:
        result = {"status": "failed", "error": f"torchrun exited with code {code} before rank 0 recorded "
                                               f"the outcome; see {log}"}
        print(f"error: {result['error']}", file=sys.stderr)
    if summary is not None:  # this launch's "running" record: make it truthful
        summary.update(result, finished=time.strftime("%Y-%m-%dT%H:%M:%S"))
        summary.pop("pid", None)
        write_json(run_dir / SUMMARY, summary)
        result = summary
    return result, code or 1


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

    def __init__(self, path: Path, summary: dict, clock: WallClock):
        self.path, self.summary, self.clock = path, summary, clock
        self.written = clock.started  # _open_record wrote it

    def log(self, row: dict) -> None:
        if "val_loss" in row or time.time() - self.written >= self.EVERY_S:
            self.summary["wall_time_s"] = self.clock.total()
            write_json(self.path, self.summary)
            self.written = time.time()


def _run_locked(cfg, run_dir, overrides, multirun, sweep_name, rank, decision, stop) -> tuple[dict, int]:
    global _runs_in_process
    state, previous = decision.state, decision.record.summary
    clock = WallClock(time.time(), float(previous.get("wall_time_s") or 0) if state is not None else 0.0)
    # Time to first step: a process's first run counts its imports; a later one, from its start.
    job_started = clock.started if _runs_in_process else None
    _runs_in_process += 1
    summary = _open_record(cfg, run_dir, overrides, sweep_name, rank, decision, clock)
    if rank == 0 and decision.action == lifecycle.START:
        _warn_warmup(cfg.train, console=not multirun)
    built: dict[str, Any] = {}  # what train() built, so sinks are finished even on failure
    exit_code = _train(cfg, run_dir, summary, built, multirun, rank, state, job_started, stop,
                       RunningRecord(run_dir / SUMMARY, summary, clock))
    wall = clock.total()
    if state is not None:  # the same run continued: its wall time is the sum of its segments
        if state["step"] >= cfg.train.steps:  # its last checkpoint was final: this segment did nothing
            wall = clock.earlier
            summary["tokens_per_s"] = previous.get("tokens_per_s", summary.get("tokens_per_s"))
            summary["mfu"] = previous.get("mfu", summary.get("mfu"))
        if previous.get("time_to_first_step_s") is not None:
            summary["time_to_first_step_s"] = previous["time_to_first_step_s"]
    summary["wall_time_s"] = wall
    summary["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    summary.pop("pid", None)
    summary.pop("job", None)
    if rank == 0:
        _record(summary, run_dir, built, multirun, sweep_name)
    return summary, exit_code


def _warn_warmup(train: Any, console: bool) -> None:
    """One line when the warmup takes half the steps or more (config.warmup_warning), in
    ablate.log and, but for a sweep's job, on the console."""
    from ablate.config import warmup_warning
    from ablate.train.schedule import resolved_warmup

    line = warmup_warning(train, resolved_warmup(train))
    if line:
        log.info(line)
        if console:
            print(line, file=sys.stderr)


def _open_record(cfg, run_dir, overrides, sweep_name, rank, decision, clock: WallClock) -> dict:
    """summary.json's "running" record (rank 0 writes it with the resolved config), with the
    wall time of the segments it continues."""
    # A sweep job is named by its sweeper (what differs from the sweep's baseline).
    variant = os.environ.get("ABLATE_VARIANT") or variant_name(overrides)
    summary: dict[str, Any] = {
        "status": "running", "variant": variant, "axes": axis_values(cfg), "seed": cfg.seed,
        "data_seed": cfg.data_seed, "overrides": variant_overrides(overrides),
        "sweep": sweep_name, **owner(),  # pid/host: a reader can tell a killed run (rundir.live_status)
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(clock.started)),
        "wall_time_s": clock.earlier,
    }
    previous = decision.record.summary
    if previous:
        summary["previous_status"] = previous.get("status")
    extended_from = decision.extended_from or (previous.get("extended_from") if decision.state else None)
    if extended_from is not None:  # stays with the run through later resumes
        summary["extended_from"] = extended_from
    if rank == 0:
        resolved = OmegaConf.to_container(cfg, resolve=True)
        write_atomic(run_dir / CONFIG, OmegaConf.to_yaml(OmegaConf.create(resolved)))
        write_json(run_dir / SUMMARY, summary)
    return summary


def _train(cfg, run_dir, summary, built, multirun, rank, state, job_started, stop, record) -> int:
    """Train, with the outcome written into `summary`; returns the exit code. record: the
    sink that keeps the running record's wall time (RunningRecord)."""
    from ablate.train.distributed import Stopped
    from ablate.train.launch import train

    try:
        stop.phase = "startup"  # no step to finish yet: a stop signal ends the run where it is
        stop.raise_if_stopped()
        outcome, info = train(cfg, run_dir, summary["variant"], summary["sweep"], rank, built, job_started,
                              state, stop, quiet=multirun, record=record)
        summary.update(info)
        summary.update(outcome.record(cfg.train.steps))
        return STOPPED_EXIT if outcome.status in STOPPED else 0
    except AblateError as e:
        summary.update(status="failed", error=str(e))
        if rank == 0:  # every rank meets the same error: one line
            print(f"error: {e}", file=sys.stderr)
            log.info(f"error: {e}")  # ablate.log (info: the console handler passes warnings on)
        return e.exit_code
    except (KeyboardInterrupt, Stopped) as e:  # before training started (the trainer handles it after)
        signum = signal.SIGINT if isinstance(e, KeyboardInterrupt) else e.signum
        summary.update(status="interrupted" if signum == signal.SIGINT else "preempted",
                       reason=f"signal {signal.Signals(signum).name} before training started",
                       step=state["step"] if state else 0, steps=cfg.train.steps)
        return STOPPED_EXIT
    except Exception as e:  # a bug: keep the traceback in a file, one line on the console
        summary.update(status="failed", error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        log.debug("".join(traceback.format_exc()))
        where = run_dir / ("error.txt" if rank == 0 else f"error.rank{rank}.txt")
        where.write_text(traceback.format_exc())
        who = f"rank {rank}: " if int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""
        print(f"error: {who}{summary['error']} (traceback in {where})", file=sys.stderr)
        log.info(f"error: {who}{summary['error']} (traceback in {where})")
        return 1
    finally:
        stop.phase = "wait"  # the outcome is known: a late signal must not interrupt its record


def _record(summary: dict, run_dir: Path, built: dict, multirun: bool, sweep_name) -> None:
    """Write the outcome, then report it: a failing dashboard or console must not change it."""
    write_json(run_dir / SUMMARY, summary)
    try:
        if "sinks" in built:
            built["sinks"].finish(summary)
        from ablate.report import print_summary

        print_summary(summary, run_dir, console=not multirun)  # a sweep prints a line per job
    except Exception as e:
        print(f"warning: reporting failed ({type(e).__name__}: {e}); see {run_dir / SUMMARY}",
              file=sys.stderr)
    if summary["status"] in STOPPED:
        log.info(_stopped_line(summary, run_dir))
        if not multirun and sweep_name is None:  # a sweep says it for all its jobs
            print(_stopped_line(summary, run_dir), file=sys.stderr)


def _stopped_line(summary: dict, run_dir: Path) -> str:
    from ablate.train.checkpoint import list_checkpoints

    found = list_checkpoints(run_dir)
    saved = f"checkpoint {found[-1][1]}" if found else "no checkpoint yet"
    from ablate.rundir import resume_command

    return (f"stopped at step {summary.get('step', 0)} ({summary.get('reason')}); {saved}; "
            f"resume with: {resume_command(run_dir)}")


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def hydra_entry(cfg: DictConfig) -> dict:
    return run_experiment(cfg)


if __name__ == "__main__":  # a torchrun rank (launch_ranks): the same entry point, in run mode
    sys.argv[0] = "ablate"
    hydra_entry()
