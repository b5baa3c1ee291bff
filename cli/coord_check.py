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

TABLE_STEPS = 5  # step columns in the table (all of them in --json and --plot)


def register(app: typer.Typer) -> None:
    @app.command("coord-check")
    def coord_check(
        overrides: Optional[List[str]] = typer.Argument(None, help="Hydra overrides, e.g. param=mup model.n_layers=2."),
        widths: Optional[str] = typer.Option(None, "--widths", help=f"model.d_model values, at least 3 (default {','.join(map(str, DEFAULT_WIDTHS))}); model.n_heads stays fixed, so head_dim grows."),
        depths: Optional[str] = typer.Option(None, "--depths", help="model.n_layers values instead of widths, at least 3, e.g. 2,4,8."),
        steps: int = typer.Option(DEFAULT_STEPS, "--steps", help="Steps recorded: step 1 is the forward pass at init, each later one after an update."),
        seeds: int = typer.Option(DEFAULT_SEEDS, "--seeds", help="Models per size (init seeds 0..N-1); the slope's spread is over them."),
        plot: Optional[Path] = typer.Option(None, "--plot", help="Also draw the mup package's panels (one per step) to this .png/.pdf/.svg/.jpg."),
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
    from rich.table import Table

    from ablate.measure.coord_check import Module
    from ablate.terminal import print_text, table_console

    r, s = check.request, check.setting
    shown = _shown_steps(r.steps)
    base = f"; base {r.sweep.value} {s.base}" if s.base is not None else ""
    t = Table(title=f"coord-check: slope of log mean |x| against log {r.sweep.value} (mean ± sd over {r.seeds} seeds)",
              caption=f"param={s.param}{base}; {r.sweep.value}s {','.join(map(str, r.sizes))}; lr {s.lr:g} constant; "
                      f"batch {s.batch_size} x {s.seq_len} tokens; {s.device}, {s.precision}; "
                      f"t=1: at init; layers averaged, the residual stream the last block's (--json: each layer)")
    t.add_column("module")
    for step in shown:
        t.add_column(f"t={step}", justify="right")
    t.add_column(f"mean |x| at t={r.steps}: {r.sizes[0]} -> {r.sizes[-1]}", justify="right")
    for m in Module:
        first, last = (sum(tr.mean(m, r.steps) for tr in check.traces if tr.size == size) / r.seeds
                       for size in (r.sizes[0], r.sizes[-1]))
        t.add_row(m.label, *(_cell(check.slope(m, step)) for step in shown), f"{first:.3g} -> {last:.3g}")
    con = table_console()
    con.print(t)
    print_text(con, f"[bold]{check.reading()}[/bold]")


def _shown_steps(steps: int) -> list[int]:
    """Every step up to TABLE_STEPS of them; else the first three, the middle and the last."""
    if steps <= TABLE_STEPS:
        return list(range(1, steps + 1))
    return sorted({1, 2, 3, (steps + 1) // 2, steps})


def _cell(slope) -> str:
    if slope.mean != slope.mean:  # nan: a non-finite activation
        return "nan"
    return f"{slope.mean:+.2f}" + ("" if slope.spread is None else f" ± {slope.spread:.2f}")
