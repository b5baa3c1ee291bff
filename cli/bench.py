"""`ablate bench`: timed training steps of the configured model on synthetic batches.

Typer only parses; the work is in ablate.measure.bench (imported inside the command: it needs torch)."""

from __future__ import annotations

import json
from typing import List, Optional

import typer

from ablate.names import MFU, TOKENS_PER_S


def _gb(n: Optional[float]) -> str:
    return "-" if n is None else f"{n / 2 ** 30:.2f} GiB" if n >= 2 ** 30 else f"{n / 2 ** 20:.0f} MiB"


def _flops(x: Optional[float]) -> str:
    if x is None:
        return "-"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if x >= scale:
            return f"{x / scale:.2f} {unit}FLOP" if unit != "M" else f"{x / scale:.1f} MFLOP"
    return f"{x:.0f} FLOP"


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _print_result(r: dict) -> None:
    from rich.table import Table

    from ablate.terminal import table_console

    con = table_console()
    setting = (f"{r['device']}, {r['precision']}, compile={'on' if r['compile'] else 'off'}, "
               f"batch {r['batch_size']} x seq {r['seq_len']} x accum {r['grad_accum']} "
               f"= {r['tokens_per_step']} tokens/step, {r['steps']} timed steps in {r['rounds']} "
               f"rounds after {r['warmup']} warm-up, {r['clock']} clock")
    t = Table(title="ablate bench", caption=setting)
    t.add_column("")
    t.add_column("tokens/s", justify="right")
    t.add_column("ms/step", justify="right")
    t.add_column("MFU", justify="right")
    t.add_column("params", justify="right")
    t.add_column("peak memory", justify="right")
    t.add_row("ablate", f"{r[TOKENS_PER_S]:,.0f}", f"{r['step_ms']:.1f}", _pct(r[MFU]),
              f"{r['params']:,}", _gb(r["peak_memory_bytes"]))
    ref = r.get("reference")
    if ref:
        t.add_row("reference (plain PyTorch GPT)", f"{ref[TOKENS_PER_S]:,.0f}", f"{ref['step_ms']:.1f}",
                  _pct(ref[MFU]), f"{ref['params']:,}", _gb(ref["peak_memory_bytes"]))
    con.print(t)
    con.print(f"model FLOPs/token: {_flops(r['flops_per_token'])} (6N + 12·L·d·T); achieved "
              f"{_flops(r['achieved_flops'])}/s")
    con.print(f"peak: {r['peak_flops_source']}")
    con.print(f"peak memory: {r['peak_memory_kind']}")
    if ref:
        rr = ", ".join(f"{x:.3f}" for x in r["round_ratios"])
        con.print(f"[bold]ratio ablate / reference tokens/s: {r['ratio']:.3f}[/bold] "
                  f"(median of alternating rounds: {rr}; best round vs best round: {r['ratio_best']:.3f})")
    if ref and ref["differs_on"]:
        con.print(f"[yellow]note: the reference is GPT-2; this model differs on {', '.join(ref['differs_on'])}, "
                  "so the ratio compares architectures, not implementations[/yellow]")
    if not r["loss_finite"] or (ref and not ref["loss_finite"]):
        con.print("[red]warning: a non-finite loss during the benchmark[/red]")


def _print_versus(r: dict, what: str, caption: str, columns: tuple[str, ...], cells, first=None):
    """A table of options against the baseline (`first`: a row before theirs); `cells(row)`: a
    row's figures. Returns the console it was printed on."""
    from rich.table import Table

    from ablate.terminal import table_console

    base = " ".join(r["baseline"]["overrides"]) or "defaults"
    t = Table(title=f"{what} of each option vs the baseline ({base})", caption=caption)
    t.add_column("variant", no_wrap=True)
    for name in columns:
        t.add_column(name, justify="right", overflow="fold")  # a narrow terminal folds, never cuts, a figure
    for row in ([first] if first else []) + [[row["variant"], *cells(row)] for row in r["rows"]]:
        t.add_row(*row)
    con = table_console()
    con.print(t)
    return con


def _print_variants(r: dict) -> None:
    def cells(row: dict) -> list[str]:
        if "error" in row:
            return ["", "", "", f"n/a: {row['error']}"]
        return [f"{row['params']:,}", f"{row[TOKENS_PER_S]:,.0f}", f"{row['baseline_tokens_per_s']:,.0f}",
                f"{row['ratio']:.3f}", f"{row['ratio_best']:.3f}", f"{row['flops_ratio']:.3f}", f"{row['efficiency']:.3f}"]

    con = _print_versus(
        r, "tokens/s", f"{r['device']}; {r['clock']} clock; {r['tokens_per_step']} tokens/step; {r['rounds']} alternating "
        f"rounds of {r['steps_per_round']} steps; ratio = median per-round variant/baseline; "
        "FLOPs ratio = baseline/variant FLOPs per token, the ratio at equal MFU; efficiency = ratio / FLOPs ratio",
        ("params", "tokens/s", "baseline tokens/s", "ratio", "best-round ratio", "FLOPs ratio", "efficiency"), cells,
        first=["baseline", f"{r['baseline']['params']:,}", "", "", "1.000", "1.000", "1.000", "1.000"])
    fell = [row["variant"] for row in r["rows"] if row.get("compile_fallback")]
    if fell:  # dynamo gave up compiling while these were timed: their ratios compare eager code
        con.print(f"[red]warning: torch.compile fell back to eager while timing {', '.join(fell)} "
                  f"({next(row['compile_fallback_reason'] for row in r['rows'] if row.get('compile_fallback'))})[/red]")


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
        decode: bool = typer.Option(False, "--decode", help="Time generation with a KV cache instead of training steps: prefill tokens/s, time to first token, decode tokens/s (aggregate and per stream), KV-cache bytes and peak memory per batch size; random weights. With --axes/--only/--vs: each option against the baseline in alternating rounds."),
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
    _show(result, json_out, _print_variants if variants else _print_result)


def _progress(json_out: bool):
    """`timing ...` lines on stderr, unless stdout is JSON for a program."""
    return None if json_out else (lambda label: typer.echo(f"timing {label} ...", err=True))


def _show(result: dict, json_out: bool, print_table) -> None:
    if json_out:
        typer.echo(json.dumps(result, indent=2))
    else:
        print_table(result)


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
    if json_out:
        typer.echo(json.dumps(result, indent=2))
        return
    from rich.table import Table

    from ablate.terminal import table_console

    t = Table(title=f"a sweep of {result['jobs']} jobs, K at a time on one device",
              caption=f"{result['device']}; {result['cores']} cores; each job: its own process, "
                      f"{result['warmup']} warm-up + {result['steps']} timed steps of "
                      f"{result['tokens_per_step']} tokens; wall = first start to last end "
                      "(imports and build included); tokens/s (all jobs) = timed tokens / wall; while "
                      "training = timed tokens / time any job was in its timed steps")
    for name in ("jobs at once", "threads/job", "wall s", "tokens/s (all jobs)", "speedup vs first",
                 "tokens/s while training", "tokens/s per job"):
        t.add_column(name, justify="right")
    for r in result["rows"]:
        t.add_row(str(r["jobs_per_device"]), str(r["threads_per_job"]), f"{r['wall_s']:.1f}",
                  f"{r[TOKENS_PER_S]:,.0f}", f"{r['speedup']:.2f}x",
                  f"{r['training_tokens_per_s']:,.0f}", f"{r['job_tokens_per_s']:,.0f}")
    con = table_console()
    con.print(t)
    if not all(r["loss_finite"] for r in result["rows"]):
        con.print("[red]warning: a non-finite loss during the benchmark[/red]")


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
    _show(result, json_out, _print_decode_variants if variants else _print_decode)


def _print_decode(r: dict) -> None:
    from rich.table import Table

    from ablate.terminal import table_console
    from ablate.terminal import human_bytes

    t = Table(title="ablate bench --decode",
              caption=f"{r['device']}, {r['precision']}, eager, {r['params']:,} params (random weights); prompt "
                      f"{r['context']} tokens, then {r['new_tokens']} decode steps of one token per sequence; "
                      f"medians of {r['rounds']} rounds after {r['warmup']} warm-up, {r['clock']} clock; "
                      f"aggregate = every sequence of the batch together, per stream = one sequence")
    for name in ("batch", "prefill tokens/s", "time to first token", "decode tokens/s aggregate",
                 "decode tokens/s per stream", "KV cache", "KV bytes/token", "peak memory"):
        t.add_column(name, justify="right", overflow="fold")
    for row in r["rows"]:
        t.add_row(str(row["batch"]), f"{row['prefill_tokens_per_s']:,.0f}", f"{row['time_to_first_token_ms']:.1f} ms",
                  f"{row['decode_tokens_per_s_aggregate']:,.0f}", f"{row['decode_tokens_per_s_per_stream']:,.1f}",
                  human_bytes(row["kv_cache_bytes"]), f"{row['kv_cache_bytes_per_token']:,}", human_bytes(row["peak_memory_bytes"]))
    con = table_console()
    con.print(t)
    con.print(f"KV cache: measured from the cache tensors at {r['context'] + r['new_tokens']} positions per "
              f"sequence; `ablate inspect`'s formula at {r['precision']}: "
              f"{r['kv_cache_formula_bytes_per_token']:,} bytes/token")
    con.print(f"peak memory: {r['peak_memory_kind']}")


def _print_decode_variants(r: dict) -> None:
    def cells(row: dict) -> list[str]:
        if "error" in row:
            return [f"n/a: {row['error']}"]
        return [str(row["batch"]), f"{row['kv_cache_bytes_per_token']:,}", f"{row['kv_cache_ratio']:.2f}",
                f"{row['decode_tokens_per_s_aggregate']:,.0f}", f"{row['baseline']['decode_tokens_per_s_aggregate']:,.0f}",
                f"{row['ratio']:.3f}", f"{row['ratio_best']:.3f}", f"{row['prefill_ratio']:.3f}"]

    _print_versus(
        r, "decode tokens/s", f"{r['device']}, {r['precision']}, eager; prompt {r['context']} tokens, {r['new_tokens']} "
        f"decode steps; {r['rounds']} alternating rounds after {r['warmup']} warm-up; decode tokens/s: aggregate over "
        "the batch; ratio = median per-round variant/baseline; KV ratio = baseline/variant cache bytes",
        ("batch", "KV bytes/token", "KV ratio", "decode tokens/s", "baseline decode tokens/s", "ratio",
         "best-round ratio", "prefill ratio"), cells)
