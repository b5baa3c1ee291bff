"""The one `@hydra.main` entry point behind `ablate run` and `ablate sweep`.

Hydra owns composition, the output directory, logging, sweepers and launchers; this module
turns a composed config into a finished run directory with a truthful summary.json.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Optional

import hydra
from omegaconf import DictConfig, OmegaConf

from ablate.config import AXES, axis_values, register_configs, validate
from ablate.errors import AblateError
from ablate.rundir import CONFIG, METRICS, SUMMARY, RunLock, owner, read_json, write_atomic, write_json

log = logging.getLogger("ablate")

PACKAGE_DIR = Path(__file__).resolve().parent
CONF_DIR = PACKAGE_DIR.parent / "conf" if (PACKAGE_DIR.parent / "conf").is_dir() else PACKAGE_DIR / "conf"

# Overrides that do not change what is trained (they never name a variant).
NON_VARIANT_PREFIXES = ("hydra.", "hydra/", "logger", "out_dir", "launcher", "train.progress",
                        "train.device", "train.threads", "train.resume", "train.nproc",
                        "train.log_every", "train.ckpt_every", "train.keep_ckpts", "study",
                        "train.diagnostics_every")  # diagnostics never change training
SEED_KEYS = ("seed", "data_seed")


def variant_overrides(overrides: list[str]) -> list[str]:
    out = []
    for o in overrides:
        key = o.lstrip("+~").split("=", 1)[0]
        if key in SEED_KEYS or key.startswith(NON_VARIANT_PREFIXES):
            continue
        out.append(o.lstrip("+"))
    return sorted(out)


def variant_name(overrides: list[str]) -> str:
    return ",".join(variant_overrides(overrides)) or "baseline"


def _name_resolver(override_dirname: str) -> str:
    # a path in an override (data.paths=[/a/b.txt]) must not nest the run directory
    name = (override_dirname or "baseline").replace("/", "_")
    if len(name) > 160:  # a file name stops at 255 bytes: keep the start, make the rest a hash
        import hashlib

        name = name[:150] + "~" + hashlib.sha1(name.encode()).hexdigest()[:8]
    return name


if not OmegaConf.has_resolver("ablate_name"):
    OmegaConf.register_new_resolver("ablate_name", _name_resolver)
register_configs()


def default_axes() -> dict[str, str]:
    from ablate.config import AblateConfig

    base = AblateConfig()
    return {axis: getattr(base, axis).name for axis in AXES}


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
    from ablate.train import distributed

    run_dir, overrides, multirun, sweep_name = _hydra_info()
    try:
        validate(cfg)
        distributed.export_submitit_env()  # SLURM tasks_per_node > 1: ranks from submitit
        distributed.check_nproc(cfg)
    except AblateError as e:
        print(f"error: {e}", file=sys.stderr)
        if run_dir.is_dir() and _is_fresh(run_dir):
            shutil.rmtree(run_dir, ignore_errors=True)
        if multirun:
            return {"status": "failed", "error": str(e)}
        raise SystemExit(e.exit_code)

    if distributed.needs_launch(cfg):  # train.nproc > 1: torchrun runs the ranks, we wait
        return _run_ranks(cfg, run_dir, overrides, multirun, sweep_name)
    rank = int(os.environ.get("RANK", "0"))
    lock = RunLock(run_dir)
    if rank == 0:
        try:
            lock.acquire()
        except AblateError as e:
            print(f"error: {e}", file=sys.stderr)
            if multirun:
                return {"status": "failed", "error": str(e)}
            raise SystemExit(e.exit_code)
    try:
        summary = _run_locked(cfg, run_dir, overrides, multirun, sweep_name, rank)
    finally:
        lock.release()
    if summary.get("status") == "preempted":
        distributed.request_requeue()  # under submitit: requeue (the job resumes) and exit
    return summary


def _run_ranks(cfg, run_dir, overrides, multirun, sweep_name) -> dict:
    from ablate.train.distributed import launch_ranks

    code = launch_ranks(cfg, run_dir, overrides, sweep_name)
    try:
        summary = read_json(run_dir / SUMMARY)
    except (OSError, ValueError):
        summary = {"status": "failed", "error": f"torchrun exited with code {code} and no summary"}
    if code and not multirun:
        raise SystemExit(code)
    return summary


_runs_in_process = 0  # the basic launcher runs a sweep's jobs one after another in one process


def _run_locked(cfg, run_dir, overrides, multirun, sweep_name, rank) -> dict:
    global _runs_in_process
    started = time.time()
    # Time to first step: a process's first run counts its imports; a later one, from its start.
    job_started = started if _runs_in_process else None
    _runs_in_process += 1
    # A sweep job is named by its sweeper (what differs from the sweep's baseline).
    variant = os.environ.get("ABLATE_VARIANT") or variant_name(overrides)
    summary: dict[str, Any] = {
        "status": "running", "variant": variant, "axes": axis_values(cfg), "seed": cfg.seed,
        "data_seed": cfg.data_seed, "overrides": variant_overrides(overrides),
        "sweep": sweep_name, **owner(),  # pid/host: a reader can tell a killed run (rundir.live_status)
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
    }
    if rank == 0:
        resolved = OmegaConf.to_container(cfg, resolve=True)
        write_atomic(run_dir / CONFIG, OmegaConf.to_yaml(OmegaConf.create(resolved)))
        previous = run_dir / SUMMARY
        if previous.is_file():
            try:
                summary["previous_status"] = read_json(previous).get("status")
            except (OSError, ValueError):
                pass
        write_json(run_dir / SUMMARY, summary)
    built: dict[str, Any] = {}  # what train() built, so sinks are finished even on failure
    try:
        from ablate.train.launch import train

        outcome, info = train(cfg, run_dir, variant, sweep_name, rank, built, job_started)
        summary.update(info)
        summary.update(
            status=outcome.status, reason=outcome.reason, step=outcome.step, steps=cfg.train.steps,
            tokens=outcome.tokens, train_loss=outcome.train_loss, val_loss=outcome.val_loss,
            val_bpb=outcome.val_bpb, tokens_per_s=outcome.tokens_per_s,
            skipped_steps=outcome.skipped_steps, resumed_from=outcome.resumed_from,
            time_to_first_step_s=outcome.first_step_s)
        exit_code = {"completed": 0, "diverged": 0, "preempted": 0}.get(outcome.status, 130)
    except AblateError as e:
        summary.update(status="failed", error=str(e))
        print(f"error: {e}", file=sys.stderr)
        exit_code = e.exit_code
    except KeyboardInterrupt:  # Ctrl-C before training started (the trainer handles it after)
        summary.update(status="interrupted", reason="KeyboardInterrupt")
        exit_code = 130
    except Exception as e:  # a bug: keep the traceback in the log, one line on the console
        summary.update(status="failed", error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        log.debug("".join(traceback.format_exc()))
        (run_dir / "error.txt").write_text(traceback.format_exc()) if rank == 0 else None
        print(f"error: {summary['error']} (traceback in {run_dir / 'error.txt'})", file=sys.stderr)
        exit_code = 1
    summary["wall_time_s"] = round(time.time() - started, 3)
    summary["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    summary.pop("pid", None)
    summary.pop("job", None)
    if rank == 0:
        write_json(run_dir / SUMMARY, summary)
        try:  # the outcome is on disk; a failing dashboard or console must not change it
            if "sinks" in built:
                built["sinks"].finish(summary)
            from ablate.report import print_summary

            print_summary(summary, run_dir)
        except Exception as e:
            print(f"warning: reporting failed ({type(e).__name__}: {e}); see {run_dir / SUMMARY}",
                  file=sys.stderr)
    if exit_code and not multirun:
        raise SystemExit(exit_code)
    return summary


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def hydra_entry(cfg: DictConfig) -> dict:
    return run_experiment(cfg)
