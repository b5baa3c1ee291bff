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
        plot: Optional[Path] = typer.Option(
            None, "--plot", help="Write curves vs tokens and each variant's difference from the "
            "baseline to this .png file (and FILE_diag.png with the diagnostics, when runs logged them)."),
        plot_keys: Optional[List[str]] = typer.Option(
            None, "--plot-key", help="Plot this metrics.jsonl key instead (repeatable; a grid), "
            "e.g. --plot-key train_loss --plot-key diag/max_attn_logit/block0."),
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
        rung also against the previous rung."""
        from cli.common import fail
        from ablate.errors import AblateError

        try:
            _compare(paths, metric, baseline, where or (), allow_mixed, fmt, per_seed, plot,
                     plot_keys or None, json_out, alpha)
        except AblateError as e:
            fail(str(e), e.exit_code)


def _compare(paths, metric, baseline, where, allow_mixed, fmt, per_seed, plot, plot_keys, json_out,
             alpha) -> None:
    from ablate.analysis import compare_dirs, per_seed_rows
    from ablate.analysis import render as R
    from ablate.errors import AblateError
    from ablate.tracking.plots import DEFAULT_KEYS, check_plot_path, plot_comparison

    if not 0 < alpha < 1:
        raise AblateError(f"--alpha must be between 0 and 1, got {alpha}")
    if fmt not in R.FORMATS:
        raise AblateError(f"--format {fmt}: choose one of {', '.join(R.FORMATS)}")
    if plot is not None:
        check_plot_path(plot)
    if not paths and not Path("runs").is_dir():
        raise AblateError("give run or sweep directories (there is no ./runs here)")
    if _compare_transfer(paths or [Path("runs")], baseline, alpha, where, fmt, plot, json_out,
                         metric, per_seed, plot_keys):
        return
    rows = compare_dirs(paths or [Path("runs")], metric=metric, baseline=baseline, alpha=alpha,
                        where=where, allow_mixed=allow_mixed)
    if json_out:
        typer.echo(R.to_json(per_seed_rows(rows) if per_seed else rows))
    elif fmt == "table":
        R.print_comparison(rows, per_seed=per_seed)
    else:
        if fmt == "csv":  # stdout stays pure CSV: what to read beside it goes to stderr
            for line in R.header_lines(rows) + [f"note: {n}" for n in rows.notes]:
                typer.echo(line, err=True)
        typer.echo(R.render(rows, fmt, per_seed), nl=False)
    quiet = json_out or fmt != "table"  # machine-readable stdout: messages to stderr
    if plot is not None:
        plot_comparison(rows, plot, keys=plot_keys or DEFAULT_KEYS)
        typer.echo(f"plot: {plot}", err=quiet)
        from ablate.diagnostics import plot_comparison_diagnostics

        diag_plot = plot_comparison_diagnostics(rows, plot)  # runs with train.diagnostics_every
        if diag_plot:
            typer.echo(f"plot: {diag_plot}", err=quiet)


def _compare_transfer(paths, baseline, alpha, where, fmt, plot, json_out, metric, per_seed,
                      plot_keys) -> bool:
    """An --lr-grid or --ladder sweep's report (ablate/analysis/transfer_report.py); False for
    other runs."""
    from ablate.errors import AblateError

    from ablate.analysis.checks import filter_runs
    from ablate.analysis.load import find_runs
    from ablate.analysis.transfer_report import find_transfer, render, transfer_compare, transfer_record

    if not find_transfer(paths):
        return False
    runs = find_runs(paths)
    runs = filter_runs(runs, where) if where else runs
    record = transfer_record(runs)
    if record is None or (where and _one_point(runs)):
        return False  # one LR or one rung of such a sweep: an ordinary comparison
    given = [flag for flag, on in (("--metric", metric != "val_loss"), ("--per-seed", per_seed),
                                   ("--plot-key", bool(plot_keys))) if on]
    if given:
        raise AblateError(f"{', '.join(given)}: not available for an --lr-grid or --ladder sweep, whose "
                          "report is on the final val_loss (compare one of its LRs or rungs with "
                          "--where train.lr=X or --where model.d_model=X instead)")
    report = transfer_compare(runs, record, baseline, alpha)
    if json_out:
        from ablate.analysis.render import to_json

        typer.echo(to_json(report.rows))
    else:
        typer.echo(render(report, fmt), nl=False)
    if plot is not None:
        from ablate.tracking.transfer_plots import plot_transfer

        typer.echo(f"plot: {plot_transfer(report, plot)}", err=json_out or fmt != "table")
    return True


def _one_point(runs) -> bool:
    """The runs (after --where) share one learning rate and one model size."""
    keys = ("train.lr", "model.d_model", "model.n_layers")
    return len({tuple(r.config.get(k) for k in keys) for r in runs}) == 1
