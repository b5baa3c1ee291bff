"""The `ablate` command. Typer only dispatches: `run` and `sweep` hand their arguments to the
one `@hydra.main` entry point (ablate.run.hydra_entry), so Hydra keeps its output directories,
logging, sweepers and launchers. Heavy imports happen inside the commands."""

from __future__ import annotations

import sys

import typer

app = typer.Typer(
    help="Architecture ablations of decoder-only transformer language models.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)
PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


def fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def compose_checked(overrides: list[str], prepare_data: bool = False, synthetic_data: bool = False):
    """Compose and validate a config without starting Hydra's job machinery (no directory is
    made), so bad input is refused with one line before anything is written. `prepare_data`:
    also tokenize the corpus into the cache now, so its problems are refused the same way.
    `synthetic_data` (bench): nothing is written and no corpus is read, so only the device is
    checked on this machine (not the output directory, data files or tokenizer files)."""
    from ablate.compose import check_device, compose_config, prepare_checked, preflight
    from ablate.errors import AblateError

    try:
        cfg = compose_config(overrides)
        if synthetic_data:
            check_device(str(cfg.train.device))
            return cfg
        preflight(cfg, overrides)
        if prepare_data:
            prepare_checked(cfg)
        return cfg
    except AblateError as e:
        fail(str(e), e.exit_code)


# Hydra flags that take a value (argparse cannot put positional overrides after them).
HYDRA_VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name",
                     "-cn", "--config-dir", "-cd", "--experimental-rerun"}
INFO_TOPICS = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}


def overrides_first(args: list[str]) -> list[str]:
    """Move Hydra flags (and their values) after the overrides: `norm=x --cfg job y=1` works."""
    overrides, flags, i = [], [], 0
    while i < len(args):
        a = args[i]
        if a.startswith("-"):
            flags.append(a)
            takes = a in HYDRA_VALUE_FLAGS or (a in ("--info", "-i") and i + 1 < len(args)
                                               and args[i + 1] in INFO_TOPICS)
            if takes and "=" not in a and i + 1 < len(args):
                flags.append(args[i + 1])
                i += 1
        else:
            overrides.append(a)
        i += 1
    return overrides + flags


def call_hydra(args: list[str], multirun: bool = False) -> None:
    from ablate.run import hydra_entry

    sys.argv = ["ablate"] + (["-m"] if multirun else []) + overrides_first(args)
    hydra_entry()


@app.command(context_settings=PASSTHROUGH)
def run(ctx: typer.Context) -> None:
    """Train one variant. Arguments are Hydra overrides, e.g. `norm=rmsnorm attn=gqa train.steps=200`.

    Hydra flags pass through: `ablate run --cfg job`, `ablate run --info`.
    """
    args = list(ctx.args)
    if not any(a.startswith("-") for a in args):
        compose_checked(args, prepare_data=True)
    call_hydra(args)


@app.command()
def axes(json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Every axis, its options and the default."""
    from ablate.axes import list_axes

    rows = list_axes()
    if json_out:
        import json

        typer.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title="ablate axes (config groups)")
    t.add_column("group", style="bold")
    t.add_column("options")
    t.add_column("default", style="green")
    for r in rows:
        t.add_row(r["group"], ", ".join(r["options"]), r["default"])
    Console().print(t)


# Each command below lives in its own module; they import their heavy dependencies lazily.
from cli import bench as _bench  # noqa: E402
from cli import compare as _compare  # noqa: E402
from cli import data as _data  # noqa: E402
from cli import inspect as _inspect  # noqa: E402
from cli import sweep as _sweep  # noqa: E402

for _module in (_sweep, _compare, _inspect, _bench, _data):
    _module.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
