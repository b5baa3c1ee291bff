"""`ablate bench`: timed training steps of the configured model on synthetic batches.

Typer only parses; the work is in ablate.bench (imported inside the command: it needs torch)."""

from __future__ import annotations

import json
from typing import List, Optional

import typer

from ablate.vocab import MFU, TOKENS_PER_S


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

    from ablate.report import table_console

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


def _print_variants(r: dict) -> None:
    from rich.table import Table

    from ablate.report import table_console

    base = " ".join(r["baseline"]["overrides"]) or "defaults"
    t = Table(title=f"tokens/s of each option vs the baseline ({base})",
              caption=f"{r['device']}; {r['clock']} clock; {r['tokens_per_step']} tokens/step; {r['rounds']} alternating "
                      f"rounds of {r['steps_per_round']} steps; ratio = median per-round variant/baseline; "
                      "FLOPs ratio = baseline/variant FLOPs per token, the ratio at equal MFU; "
                      "efficiency = ratio / FLOPs ratio")
    t.add_column("variant", no_wrap=True)
    for name in ("params", "tokens/s", "baseline tokens/s", "ratio", "best-round ratio", "FLOPs ratio",
                 "efficiency"):
        t.add_column(name, justify="right", overflow="fold")  # a narrow terminal folds, never cuts, a figure
    t.add_row("baseline", f"{r['baseline']['params']:,}", "", "", "1.000", "1.000", "1.000", "1.000")
    for row in r["rows"]:
        if "error" in row:
            t.add_row(row["variant"], "", "", "", f"n/a: {row['error']}")
        else:
            t.add_row(row["variant"], f"{row['params']:,}", f"{row[TOKENS_PER_S]:,.0f}",
                      f"{row['baseline_tokens_per_s']:,.0f}", f"{row['ratio']:.3f}",
                      f"{row['ratio_best']:.3f}", f"{row['flops_ratio']:.3f}", f"{row['efficiency']:.3f}")
    con = table_console()
    con.print(t)
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
        json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Time full training steps on synthetic batches: tokens/s, ms/step, memory, MFU.

        A step is forward, backward, clip and optimizer, as in `ablate run`.

        Examples: `ablate bench arch=llama --reference`, `ablate bench --axes --json`.
        """
        from cli.common import fail
        from ablate.errors import AblateError

        try:
            _bench(list(overrides or []), steps, warmup, rounds, reference, axes, list(only or []),
                   list(vs or []), clock, jobs_per_device, sweep_jobs, json_out)
        except AblateError as e:
            fail(str(e), e.exit_code)


def _bench(overrides, steps, warmup, rounds, reference, axes, only, vs, clock, jobs_per_device, sweep_jobs,
           json_out) -> None:
    from ablate import bench as b
    from ablate.compose import check_device, compose_config

    ks = _jobs_list(jobs_per_device) if jobs_per_device is not None else None
    b.check_options(steps, warmup, rounds, reference, axes, vs, only, clock, ks, sweep_jobs)
    cfg = compose_config(overrides)
    check_device(str(cfg.train.device))  # synthetic batches: no directory, corpus or tokenizer files
    if ks:
        _run_packing(cfg, ks, sweep_jobs, steps, warmup, json_out)
        return
    variants = [(v, v.split()) for v in vs]
    for _, extra in variants:
        compose_config(overrides + extra)
    if axes:
        variants += [(label, extra) for label, extra in b.axis_variants(overrides)
                     if not only or any(label.startswith(o) for o in only)]
    if variants:
        progress = None if json_out else (lambda label: typer.echo(f"timing {label} ...", err=True))
        result = b.bench_variants(overrides, variants, steps=steps, warmup=warmup,
                                  rounds=rounds, progress=progress, clock=clock)
    else:
        result = b.bench(cfg, steps=steps, warmup=warmup, rounds=rounds, reference=reference, clock=clock)
    if json_out:
        typer.echo(json.dumps(result, indent=2))
    elif variants:
        _print_variants(result)
    else:
        _print_result(result)


def _jobs_list(text: str) -> list[int]:
    """"1,2,4" as [1, 2, 4]; [] for text that is not such a list (check_options refuses it)."""
    try:
        return list(dict.fromkeys(int(x) for x in text.split(",") if x.strip()))
    except ValueError:
        return []


def _run_packing(cfg, ks: list[int], jobs: int, steps: int, warmup: int, json_out: bool) -> None:
    from cli.common import fail

    from ablate import bench as b
    from ablate.errors import AblateError

    progress = None if json_out else (lambda label: typer.echo(f"timing {label} ...", err=True))
    try:
        result = b.bench_packing(cfg, ks, jobs=jobs, steps=steps, warmup=warmup, progress=progress)
    except AblateError as e:
        fail(str(e), e.exit_code)
    if json_out:
        typer.echo(json.dumps(result, indent=2))
        return
    from rich.table import Table

    from ablate.report import table_console

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
