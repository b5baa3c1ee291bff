"""`ablate sweep`: many variants through Hydra multirun and the ablate sweeper plugin.

Typer only dispatches: the options become hydra.sweeper.* overrides and everything else passes
to the same `@hydra.main` entry point as `ablate run`, with `-m`."""

from __future__ import annotations

from typing import Optional

import typer

# cli.main is imported inside the command: it imports this module (and may be __main__).
PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


def register(app: typer.Typer) -> None:
    @app.command(context_settings=PASSTHROUGH)
    def sweep(
        ctx: typer.Context,
        mode: str = typer.Option("ofat", "--mode", help="ofat: baseline + one change at a time; grid: every combination."),
        seeds: Optional[int] = typer.Option(None, "--seeds", help="Run every variant with seed=0..N-1 (same data_seed: paired)."),
        dry_run: bool = typer.Option(False, "--dry-run", help="List the jobs (overrides per job; with launcher=slurm, the sbatch script); run nothing."),
        json_out: bool = typer.Option(False, "--json", help="With --dry-run: a JSON list of the jobs' override lists."),
        strict: bool = typer.Option(False, "--strict", help="Exit non-zero if any job failed, diverged or did not finish."),
        lr_grid: Optional[str] = typer.Option(None, "--lr-grid", help="LO:HI:N: every variant at N log-spaced learning rates (seed 0), then --seeds K of each at its own best LR (with --ladder: on every rung); compare reports best_lr, lr_sensitivity and tuned_delta."),
        ladder: Optional[str] = typer.Option(None, "--ladder", help="Every variant on every rung of a model ladder (conf/ladder/NAME.yaml: cpu, gpu; or a .yaml file); compare reports the compute multiplier."),
        jobs_per_gpu: Optional[int] = typer.Option(None, "--jobs-per-gpu", help="Run K jobs at once on each GPU (on a CPU-only machine: K processes sharing the cores), each with its share of the CPU threads; for small models that leave a GPU idle. Needs launcher=joblib, submitit_local or slurm (there: K jobs per array task)."),
    ) -> None:
        """Run many variants, e.g. `ablate sweep norm=layernorm,rmsnorm act=gelu,swiglu --seeds 3`.

        Launchers: launcher=basic|joblib|submitit_local|slurm (e.g. `launcher=slurm
        hydra.launcher.partition=gpu`). Presets: study=gpt2_to_llama. Hydra flags pass through.
        One line per job as it ends; at the end the runs are compared. The exit code is non-zero
        if every job failed (with --strict: if any job failed or diverged). Each job's outcome
        (status, run dir, error) is written to <sweep dir>/sweep.json. Another installed Hydra
        sweeper is chosen with hydra/sweeper=NAME (e.g. basic, optuna); it plans its own jobs.
        """
        from ablate.errors import AblateError
        from ablate.sweep import check_options, preflight
        from ablate.config.overrides import quote
        from cli.common import call_hydra, check_flags, fail

        try:
            check_options(mode, seeds, jobs_per_gpu, lr_grid, ladder)
        except AblateError as e:
            fail(str(e), e.exit_code)
        from ablate.sweep.transfer_plan import as_added_keys

        args = as_added_keys(list(ctx.args))  # ladder.lr_rule=mup: not a config key
        check_flags(args)
        other = other_sweeper(args)
        if other:  # its own options are hydra.sweeper.* overrides; ablate's do not exist there
            given = [flag for flag, on in (("--mode", mode != "ofat"), ("--seeds", seeds is not None),
                                           ("--dry-run", dry_run), ("--json", json_out),
                                           ("--strict", strict), ("--lr-grid", lr_grid is not None),
                                           ("--ladder", ladder is not None),
                                           ("--jobs-per-gpu", jobs_per_gpu is not None)) if on]
            if given:
                fail(f"{', '.join(given)} apply to ablate's sweeper; hydra/sweeper={other} plans and "
                     f"runs its own jobs (set its options as hydra.sweeper.* overrides)")
        if json_out and not dry_run:
            fail("--json lists the jobs: use it with --dry-run")
        if not any(a.startswith("-") for a in args):
            try:
                preflight(args, mode, seeds or 0, ladder=ladder is not None)
            except AblateError as e:
                fail(str(e), e.exit_code)
        # Hydra takes --cfg/--info instead of -m: show the (first) job's config, run nothing.
        inspecting = any(a in ("--cfg", "-c", "--info", "-i") or a.startswith(("--cfg=", "--info="))
                         for a in args)
        given = {"mode": None if other else mode, "seeds": seeds, "strict": "true" if strict else None,
                 "jobs_per_gpu": jobs_per_gpu, "dry_run": "true" if dry_run else None,
                 "json": "true" if json_out else None, "lr_grid": lr_grid and quote(lr_grid),
                 "ladder": ladder and quote(ladder)}
        call_hydra(args + sweeper_overrides(given), multirun=not inspecting)


def sweeper_overrides(given: dict) -> list[str]:
    """The command's options as the ablate sweeper's hydra.sweeper.* keys (only those given)."""
    return [f"hydra.sweeper.{k}={v}" for k, v in given.items() if v is not None]


def other_sweeper(args: list[str]) -> str:
    """The Hydra sweeper chosen on the command line (`hydra/sweeper=basic`) when it is not
    ablate's, else ''."""
    chosen = ""
    for a in args:
        key, _, value = a.lstrip("+~").partition("=")
        if key.removeprefix("override ").strip() == "hydra/sweeper":
            chosen = value.strip()
    return "" if chosen in ("", "ablate") else chosen
