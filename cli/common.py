"""What the commands share: the one-line failure, the checked compose and the Hydra call.
Below every command module (they import it; it imports none of them)."""

from __future__ import annotations

import os
import sys

import typer


class ReaderGoneSafe:
    """stdout that outlives its reader: once a pipe's reader has gone (`ablate run ... | head`),
    what follows is written to /dev/null instead of ending a run as failed with BrokenPipeError.
    The run's log file and summary.json keep everything."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_devnull()

    def _to_devnull(self) -> None:
        os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())  # the buffer's rest goes there too

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def survive_closed_stdout() -> None:
    if not isinstance(sys.stdout, ReaderGoneSafe):
        sys.stdout = ReaderGoneSafe(sys.stdout)


def fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def compose_checked(overrides: list[str], prepare_data: bool = False):
    """Compose and validate a config without starting Hydra's job machinery (no directory is
    made), so bad input is refused with one line before anything is written. `prepare_data`:
    also tokenize the corpus into the cache now, so its problems are refused the same way."""
    from ablate.config.compose import compose_config, prepare_checked, preflight
    from ablate.errors import AblateError

    try:
        cfg = compose_config(overrides)
        preflight(cfg, overrides)
        if prepare_data:
            prepare_checked(cfg)
        return cfg
    except AblateError as e:
        fail(str(e), e.exit_code)


def finished_here(overrides: list[str], cfg) -> bool:
    """A finished run's directory re-entered with the same experiment: its recorded outcome is
    the answer (ablate/run/lifecycle.py), said in one line without starting Hydra (which would
    rewrite the directory's .hydra/ record)."""
    from ablate.config.compose import explicit_run_dir
    from ablate.run.lifecycle import RETURN, check_reentry

    run_dir = explicit_run_dir(overrides)
    decision = check_reentry(run_dir, cfg) if run_dir is not None else None
    if decision is not None and decision.action == RETURN:
        typer.echo(decision.notice, err=True)
        return True
    return False


# Hydra flags that take a value (argparse cannot put positional overrides after them).
HYDRA_VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name",
                     "-cn", "--config-dir", "-cd", "--experimental-rerun"}
INFO_TOPICS = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}


def overrides_first(args: list[str]) -> list[str]:
    """Move Hydra flags (and their values) after the overrides: `norm=x --cfg job y=1` works."""
    overrides, flags = split_flags(args)
    return overrides + flags


def split_flags(args: list[str]) -> tuple[list[str], list[str]]:
    """(overrides, Hydra flags with their values)."""
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
    return overrides, flags


# Every flag Hydra's command line takes (hydra/_internal/utils.py: get_args_parser).
HYDRA_FLAGS = HYDRA_VALUE_FLAGS | {"--resolve", "--info", "-i", "--hydra-help", "--help", "-h",
                                   "--version", "--run", "-r", "--multirun", "-m",
                                   "--shell-completion", "-sc"}


def check_flags(args: list[str]) -> None:
    """A flag Hydra does not take (`--norm=rmsnorm`, an override written as an option) is ours
    to explain, not argparse's usage of Hydra's own command line."""
    _, flags = split_flags(args)
    for f in flags:
        name = f.split("=", 1)[0]
        if not name.startswith("-") or name in HYDRA_FLAGS:
            continue  # a flag's value, or a flag Hydra takes
        key = f.lstrip("-")
        fail(f"unknown option '{f}': overrides are written without dashes, e.g. "
             f"`{key if '=' in key else key + '=VALUE'}` (Hydra's flags: --hydra-help)")


def check_flags_config(args: list[str]) -> None:
    """`--cfg` prints the composed config: refuse a config a run would refuse (one line, exit 2)
    instead of printing it. Only the config: no data, device or directory is checked."""
    overrides, flags = split_flags(args)
    if not any(f in ("--cfg", "-c") or f.startswith("--cfg=") for f in flags):
        return
    from ablate.config.compose import compose_config
    from ablate.errors import AblateError

    try:
        compose_config(overrides)
    except AblateError as e:
        fail(str(e), e.exit_code)


# `--hydra-help`, said here: Hydra's own text advertises its shell completion (`-sc install=bash`),
# which completes a Hydra app, not this Typer one, and fails.
HYDRA_HELP = """Hydra flags that `ablate run` and `ablate sweep` pass through:
  --cfg,-c job|hydra|all   print the composed config instead of running (checked like a run)
  --package,-p PKG         with --cfg: only this part of the config
  --resolve                with --cfg: resolve interpolations before printing
  --info,-i [all|config|defaults|defaults-tree|plugins|searchpath]
                           print Hydra's information about this config
  --config-dir,-cd DIR     add a directory to the config search path
  hydra.verbose=true       Hydra's debug logging (an override, not a flag)
Config groups and their options: `ablate run --help`. Shell completion is not provided."""


def call_hydra(args: list[str], multirun: bool = False) -> None:
    from ablate.run.entry import hydra_entry

    if "--hydra-help" in args:
        typer.echo(HYDRA_HELP)
        raise typer.Exit(0)

    sys.argv = ["ablate"] + (["-m"] if multirun else []) + overrides_first(args)
    hydra_entry()
