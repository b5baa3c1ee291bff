"""`ablate resume DIR`: continue a run (or a sweep) from its own record.

A run directory keeps the overrides it was started with (`.hydra/overrides.yaml`); a sweep
directory keeps its sweep's (`multirun.yaml`). Resuming replays them with the directory pinned
(`hydra.run.dir` / `hydra.sweep.dir`), so the run finds its checkpoint and nothing is retyped.
Directory names hold '=' and ',' (they are the overrides): the pinned value is quoted for Hydra.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}
# Hydra overrides of a sweep that describe one launch, not the sweep: never replayed.
NOT_REPLAYED = ("hydra.mode", "hydra.sweep.dir", "hydra.sweeper.dry_run", "hydra.sweeper.json")


def _key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def merge(recorded: list[str], extra: list[str]) -> list[str]:
    """The recorded overrides with `extra` replacing those of the same key (Hydra refuses a key
    given twice)."""
    keys = {_key(o) for o in extra}
    return [o for o in recorded if _key(o) not in keys] + list(extra)


def _read_yaml(path: Path):
    import yaml

    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None


def run_args(run_dir: Path, extra: list[str]) -> list[str]:
    from ablate.overrides import quote

    recorded = _read_yaml(run_dir / ".hydra" / "overrides.yaml") or []
    # train.resume=auto: the run continues whatever it was started with (never would start over)
    pinned = ["train.resume=auto", f"hydra.run.dir={quote(str(run_dir))}"]
    return merge([str(o) for o in recorded], list(extra) + pinned)


def sweep_args(sweep_dir: Path, extra: list[str]) -> list[str]:
    from ablate.overrides import quote

    recorded = (_read_yaml(sweep_dir / "multirun.yaml") or {}).get("hydra", {}).get("overrides", {})
    hydra_overrides = [str(o) for o in recorded.get("hydra") or [] if _key(str(o)) not in NOT_REPLAYED]
    task = [str(o) for o in recorded.get("task") or []]
    return merge(task + hydra_overrides, list(extra) + [f"hydra.sweep.dir={quote(str(sweep_dir))}"])


def outcome_line(run_dir: Path) -> tuple[str | None, str]:
    """(status, one line saying what resuming does with it)."""
    from ablate.rundir import SUMMARY, live_status, read_json

    status = live_status(run_dir)
    try:
        summary = read_json(run_dir / SUMMARY)
    except (OSError, ValueError):
        summary = {}
    step = f"step {summary.get('step', '?')}/{summary.get('steps', '?')}"
    if status == "completed":
        return status, f"{run_dir} already completed ({step}): nothing to do"
    if status == "diverged":
        return status, (f"{run_dir} diverged at {step} ({summary.get('reason')}): resuming would diverge "
                        "again; nothing to do (change the config in a new run)")
    if status == "failed":
        return status, f"{run_dir} failed at {step} ({summary.get('error')}); retrying from its last checkpoint"
    if status is None:
        return status, f"{run_dir} has no summary yet; starting it from its last checkpoint, if any"
    return status, f"{run_dir} was {status} at {step}; resuming from its last checkpoint"


def register(app: typer.Typer) -> None:
    @app.command(context_settings=PASSTHROUGH)
    def resume(
        ctx: typer.Context,
        run_dir: Path = typer.Argument(..., help="A run directory, or a sweep directory (runs/sweeps/<time>)."),
    ) -> None:
        """Continue a stopped run from its last checkpoint, with the overrides it was started with.

        A sweep directory resumes the sweep: finished jobs return at once, stopped ones continue.
        Extra arguments are overrides that do not change what is trained (e.g. `logger=none`).
        """
        from cli.common import call_hydra, compose_checked, fail

        extra = list(ctx.args)
        if any(a.startswith("-") for a in extra):
            fail(f"ablate resume takes overrides only, not {next(a for a in extra if a.startswith('-'))}")
        d = Path(os.path.abspath(os.path.expanduser(str(run_dir))))
        if not d.is_dir():
            fail(f"no such directory: {run_dir}")
        if (d / "multirun.yaml").is_file():
            from ablate.errors import AblateError
            from ablate.sweep import preflight

            args = sweep_args(d, extra)
            recorded = {_key(a): a.split("=", 1)[1] for a in args if "=" in a}
            mode = recorded.get("hydra.sweeper.mode", "ofat")
            seeds = int(recorded.get("hydra.sweeper.seeds", 0))
            typer.echo(f"resuming sweep {d}", err=True)
            try:
                preflight(args, mode, seeds)
            except AblateError as e:
                fail(str(e), e.exit_code)
            call_hydra(args, multirun=True)
            return
        if not (d / ".hydra" / "overrides.yaml").is_file():
            fail(f"{run_dir} is not a run directory (no .hydra/overrides.yaml) nor a sweep directory "
                 "(no multirun.yaml)")
        status, line = outcome_line(d)
        typer.echo(line, err=True)
        if status in ("completed", "diverged"):
            return
        _pin_sweep_identity(d)
        args = run_args(d, extra)
        compose_checked(args, prepare_data=True)
        call_hydra(args)


def _pin_sweep_identity(run_dir: Path) -> None:
    """A sweep's job keeps its variant name and sweep (its sweeper set them at launch)."""
    from ablate.rundir import SUMMARY, read_json

    try:
        summary = read_json(run_dir / SUMMARY)
    except (OSError, ValueError):
        return
    if summary.get("sweep"):
        os.environ["ABLATE_SWEEP"] = str(summary["sweep"])
        if summary.get("variant"):
            os.environ["ABLATE_VARIANT"] = str(summary["variant"])
