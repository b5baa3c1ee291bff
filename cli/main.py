"""The `ablate` command. Typer only dispatches: `run` and `sweep` hand their arguments to the
one `@hydra.main` entry point (ablate.run.entry.hydra_entry), so Hydra keeps its output directories,
logging, sweepers and launchers. Heavy imports happen inside the commands."""

from __future__ import annotations

import importlib

import typer

from cli.common import (call_hydra, check_flags, check_flags_config, compose_checked, fail, finished_here,
                        survive_closed_stdout)

app = typer.Typer(
    help="Architecture ablations of decoder-only transformer language models.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)
PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


def _version(value: bool) -> None:
    if value:
        from ablate import __version__

        typer.echo(f"ablate {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                        help="Print the version and exit.")) -> None:
    """Architecture ablations of decoder-only transformer language models."""
    survive_closed_stdout()


def config_groups_help() -> str:
    """`ablate run --help`: every config group and its options, from the axes' declarations and
    conf/ (no import of the package's heavy parts: `ablate --help` builds this too)."""
    from ablate.config.axes import config_groups

    return "\n".join(f"{group}: {', '.join(options)}" for group, options in config_groups().items())


RUN_HELP = """Train one variant. Arguments are Hydra overrides, e.g. `norm=rmsnorm attn=gqa train.steps=200`.

Hydra flags pass through: `ablate run --cfg job` (the composed config, checked like a run), `ablate run --info`, `ablate run --hydra-help`. `ablate axes` shows the defaults.

\b
Config groups (group=option):
{groups}
"""


@app.command(context_settings=PASSTHROUGH, help=RUN_HELP.format(groups=config_groups_help()))
def run(ctx: typer.Context) -> None:
    args = list(ctx.args)
    check_flags(args)
    if not any(a.startswith("-") for a in args):
        cfg = compose_checked(args, prepare_data=True)
        if finished_here(args, cfg):
            return
    else:
        check_flags_config(args)
    call_hydra(args)


@app.command()
def axes(overrides: list[str] = typer.Argument(  # "\\[": rich would read [..] as markup and drop it
             None, help="plugins=\\[my_pkg.my_module]: list its options too."),
         json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Every axis, its options and the default, with the options of installed plugins (entry
    points) and of those named by plugins=[...]."""
    from ablate.config.axes import list_axes
    from ablate.errors import ConfigError
    from ablate.plugins import KEY, load_from_overrides, loaded_confs

    other = [o for o in overrides or [] if o.lstrip("+~").split("=", 1)[0].strip() != KEY]
    if other:
        fail(f"ablate axes takes only {KEY}=[my_pkg.my_module], got '{other[0]}'; "
             "to see a composed config, use `ablate run ... --cfg job`")
    try:
        load_from_overrides(overrides or [])
    except ConfigError as e:
        fail(str(e))
    rows = list_axes(loaded_confs())
    if json_out:
        import json

        typer.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    t = Table(title="ablate axes (config groups)")
    t.add_column("group", style="bold")
    t.add_column("options")
    t.add_column("default", style="green")
    t.add_column("settings (defaults)")
    for r in rows:
        show = lambda k, v: f"{k}={'null' if v is None else v}"  # noqa: E731 (as the config writes it)
        settings = [show(k, v) for k, v in r["settings"].items()]
        settings += [f"{o}: " + " ".join(show(k, v) for k, v in own.items()) for o, own in r["option_settings"].items()]
        t.add_row(r["group"], ", ".join(o + ("*" if o in r["plugins"] else "") for o in r["options"]),
                  r["default"], escape("; ".join(settings)))
    console = Console()
    console.print(t)
    modules = sorted({m for r in rows for m in r["plugins"].values()})
    if modules:
        console.print(f"* from a plugin: {', '.join(modules)}")


# Each command below lives in its own module (`register(app)` adds it); they import their heavy
# dependencies lazily. A new command: one more name in this list, in `ablate --help` order.
COMMAND_MODULES = ["sweep", "resume", "compare", "eval", "sample", "inspect", "export", "bench", "coord_check",
                   "data"]

for _name in COMMAND_MODULES:
    importlib.import_module(f"cli.{_name}").register(app)


def main() -> None:
    """`ablate`. A usage error (a missing argument, an unknown option or command) is one `error:`
    line like every other error, not a usage block with a boxed "Error"."""
    try:  # typer vendors click from 0.2x on; the exceptions are the ones it raises
        from typer._click import exceptions
    except ImportError:  # pragma: no cover - an older typer on click
        from click import exceptions
    try:
        code = app(prog_name="ablate", standalone_mode=False)
    except exceptions.NoArgsIsHelpError as e:  # `ablate` alone: the help, as before
        e.show()
        raise SystemExit(e.exit_code) from None
    except exceptions.ClickException as e:
        message = e.format_message().rstrip(".")
        where = f" (usage: {e.ctx.command_path} --help)" if getattr(e, "ctx", None) else ""
        typer.echo(f"error: {message[:1].lower()}{message[1:]}{where}", err=True)
        raise SystemExit(e.exit_code) from None
    except typer.Abort:  # end of input at a prompt
        typer.echo("aborted", err=True)
        raise SystemExit(1) from None
    raise SystemExit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
