"""`ablate data prepare [OVERRIDES]` builds the token cache ahead of a sweep (so 100 sweep jobs
don't tokenize 100 times); `ablate data info` lists what is cached."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

data_app = typer.Typer(help="Prepare and list tokenized datasets (the data cache).",
                       no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _mb(n: float) -> str:
    return f"{n / 1e6:,.2f} MB"


@data_app.command(context_settings=PASSTHROUGH)
def prepare(
    ctx: typer.Context,
    json_out: bool = typer.Option(False, "--json", help="Print the cache's meta.json (and path)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
) -> None:
    """Tokenize data=... with tokenizer=... into the cache (a no-op when it is already there).

    Takes the same overrides as `ablate run`, e.g. `ablate data prepare data=fineweb_edu tokenizer=gpt2`.
    """
    from ablate.config.compose import compose_config
    from ablate.data.cache import prepare as prepare_cache
    from ablate.data.tokenizers import build_tokenizer
    from ablate.errors import AblateError

    try:
        cfg = compose_config(list(ctx.args))
        tok = build_tokenizer(cfg.tokenizer.name)
        data, built = prepare_cache(cfg.data, tok, progress=progress)
    except AblateError as e:
        _fail(str(e), e.exit_code)
    m = data.meta
    if json_out:
        typer.echo(json.dumps({"path": str(data.path), "built": built, **m}, indent=2))
        return
    what = (f"{m['source']} / {m['tokenizer']}: {m['tokens']['train']:,} train + "
            f"{m['tokens']['val']:,} val tokens ({m['dtype']}), {m['documents']:,} documents, "
            f"{_mb(m['source_bytes'])} of text")
    if built:
        typer.echo(f"prepared {what}")
        typer.echo(f"tokenized in {m['tokenize_s']:.2f} s: {m['mb_per_s']:.2f} MB/s with "
                   f"{m['threads']} thread(s)")
    else:
        typer.echo(f"already prepared (nothing to do): {what}")
    typer.echo(f"cache: {data.path}")
    _time_fetch(cfg, data)


def _time_fetch(cfg, data, steps: int = 200) -> None:
    """What one training step's batch costs (the trainer's own sampler), to compare with a step."""
    import time

    from ablate.data.batches import Batches
    from ablate.errors import DataError

    t = cfg.train
    try:
        batches = Batches(data.train, t.seq_len, t.batch_size, cfg.data_seed, grad_accum=t.grad_accum)
    except DataError as e:
        typer.echo(f"warning: {e}", err=True)
        return
    batches.get(0)
    t0 = time.perf_counter()
    for step in range(steps):
        for micro in range(t.grad_accum):
            batches.get(step, micro)
    ms = (time.perf_counter() - t0) / steps * 1e3
    typer.echo(f"batch fetch: {ms:.3f} ms per step (train.batch_size={t.batch_size} x "
               f"train.seq_len={t.seq_len} x train.grad_accum={t.grad_accum}, mean of {steps} steps)")


@data_app.command()
def info(
    cache_dir: Optional[Path] = typer.Option(
        None, "--dir", help="Cache root (default: $ABLATE_CACHE/data or ~/.cache/ablate/data)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List the cached datasets: source, tokenizer, tokens, bytes, size on disk, path."""
    from ablate.data.cache import default_cache_root, list_cached

    root = cache_dir.expanduser() if cache_dir else default_cache_root()
    rows = list_cached(root)
    if json_out:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo(f"no cached datasets under {root} (build one with `ablate data prepare`)")
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"cached datasets in {root}/")
    for col in ("source", "tokenizer", "train tokens", "val tokens", "text", "size", "path"):
        t.add_column(col, justify="right" if col in ("train tokens", "val tokens", "text", "size") else "left",
                     no_wrap=col != "path", overflow="fold")
    for r in rows:
        t.add_row(r["source"], r["tokenizer"], f"{r['tokens']['train']:,}", f"{r['tokens']['val']:,}",
                  _mb(r.get("source_bytes", 0)), _mb(r["size_bytes"]), Path(r["path"]).name)
    Console(width=max(120, Console().width)).print(t)


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")
