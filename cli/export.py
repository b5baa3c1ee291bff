"""`ablate export RUN_DIR OUT_DIR`: a run's model as a Hugging Face folder (ablate.hf)."""

from __future__ import annotations

from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def export(
        run_dir: str = typer.Argument(..., help="An ablate run directory (config.yaml + checkpoints)."),
        out_dir: str = typer.Argument(..., help="The Hugging Face folder to write."),
        family: Optional[str] = typer.Option(None, "--family", help="gpt2, llama, qwen3, qwen3_moe, mixtral or gemma2 (default: the one that matches)."),
        check: bool = typer.Option(True, "--check/--no-check", help="Generate a few tokens from the saved folder and compare with the run's model."),
    ) -> None:
        """Export a run as a Hugging Face model folder (AutoModelForCausalLM.from_pretrained).

        Special tokens are the run tokenizer's end-of-text id; the tokenizer is written as a
        tokenizer.json where a byte-level BPE represents it exactly (byte, gpt2, cl100k).
        """
        from ablate.errors import AblateError
        from ablate.hf import export as export_model
        from cli.common import fail

        try:
            result = export_model(run_dir, out_dir, family, check=check)
        except AblateError as e:
            fail(str(e), e.exit_code)
        for line in result.notes:
            typer.echo(line)
        typer.echo(f"exported {run_dir} -> {result.path}")
