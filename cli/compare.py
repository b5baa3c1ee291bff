"""`ablate compare`: the local run directories as one table (and optionally a figure)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from ablate.names import VAL_LOSS

if TYPE_CHECKING:
    from ablate.analysis.report import CompareOptions, Report


def register(app: typer.Typer) -> None:
    @app.command()
    def compare(
        paths: Optional[List[Path]] = typer.Argument(
            None, help="Run or sweep directories, searched recursively (default: ./runs)."),
        metric: str = typer.Option(VAL_LOSS, "--metric", help="Final value compared: val_loss, "
                                   "val_bpb, train_loss, tokens_per_s or any metrics.jsonl key."),
        baseline: Optional[str] = typer.Option(
            None, "--baseline", help="The baseline: a run directory or a variant name "
            "(default: the variant with no axis change, or a study's first rung)."),
        where: Optional[List[str]] = typer.Option(
            None, "--where", help="Keep only runs with KEY=VALUE (repeatable; KEY=a,b: either): "
            "an axis (norm=rmsnorm), variant, seed, status or a config key (train.steps=300)."),
        allow_mixed: bool = typer.Option(
            False, "--allow-mixed", help="Compare runs that differ in more than axis options and "
            "seed (steps, data, model size, lr ...); the output says they are mixed."),
        fmt: str = typer.Option("table", "--format", help="table (rich), csv, markdown or latex "
                                "(plain text on stdout, to paste into a paper or an issue)."),
        per_seed: bool = typer.Option(False, "--per-seed", help="One row per run instead of per variant."),
        wide: bool = typer.Option(
            False, "--wide", help="On a terminal too narrow for the table, keep every column (one field "
            "per line where they do not fit) instead of leaving the least needed out."),
        plot: Optional[Path] = typer.Option(
            None, "--plot", help="Write curves vs tokens and each variant's difference from the "
            "baseline to this .png file (and FILE_diag.png with the diagnostics, when runs logged them; "
            "FILE_lengths.png: loss vs evaluation length, when runs have length_eval.json; "
            "FILE_interaction.png: two crossed axes, the Δ of A across the levels of B)."),
        plot_keys: Optional[List[str]] = typer.Option(
            None, "--plot-key", help="Plot this metrics.jsonl key instead (repeatable; a grid), "
            "e.g. --plot-key train_loss --plot-key diag/max_attn_logit/block0."),
        cross: Optional[str] = typer.Option(
            None, "--cross", help="A,B: the Δ of axis A under each level of axis B and how it differs "
            "(their interaction, paired over seeds); B stratifies: A is compared within each of its "
            "levels. A --mode grid sweep of two axes is crossed without it."),
        json_out: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
        alpha: float = typer.Option(0.05, "--alpha", help="Significance level of the seed-noise test."),
    ) -> None:
        """Compare each variant with the baseline: is the difference bigger than seed noise?

        Runs are grouped by variant (config minus seed); runs that differ in
        anything else (steps, data, size, lr ...) are refused unless
        --allow-mixed. The test is a paired t-test on the seeds both completed,
        else Welch; each Δ has a 95% CI, a Holm-corrected p over the variants,
        an effect size in seed-noise units and the seeds 80% power would need.
        A study sweep (ablate sweep study=...) is shown in ladder order, each
        rung also against the previous rung. Two crossed axes (a --mode grid
        sweep, or --cross A,B) add their interaction: does A's gain hold
        under every level of B?"""
        from cli.common import fail
        from ablate.analysis.report import CompareOptions
        from ablate.errors import AblateError

        options = CompareOptions(metric=metric, baseline=baseline, where=tuple(where or ()),
                                 allow_mixed=allow_mixed, fmt=fmt, per_seed=per_seed, wide=wide,
                                 json=json_out, plot=plot, plot_keys=tuple(plot_keys or ()), alpha=alpha,
                                 cross=cross)
        try:
            _compare(paths or [], options)
        except AblateError as e:
            fail(str(e), e.exit_code)


def _compare(paths: List[Path], options: CompareOptions) -> None:
    from ablate.analysis.report import build_report
    from ablate.errors import AblateError
    from ablate.tracking.plots import check_plot_path

    options.check()
    if options.plot is not None:
        check_plot_path(options.plot)
    if not paths and not Path("runs").is_dir():
        raise AblateError("give run or sweep directories (there is no ./runs here)")
    report = build_report(paths or [Path("runs")], options)
    _print(report, options)
    if options.plot is not None:
        _plot(report, options)


def _print(report: Report, options: CompareOptions) -> None:
    from ablate.analysis.columns import COMPARE_HINT
    from ablate.tables import render as R

    if options.json:  # the loss at other lengths: each row's length_eval
        typer.echo(R.to_json(report.rows))
    elif options.fmt == "table":
        for i, table in enumerate(report.tables):
            if i:  # the loss at other lengths, one table per protocol
                typer.echo("")
            R.print_table(table, wide=options.wide, hint=COMPARE_HINT)
    elif options.fmt == "csv":  # one table: the lengths are more fields of the main rows
        for table in report.tables:  # stdout stays pure CSV: what to read beside it goes to stderr
            for line in table.head_lines() + [f"note: {n}" for n in table.notes]:
                typer.echo(line, err=True)
        typer.echo(R.render(report.table, options.fmt), nl=False)
    else:
        typer.echo("\n".join(R.render(table, options.fmt) for table in report.tables), nl=False)


def _plot(report: Report, options: CompareOptions) -> None:
    """The report's figure: an LR grid's or a ladder's, or curves vs tokens (and the
    diagnostics, when runs logged them); two crossed axes add the interaction's."""
    from ablate.analysis.report import ReportKind

    quiet = options.machine_readable  # machine-readable stdout: messages to stderr
    if report.kind in (ReportKind.LR_GRID, ReportKind.LADDER):
        from ablate.tracking.transfer_plots import plot_transfer

        typer.echo(f"plot: {plot_transfer(report, options.plot)}", err=quiet)
    else:
        from ablate.tracking.diagnostics_plots import plot_comparison_diagnostics
        from ablate.tracking.plots import DEFAULT_KEYS, plot_comparison

        plot_comparison(report.comparison, options.plot, keys=options.plot_keys or DEFAULT_KEYS)
        typer.echo(f"plot: {options.plot}", err=quiet)
        diag_plot = plot_comparison_diagnostics(report.comparison, options.plot)  # runs with train.diagnostics_every
        if diag_plot:
            typer.echo(f"plot: {diag_plot}", err=quiet)
        if report.lengths is not None:
            from ablate.tracking.length_plots import plot_lengths

            typer.echo(f"plot: {plot_lengths(report.lengths, options.plot)}", err=quiet)
    if report.interaction is not None:
        from ablate.tracking.plots import plot_interaction

        typer.echo(f"plot: {plot_interaction(report.interaction, options.plot)}", err=quiet)
