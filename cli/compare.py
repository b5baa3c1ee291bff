"""`ablate compare`: the local run directories as one table (and optionally a figure)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def compare(
        paths: Optional[List[Path]] = typer.Argument(
            None, help="Run or sweep directories, searched recursively (default: ./runs)."),
        metric: str = typer.Option("val_loss", "--metric", help="Final value compared: val_loss, "
                                   "val_bpb, train_loss, tokens_per_s or any metrics.jsonl key."),
        baseline: Optional[str] = typer.Option(
            None, "--baseline", help="The baseline: a run directory or a variant name "
            "(default: the variant with no axis change)."),
        plot: Optional[Path] = typer.Option(
            None, "--plot", help="Write loss and grad-norm curves vs tokens to this .png file "
            "(and FILE_diag.png with the diagnostics, when runs logged them)."),
        plot_keys: Optional[List[str]] = typer.Option(
            None, "--plot-key", help="Plot this metrics.jsonl key instead (repeatable), "
            "e.g. --plot-key train_loss --plot-key diag/max_attn_logit/block0."),
        json_out: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
        alpha: float = typer.Option(0.05, "--alpha", help="Significance level of the seed-noise test."),
    ) -> None:
        """Compare each variant with the baseline: is the difference bigger than seed noise?

        Runs are grouped by variant (config minus seed); the test is a paired
        t-test on the seeds both completed, else Welch. A study sweep
        (ablate sweep study=...) is shown in ladder order, each rung also
        against the previous rung."""
        from cli.common import fail
        from ablate.errors import AblateError

        try:
            from ablate.tracking.compare import compare_dirs, print_comparison, to_json
            from ablate.tracking.plots import DEFAULT_KEYS, check_plot_path, plot_comparison

            if not 0 < alpha < 1:
                raise AblateError(f"--alpha must be between 0 and 1, got {alpha}")
            if plot is not None:
                check_plot_path(plot)
            if not paths and not Path("runs").is_dir():
                raise AblateError("give run or sweep directories (there is no ./runs here)")
            rows = compare_dirs(paths or [Path("runs")], metric=metric, baseline=baseline, alpha=alpha)
            if json_out:
                typer.echo(to_json(rows))
            else:
                print_comparison(rows)
            if plot is not None:
                plot_comparison(rows, plot, keys=plot_keys or DEFAULT_KEYS)
                typer.echo(f"plot: {plot}", err=json_out)
                from ablate.diagnostics import plot_comparison_diagnostics

                diag_plot = plot_comparison_diagnostics(rows, plot)  # runs with train.diagnostics_every
                if diag_plot:
                    typer.echo(f"plot: {diag_plot}", err=json_out)
        except AblateError as e:
            fail(str(e), e.exit_code)
