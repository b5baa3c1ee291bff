"""`ablate bench`: timed training steps of the configured model on synthetic batches.

Typer only parses; the work is in ablate.measure.bench (imported inside the command: it needs torch)."""

from __future__ import annotations

import json
from typing import List, Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def bench(
        overrides: Optional[List[str]] = typer.Argument(None, help="Hydra overrides, e.g. arch=llama model=small."),
        steps: int = typer.Option(20, "--steps", help="Timed steps (per contender)."),
        warmup: int = typer.Option(3, "--warmup", help="Untimed steps first (compile, allocator, optimizer state)."),
        rounds: int = typer.Option(10, "--rounds", help="Timed steps are split into this many alternating rounds."),
        reference: bool = typer.Option(False, "--reference", help="Also time a minimal plain-PyTorch GPT of the same dimensions, alternating rounds, and print the tokens/s ratio."),
        axes: bool = typer.Option(False, "--axes", help="Time every axis option (and arch preset) alone against the baseline, alternating rounds."),
        only: Optional[List[str]] = typer.Option(None, "--only", help="With --axes: only the variants whose label starts with this (repeatable), e.g. --only act --only arch."),
        vs: Optional[List[str]] = typer.Option(None, "--vs", help="Time a variant against the baseline, alternating rounds: overrides added to the baseline's, e.g. --vs train.compile=true (repeatable; quote several overrides)."),
        clock: str = typer.Option("wall", "--clock", help="wall: elapsed time (use a quiet machine). cpu: this process's CPU time, far less disturbed by other load on a shared CPU (best with train.threads=1)."),
        jobs_per_device: Optional[str] = typer.Option(None, "--jobs-per-device", help="Time a small sweep (--sweep-jobs identical jobs, each its own process) run K at a time on one device, for each K in this list, e.g. 1,2,4,8: what `ablate sweep --jobs-per-gpu K` buys."),
        sweep_jobs: int = typer.Option(8, "--sweep-jobs", help="With --jobs-per-device: jobs in the timed sweep."),
        decode: bool = typer.Option(False, "--decode", help="Time generation with a KV cache instead of training steps: prefill tokens/s, time to first token, decode tokens/s (aggregate and per stream), KV-cache bytes and peak memory per batch size; random weights; each timing's spread over the rounds, marked * where they disagree. With --axes/--only/--vs: each option against the baseline in alternating rounds."),
        batch: Optional[str] = typer.Option(None, "--batch", help="With --decode: the batch sizes (sequences generated at once), e.g. 1,8,32 (the default)."),
        context: Optional[int] = typer.Option(None, "--context", help="With --decode: prompt tokens per sequence (default: train.seq_len minus --new-tokens)."),
        new_tokens: Optional[int] = typer.Option(None, "--new-tokens", help="With --decode: decode steps timed, one new token per sequence each (default 32)."),
        json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Time full training steps on synthetic batches: tokens/s, ms/step, memory, MFU.

        A step is forward, backward, clip and optimizer, as in `ablate run`.

        Examples: `ablate bench arch=llama --reference`, `ablate bench --axes --json`,
        `ablate bench --decode --batch 1,8,32 --only attn --axes`.
        """
        from cli.common import fail
        from ablate.errors import AblateError

        try:
            if decode or batch is not None or context is not None or new_tokens is not None:
                _decode(list(overrides or []), decode, batch, context, new_tokens, warmup, rounds, reference, axes,
                        list(only or []), list(vs or []), clock, jobs_per_device, json_out)
                return
            _bench(list(overrides or []), steps, warmup, rounds, reference, axes, list(only or []),
                   list(vs or []), clock, jobs_per_device, sweep_jobs, json_out)
        except AblateError as e:
            fail(str(e), e.exit_code)


def _bench(overrides, steps, warmup, rounds, reference, axes, only, vs, clock, jobs_per_device, sweep_jobs,
           json_out) -> None:
    from ablate.measure.bench_args import check_options
    from ablate.config.compose import check_device, compose_config

    ks = _jobs_list(jobs_per_device) if jobs_per_device is not None else None
    check_options(steps, warmup, rounds, reference, axes, vs, only, clock, ks, sweep_jobs)
    cfg = compose_config(overrides)
    check_device(str(cfg.train.device))  # synthetic batches: no directory, corpus or tokenizer files
    if ks:
        _run_packing(cfg, ks, sweep_jobs, steps, warmup, json_out)
        return
    variants = _variants(overrides, axes, only, vs)
    from ablate.measure import bench as b  # torch: once every argument is checked

    if variants:
        result = b.bench_variants(overrides, variants, steps=steps, warmup=warmup,
                                  rounds=rounds, progress=_progress(json_out), clock=clock)
    else:
        result = b.bench(cfg, steps=steps, warmup=warmup, rounds=rounds, reference=reference, clock=clock)
    _show(result, json_out)


def _progress(json_out: bool):
    """`timing ...` lines on stderr, unless stdout is JSON for a program."""
    return None if json_out else (lambda label: typer.echo(f"timing {label} ...", err=True))


def _show(result: dict, json_out: bool) -> None:
    """The result as JSON, or its table (ablate/measure/bench_report.py) at the terminal's width."""
    if json_out:
        typer.echo(json.dumps(result, indent=2))
        return
    from ablate.measure.bench_report import HINT, table_of
    from ablate.tables.render import print_table

    print_table(table_of(result), hint=HINT)


def _variants(overrides: list[str], axes: bool, only: list[str], vs: list[str]) -> list[tuple[str, list[str]]]:
    """(label, extra overrides): each --vs (composed now, so a bad one is refused before timing),
    then with --axes every other axis option and arch preset (--only: labels starting so)."""
    from ablate.config.compose import compose_config

    variants = [(v, v.split()) for v in vs]
    for _, extra in variants:
        compose_config(overrides + extra)
    if axes:
        from ablate.measure import bench as b

        variants += [(label, extra) for label, extra in b.axis_variants(overrides)
                     if not only or any(label.startswith(o) for o in only)]
    return variants


def _jobs_list(text: str) -> list[int]:
    """"1,2,4" as [1, 2, 4]; [] for text that is not such a list (check_options refuses it)."""
    try:
        return list(dict.fromkeys(int(x) for x in text.split(",") if x.strip()))
    except ValueError:
        return []


def _run_packing(cfg, ks: list[int], jobs: int, steps: int, warmup: int, json_out: bool) -> None:
    from cli.common import fail

    from ablate.measure import bench as b
    from ablate.errors import AblateError

    try:
        result = b.bench_packing(cfg, ks, jobs=jobs, steps=steps, warmup=warmup, progress=_progress(json_out))
    except AblateError as e:
        fail(str(e), e.exit_code)
    _show(result, json_out)


def _decode(overrides, decode, batch, context, new_tokens, warmup, rounds, reference, axes, only, vs, clock,
            jobs_per_device, json_out) -> None:
    """`ablate bench --decode`: ablate/measure/decode_bench.py."""
    from ablate.measure import bench_args as o
    from ablate.config.compose import check_device, compose_config
    from ablate.errors import ConfigError

    if not decode:
        raise ConfigError("--batch, --context and --new-tokens go with --decode")
    batches = _jobs_list(batch) if batch is not None else None
    o.check_decode(batches, context, new_tokens, reference, jobs_per_device)
    o.check_options(1, warmup, rounds, False, axes, vs, only, clock, None, 1)  # no --steps, --sweep-jobs here
    cfg = compose_config(overrides)
    check_device(str(cfg.train.device))
    new_tokens = o.DEFAULT_NEW_TOKENS if new_tokens is None else new_tokens
    context = o.default_context(cfg, new_tokens) if context is None else context
    batches = batches or list(o.DEFAULT_BATCHES)
    variants = _variants(overrides, axes, only, vs)
    from ablate.measure import decode_bench as d  # torch: once every argument is checked

    if variants:
        result = d.bench_decode_variants(overrides, variants, batches, context, new_tokens, rounds, warmup,
                                         clock, _progress(json_out))
    else:
        result = d.bench_decode(cfg, batches, context, new_tokens, rounds, warmup, clock, _progress(json_out))
    _show(result, json_out)

