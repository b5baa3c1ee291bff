"""The `ablate` command. Typer only dispatches: `run` and `sweep` hand their arguments to the
one `@hydra.main` entry point (ablate.run.hydra_entry), so Hydra keeps its output directories,
logging, sweepers and launchers. Heavy imports happen inside the commands."""

from __future__ import annotations

import importlib

import typer

from cli.common import call_hydra, compose_checked

app = typer.Typer(
    help="Architecture ablations of decoder-only transformer language models.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)
PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


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


# Each command below lives in its own module (`register(app)` adds it); they import their heavy
# dependencies lazily. A new command: one more name in this list, in `ablate --help` order.
COMMAND_MODULES = ["sweep", "resume", "compare", "inspect", "bench", "data"]

for _name in COMMAND_MODULES:
    importlib.import_module(f"cli.{_name}").register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
