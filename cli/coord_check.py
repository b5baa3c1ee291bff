"""`ablate coord-check`: the mean |activation| of each module against width (or depth) over the
first training steps, and its log-log slope; no run directory.

Typer only parses; the measurement is ablate.measure.coord_check (torch, imported inside the command)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List, Optional

import typer

from ablate.measure.coord_check import DEFAULT_SEEDS, DEFAULT_STEPS, DEFAULT_WIDTHS


def register(app: typer.Typer) -> None:
    @app.command("coord-check")
    def coord_check(
        overrides: Optional[List[str]] = typer.Argument(None, help="Hydra overrides, e.g. param=mup model.n_layers=2."),
        widths: Optional[str] = typer.Option(None, "--widths", help=f"model.d_model values, at least 3 (default {','.join(map(str, DEFAULT_WIDTHS))}); model.n_heads stays fixed, so head_dim grows."),
        depths: Optional[str] = typer.Option(None, "--depths", help="model.n_layers values instead of widths, at least 3, e.g. 2,4,8."),
        steps: int = typer.Option(DEFAULT_STEPS, "--steps", help="Steps recorded: step 1 is the forward pass at init, each later one after an update."),
        seeds: int = typer.Option(DEFAULT_SEEDS, "--seeds", help="Models per size (init seeds 0..N-1); the slope's spread is over them."),
        plot: Optional[Path] = typer.Option(None, "--plot", help="Also draw the mup package's panels (one per step) to this .png/.pdf/.svg."),
        json_out: bool = typer.Option(False, "--json", help="Print JSON: every value per layer, the slopes, the reading."),
    ) -> None:
        """Coordinate check: does each activation's size stay flat as the model widens (muP) or grow (sp)?

        Each width (or depth) trains a few steps at a constant train.lr (no warmup, decay or clipping).

        The run's own data, 4 x 64 tokens a step unless train.batch_size or train.seq_len is given.

        Printed: per module, the log-log slope of mean |x| against width, and a one-line reading.

        Under param=mup or completep the base shape is the smallest size unless model.base_width (base_depth) is given.

        Examples: `ablate coord-check param=mup --plot coord.png`, `ablate coord-check param=completep --depths 2,4,8`.
        """
        from cli.common import fail

        from ablate.errors import AblateError

        try:
            request = _request(list(overrides or []), widths, depths, steps, seeds)
            if plot is not None:
                _check_plot(plot)
            check = _measure(request, json_out)
            if plot is not None:
                from ablate.tracking.coord_plots import plot_coord_check

                plot_coord_check(check, plot)
        except AblateError as e:
            fail(str(e), e.exit_code)
        if json_out:
            typer.echo(json.dumps(check.to_json(), indent=2))
        else:
            _print(check)
        if plot is not None:
            typer.echo(f"plot: {plot}", err=True)


def _request(overrides, widths, depths, steps, seeds):
    from ablate.measure.coord_check import Request, Sweep, check_request, parse_sizes
    from ablate.errors import ConfigError

    if widths is not None and depths is not None:
        raise ConfigError("--widths and --depths together: sweep one at a time (the other stays at the config's value)")
    sweep = Sweep.DEPTH if depths is not None else Sweep.WIDTH
    text = depths if depths is not None else widths if widths is not None else ",".join(map(str, DEFAULT_WIDTHS))
    request = Request(sweep, parse_sizes(text, sweep.flag), steps, seeds, tuple(overrides))
    check_request(request, n_heads=None)
    return request


def _check_plot(plot: Path) -> None:
    from ablate.errors import AblateError
    from ablate.tracking.plots import check_plot_path

    check_plot_path(plot)
    existed = plot.exists()
    try:  # opened, not judged from permission bits: root passes those, a read-only mount does not
        with open(plot, "ab"):
            pass
    except OSError as e:
        raise AblateError(f"--plot {plot}: cannot write there ({e.strerror or e}); "
                          "choose a file in a folder you can write") from None
    if not existed:
        os.unlink(plot)  # measured first; nothing is left if that fails


def _measure(request, json_out: bool):
    from ablate.measure.coord_check import measure

    def progress(what: str) -> None:
        typer.echo(f"coord-check: {what} ...", err=True)

    return measure(request, None if json_out else progress)


def _print(check) -> None:
    """The table (ablate/measure/coord_report.py) at the terminal's width, or whole in a pipe."""
    from ablate.measure.coord_report import coord_table
    from ablate.tables.render import print_table

    print_table(coord_table(check.to_json()))
