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
    from ablate.config.overrides import quote

    recorded = _read_yaml(run_dir / ".hydra" / "overrides.yaml") or []
    # train.resume=auto: the run continues whatever it was started with (never would start over)
    pinned = ["train.resume=auto", f"hydra.run.dir={quote(str(run_dir))}"]
    return merge([str(o) for o in recorded], list(extra) + pinned)


def sweep_args(sweep_dir: Path, extra: list[str]) -> list[str]:
    from ablate.config.overrides import quote

    recorded = (_read_yaml(sweep_dir / "multirun.yaml") or {}).get("hydra", {}).get("overrides", {})
    hydra_overrides = [str(o) for o in recorded.get("hydra") or [] if _key(str(o)) not in NOT_REPLAYED]
    task = [str(o) for o in recorded.get("task") or []]
    return merge(task + hydra_overrides, list(extra) + [f"hydra.sweep.dir={quote(str(sweep_dir))}"])


def resume_line(decision) -> str:
    """What resuming a stopped run does (the run says it itself when it starts over or extends)."""
    found, record = decision.found, decision.found.record
    step = record.step if record is not None else None
    steps = record.steps if record is not None and record.steps is not None else "?"
    at = f" at step {step}/{steps}" if step is not None else ""
    return (f"{found.run_dir} was {found.status or 'started'}{at}; resuming from its checkpoint "
            f"of step {found.checkpoints[-1][0]}")


def register(app: typer.Typer) -> None:
    @app.command(context_settings=PASSTHROUGH)
    def resume(
        ctx: typer.Context,
        run_dir: Path = typer.Argument(..., help="A run directory, or a sweep directory (runs/sweeps/<time>)."),
        extend: int = typer.Option(None, "--extend", metavar="STEPS",
                                   help="Train a completed run further, to STEPS steps (recorded as extended)."),
    ) -> None:
        """Continue a stopped run from its last checkpoint, with the overrides it was started with.

        A finished run's result is returned as it is; `--extend STEPS` trains a completed run
        further (the extra steps keep the learning rate its schedule ended with). A sweep
        directory resumes the sweep: finished jobs return at once, stopped ones continue.
        Extra arguments are overrides that do not change what is trained (e.g. `logger=none`).
        """
        from cli.common import call_hydra, compose_checked, fail

        extra = list(ctx.args)
        if any(a.startswith("-") for a in extra):
            fail(f"ablate resume takes overrides only, not {next(a for a in extra if a.startswith('-'))}")
        d = Path(os.path.abspath(os.path.expanduser(str(run_dir))))
        if not d.is_dir():
            fail(f"no such directory: {run_dir}")
        if extend is not None:
            if extend < 1:
                fail(f"--extend takes the new total of steps (>= 1), got {extend}")
            extra += [f"train.steps={extend}", "train.extend=true"]
        if (d / "multirun.yaml").is_file():
            _resume_sweep(d, extra)
            return
        if not (d / ".hydra" / "overrides.yaml").is_file():
            fail(f"{run_dir} is not a run directory (no .hydra/overrides.yaml) nor a sweep directory "
                 "(no multirun.yaml)")
        from ablate.run.lifecycle import RESUME, RETURN, check_reentry

        args = run_args(d, extra)
        cfg = compose_checked(args, prepare_data=True)  # refuses another experiment (ablate/run/lifecycle.py)
        decision = check_reentry(d, cfg)
        if decision is not None and decision.action == RETURN:
            typer.echo(decision.notice, err=True)
            return
        if decision is not None and decision.action == RESUME:
            typer.echo(resume_line(decision), err=True)
        call_hydra(args)


def _resume_sweep(sweep_dir: Path, extra: list[str]) -> None:
    from ablate.errors import AblateError
    from ablate.sweep import preflight
    from cli.common import call_hydra, fail

    args = sweep_args(sweep_dir, extra)
    recorded = {_key(a): a.split("=", 1)[1] for a in args if "=" in a}
    mode = recorded.get("hydra.sweeper.mode", "ofat")
    seeds = int(recorded.get("hydra.sweeper.seeds", 0))
    typer.echo(f"resuming sweep {sweep_dir}", err=True)
    try:
        preflight(args, mode, seeds, ladder="hydra.sweeper.ladder" in recorded)
    except AblateError as e:
        fail(str(e), e.exit_code)
    call_hydra(args, multirun=True)

