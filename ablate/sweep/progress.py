"""What a sweep says as it runs and when it ends: one line per job as it ends, then the
comparison of its runs (ablate compare), the jobs that did not finish and the sweep's exit code;
<sweep_dir>/sweep.json records every job's outcome for scripts."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ablate.run.record import RunRecord, read_record
from ablate.run.directory import SUMMARY, resume_command
from ablate.sweep.planning import Job
from ablate.names import FINISHED, STOPPED, STOPPED_EXIT, VAL_LOSS, Status


@dataclass
class JobResult:
    job: Job
    status: Status
    run_dir: Optional[str] = None
    error: str = ""
    earlier: bool = False  # this launch only returned the outcome the job had (a resumed sweep)


def result_of(job: Job, ret: Any) -> JobResult:
    """A Hydra JobReturn as (status, dir); a job that raised or crashed counts as failed."""
    run_dir = None
    try:
        run_dir = str(ret.hydra_cfg.hydra.runtime.output_dir)
    except Exception:
        pass
    try:
        value = ret.return_value  # re-raises the job's exception
    except BaseException as e:  # noqa: BLE001 - a crashed job must not stop the summary
        return JobResult(job, Status.FAILED, run_dir, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    if isinstance(value, RunRecord):
        return JobResult(job, value.status, run_dir, value.error or "")
    return JobResult(job, Status.FAILED, run_dir, "the job returned no record")


def summary_stamp(run_dir: Optional[str]) -> Optional[tuple]:
    """Tells one write of a run's summary.json from another (it is replaced whole, so each write
    is a new file): taken before a launch, it shows which summaries the launch wrote."""
    try:
        st = (Path(run_dir) / SUMMARY).stat()
    except (OSError, TypeError):
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def recover(job: Job, run_dir: Optional[str], stamp_before: Optional[tuple], lost: str) -> JobResult:
    """The outcome of a job the launcher lost (it raised instead of returning the job: a job
    killed by SIGKILL, the OOM killer or a node failure, submitit's UncompletedJobError): what
    the job's own summary.json says, if this launch wrote it and it holds an outcome; else failed."""
    stamp = summary_stamp(run_dir)
    if run_dir is None or stamp is None or stamp == stamp_before:
        return JobResult(job, Status.FAILED, run_dir, lost)  # never started, or an earlier sweep's
    record = read_record(Path(run_dir))
    status = record.live_status() if record is not None else None
    if status in FINISHED + STOPPED + (Status.FAILED,):
        return JobResult(job, status, run_dir, record.error or "")
    if status == Status.KILLED:
        lost = "its process died before it wrote an outcome (SIGKILL, out of memory or node failure)"
    return JobResult(job, Status.FAILED, run_dir, lost)


def earlier_outcome(run_dir: Optional[str]) -> Optional[tuple]:
    """Taken before a launch: (summary stamp, status, step) of a job that has finished, else None."""
    record = _record(run_dir)
    if record is None or record.status not in FINISHED:
        return None
    return summary_stamp(run_dir), record.status, record.step


def done_earlier(before: Optional[tuple], run_dir: Optional[str]) -> bool:
    """Whether the launch only returned the outcome the job had before it (`before`): a resumed
    sweep's finished job, whose summary is as it was or re-entered at its last step."""
    if before is None:
        return False
    stamp, status, step = before
    record = _record(run_dir)
    if record is None or (record.status, record.step) != (status, step):
        return False
    return summary_stamp(run_dir) == stamp or record.result.resumed_from == step


def _duration(seconds: float) -> str:
    seconds = int(round(max(seconds, 0)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """One line per job as it ends: `[3/12] name  status  val_loss 4.1234  12s  9 left  ETA 1m48s`.
    The ETA weighs the jobs left by their work, a job's training FLOPs (`expect`: steps x tokens
    per step x FLOPs per token), so a ladder's large rungs or a longer variant count for what they
    cost: a fitted start-up time plus time per FLOP once jobs of different sizes have run one at
    a time, else the time so far prorated by work. Jobs without an estimate count as the mean
    job. For parallel launchers a chunk of jobs ends at once, so it is a bound, not a schedule.
    A job a resumed sweep did not run again says `done earlier` and does not count."""

    def __init__(self, total: int, out=None, clock=None):
        import time

        self.total, self.done, self.out = total, 0, out
        self.clock = clock or time.monotonic
        self.start = self.clock()
        self.work: dict[str, float] = {}  # job name -> its FLOPs (expect)
        self.ran: list = []  # (work or None, seconds or None) of each job run so far
        self.ended: set[str] = set()

    def expect(self, jobs: list[Job], configs: list) -> None:
        """Estimate the work of jobs about to launch from their composed configs."""
        for job, cfg in zip(jobs, configs):
            self.work[job.name] = job_flops(cfg)

    def _eta(self, left: int) -> str:
        if not left:
            return "done"
        if not self.ran:
            return "ETA -"
        known = [w for w in self.work.values() if w]
        mean = sum(known) / len(known) if known else 1.0
        pending = [w or mean for n, w in self.work.items() if n not in self.ended]
        pending += [mean] * max(left - len(pending), 0)  # a later phase's jobs: the mean job
        fit = _time_model([(w or mean, t) for w, t in self.ran])
        if fit is not None:  # each job: a fixed start-up cost plus a time per FLOP
            a, b = fit
            return f"ETA {_duration(sum(a + b * w for w in pending))}"
        per_work = (self.clock() - self.start) / sum(w or mean for w, _ in self.ran)
        return f"ETA {_duration(per_work * sum(pending))}"

    def line(self, r: JobResult, seconds: Optional[float]) -> str:
        self.done += 1
        self.ended.add(r.job.name)
        if not r.earlier:
            self.ran.append((self.work.get(r.job.name), seconds))
        left = self.total - self.done
        took = "done earlier" if r.earlier else _duration(seconds) if seconds is not None else "-"
        return (f"[{self.done}/{self.total}] {r.job.name}  {r.status}  val_loss {_final_loss(r)}"
                f"  {took}  {left} left  {self._eta(left)}")

    def report(self, r: JobResult, seconds: Optional[float] = None) -> None:
        """Print the job's line; `seconds`: how long it took (None: its summary's wall time)."""
        if seconds is None:
            record = _record(r.run_dir)
            seconds = record.wall_time_s if record is not None else None
        print(self.line(r, seconds), file=self.out or sys.stdout, flush=True)


def _time_model(ran: list) -> Optional[tuple[float, float]]:
    """seconds = a + b * FLOPs fitted to the jobs that ran one at a time (a: start-up, data,
    evaluation; small jobs are mostly that); None when the jobs' times are unknown (a parallel
    launch) or their sizes do not vary, or the fit is not a cost (then time is prorated by work)."""
    if len(ran) < 2 or any(t is None for _, t in ran) or len({w for w, _ in ran}) < 2:
        return None
    n = len(ran)
    mw, mt = sum(w for w, _ in ran) / n, sum(t for _, t in ran) / n
    b = sum((w - mw) * (t - mt) for w, t in ran) / sum((w - mw) ** 2 for w, _ in ran)
    a = mt - b * mw
    return (a, b) if a >= 0 and b > 0 else None


def job_flops(cfg: Any) -> Optional[float]:
    """A job's training FLOPs (None: its config says too little): the ETA's unit of work."""
    from ablate.model.spec import ModelSpec, flops_per_token

    try:
        t = cfg.train
        return float(flops_per_token(ModelSpec.from_config(cfg), int(t.seq_len))) * int(t.steps) * \
            int(t.batch_size) * int(t.seq_len)
    except Exception:  # an estimate only: a plugin's config the spec cannot read costs the mean
        return None


# Hydra's launchers log each launch ("Launching 1 jobs locally", "#0 : <overrides>") through
# python logging; the per-job lines above say what a user needs, so these are hidden unless
# hydra.verbose is set.
LAUNCHER_LOGGERS = ("hydra._internal.core_plugins.basic_launcher", "hydra_plugins")


@contextlib.contextmanager
def quiet_launcher_logs(verbose: Any):
    import logging

    if verbose:
        yield
        return
    loggers = [logging.getLogger(name) for name in LAUNCHER_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def finish(results: list[JobResult], sweep_dir: Path, strict: bool = False, logger: Any = None) -> int:
    """Print the comparison (or a status list) and the jobs that did not finish; the sweep's
    exit code: non-zero when no job finished (130 when it was stopped by a signal), and with
    `strict` also when any job failed, diverged or did not finish."""
    write_record(results, sweep_dir)
    done = [r for r in results if r.status in FINISHED]
    printed = _print_compare(sweep_dir, logger) if done else False
    if not printed:
        for i, r in enumerate(results):
            print(f"  #{i} {r.job.name:<28} {r.status:<11} {_final_loss(r):<9} {r.run_dir or ''}")
    print(f"sweep: {len(done)}/{len(results)} jobs finished "
          f"({sum(r.status == Status.DIVERGED for r in results)} diverged); sweep dir {sweep_dir}")
    for i, r in enumerate(results):
        if r.status not in FINISHED:
            label = Status.FAILED.value if r.status == Status.FAILED else "not finished"
            print(f"{label}: #{i} {r.job.name} ({r.status}{': ' + r.error if r.error else ''})",
                  file=sys.stderr)
    if any(r.status in STOPPED for r in results):
        print(f"sweep stopped; resume with: {resume_command(sweep_dir)} "
              "(finished jobs return at once, stopped ones resume from their checkpoints)",
              file=sys.stderr)
        if not done or results[-1].status == Status.NOT_RUN:
            return STOPPED_EXIT
    if results and not done:
        return 1
    bad = [r for r in results if r.status != Status.COMPLETED]
    if strict and bad:
        print(f"--strict: {len(bad)} of {len(results)} jobs did not complete "
              f"({', '.join(f'{r.job.name}: {r.status}' for r in bad)})", file=sys.stderr)
        return 1
    return 0


def write_record(results: list[JobResult], sweep_dir: Path) -> None:
    """<sweep_dir>/sweep.json: every job's outcome (what the end of a sweep prints), for scripts."""
    from ablate.run.directory import write_json

    jobs = [{"index": i, "name": r.job.name, "variant": r.job.variant, "seed": r.job.seed,
             "overrides": r.job.overrides, "status": r.status, "run_dir": r.run_dir,
             "error": r.error or None} for i, r in enumerate(results)]
    record = {"sweep_dir": str(sweep_dir), "jobs": jobs,
              "finished": sum(r.status in FINISHED for r in results), "total": len(results)}
    try:
        write_json(Path(sweep_dir) / "sweep.json", record)
    except OSError as e:
        print(f"warning: could not write {Path(sweep_dir) / 'sweep.json'}: {e.strerror}", file=sys.stderr)


def _record(run_dir: Optional[str]) -> Optional[RunRecord]:
    return read_record(Path(run_dir)) if run_dir is not None else None


def final_metric(run_dir: Optional[str], name: str) -> Optional[float]:
    """A job's final value of a metric (ablate.names), from its record; None without one."""
    record = _record(run_dir)
    return record.metric(name) if record is not None else None


def _final_loss(r: JobResult) -> str:
    """The job's final val_loss; `-` for a job that has none (diverged, stopped, failed): the loss
    a diverged run measured before diverging is not its result."""
    v = final_metric(r.run_dir, VAL_LOSS) if r.status == Status.COMPLETED else None
    return f"{v:.4f}" if v is not None else "-"


def _print_compare(sweep_dir: Path, logger: Any = None) -> bool:
    """`ablate compare` of the sweep directory: the one place the end of a sweep calls compare
    (an --lr-grid or --ladder sweep: its transfer report, also to W&B with logger=wandb)."""
    try:
        from ablate.analysis import compare_dirs
        from ablate.analysis.columns import print_comparison
    except ImportError:
        return False
    try:
        from ablate.sweep.transfer_record import read_transfer

        record = read_transfer(sweep_dir)
        if record is not None:
            from ablate.analysis.load import find_runs
            from ablate.analysis.columns import COMPARE_HINT
            from ablate.tables.render import print_table
            from ablate.analysis.transfer_report import transfer_compare

            report = transfer_compare(find_runs([sweep_dir]), record)
            print_table(report.table, hint=COMPARE_HINT)
            _log_report(report, sweep_dir, logger)
        else:
            print_comparison(compare_dirs([sweep_dir]))
    except Exception as e:  # noqa: BLE001 - the runs are done; a report problem must not hide them
        print(f"warning: could not compare the sweep's runs ({type(e).__name__}: {e})", file=sys.stderr)
        return False
    return True


def _log_report(report, sweep_dir: Path, logger: Any) -> None:
    """The transfer report's figure (<sweep_dir>/transfer.png) and, with logger=wandb, the report
    in the sweep's W&B group."""
    from ablate.tracking.transfer_plots import plot_transfer

    plot = plot_transfer(report, Path(sweep_dir) / "transfer.png")
    print(f"plot: {plot}")
    if logger is not None and logger.get("name") == "wandb" and logger.get("mode") != "disabled":
        from ablate.tracking.transfer_wandb import log_report

        where = log_report(logger, sweep_dir, report, plot)
        if where:
            print(f"W&B: the report is in {where}")
