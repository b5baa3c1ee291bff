"""`ablate inspect`: parameters by component, FLOPs/token, KV-cache bytes; no training.

Typer only parses; the numbers come from ablate.measure.inspect (torch-free unless --build)."""

from __future__ import annotations

import json
from typing import List, Optional

import typer


def _print_report(r: dict) -> None:
    """The report's tables (ablate/measure/inspect_report.py) at the terminal's width, or whole in a pipe."""
    from ablate.measure.inspect_report import inspect_tables
    from ablate.tables.render import print_table

    for table in inspect_tables(r):
        print_table(table)


def register(app: typer.Typer) -> None:
    @app.command()
    def inspect(
        overrides: Optional[List[str]] = typer.Argument(None, help="Hydra overrides, e.g. model=small tokenizer=gpt2."),
        json_out: bool = typer.Option(False, "--json", help="Print JSON."),
        seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Tokens per sequence for FLOPs and the KV cache (default: train.seq_len)."),
        batch: Optional[int] = typer.Option(None, "--batch", help="Sequences for the KV-cache total (default: train.batch_size)."),
        dtype: str = typer.Option("bf16", "--dtype", help="KV-cache element type: bf16, fp16 or fp32."),
        build: bool = typer.Option(False, "--build", help="Also build the model (meta device, no memory) and check the counts against it."),
        grad_profile: bool = typer.Option(False, "--grad-profile", help="Per-layer gradient norms at initialization for one batch (no training): compare pre vs post norm."),
    ) -> None:
        """Parameters by component, FLOPs/token and KV-cache size of a variant; no training.

        Example: `ablate inspect model=small tokenizer=gpt2 model.vocab_size=50257 --json`.
        """
        from cli.common import fail

        from ablate.config.compose import compose_config
        from ablate.errors import AblateError
        from ablate.measure.inspect import cross_check, inspect_config

        try:
            cfg = compose_config(list(overrides or []))
            if grad_profile:  # builds the model and reads one batch of the data
                from ablate.train.diagnostics import format_profile, profile_json
                from ablate.measure.inspect import grad_profile_for_config

                profile = grad_profile_for_config(cfg)
                typer.echo(json.dumps(profile_json(profile)) if json_out else format_profile(profile))
                return
            report = inspect_config(cfg, seq_len=seq_len, batch=batch, dtype=dtype)
            if build:
                report = cross_check(report)
        except AblateError as e:
            fail(str(e), e.exit_code)
        if json_out:
            typer.echo(json.dumps(report, indent=2))
        else:
            _print_report(report)
