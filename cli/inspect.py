"""`ablate inspect`: parameters by component, FLOPs/token, KV-cache bytes; no training.

Typer only parses; the numbers come from ablate.measure.inspect (torch-free unless --build)."""

from __future__ import annotations

import json
from typing import List, Optional

import typer


def _print_report(r: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    from ablate.terminal import human_bytes, print_table, print_text, table_console

    con = table_console()  # piped: full lines; on a terminal: lines broken between words

    def say(markup: str) -> None:
        print_text(con, markup)

    s = r["spec"]
    settings = [f"{a}.{k}={v}" for a, values in s.get("settings", {}).items() for k, v in values.items()]
    axes = " ".join([f"{k}={v}" for k, v in r["axes"].items()] + settings)  # norm.alpha0=0.5 with dyt
    say(f"[bold]{escape(axes)}[/bold]")
    say(f"d_model {s['d_model']}, {s['n_layers']} layers, {s['n_heads']} heads x head_dim "
        f"{r['head_dim']}, {s['n_kv_heads']} KV heads, d_ff {s['d_ff']}, max_seq_len {s['max_seq_len']}")
    t = Table(title="parameters")
    t.add_column("component")
    t.add_column("params", justify="right")
    t.add_column("share", justify="right")
    total = r["params"]["total"]
    for k in ("embedding", "attention", "ffn", "norm", "head"):
        t.add_row(k, f"{r['params'][k]:,}", f"{100 * r['params'][k] / total:.1f}%")
    t.add_row("[bold]total[/bold]", f"[bold]{total:,}[/bold]", "100%")
    t.add_row("non-embedding", f"{r['non_embedding_params']:,}", f"{100 * r['non_embedding_params'] / total:.1f}%")
    print_table(t)
    vb = r["vs_baseline"]
    changed = [f"{k}={v}" for k, v in r["axes"].items() if vb["baseline_axes"].get(k) != v]
    say(f"vs baseline (every axis at its default{'' if not changed else '; this variant: ' + ', '.join(changed)}): "
        f"[bold]{vb['delta']:+,}[/bold] params ({vb['delta_pct']:+.2f}%)")
    if "built_params" in r:
        say(f"--build: a model built on the meta device has {r['built_params']['total']:,} "
            "parameters, equal to the analytic count in every component")
    if s["tied"]:
        say("embedding includes the output head (tied); learned positions are counted in embedding")
    say(f"vocab: {escape(r['vocab']['note'])}")
    say(f"FFN: {escape(r['ffn']['why'])}")
    say(f"FLOPs/token (training, seq_len {r['seq_len']}): [bold]{r['flops_per_token']:,}[/bold] "
        f"= {escape(r['flops_formula'])}")
    say(f"KV cache ({r['dtype']}): [bold]{r['kv_cache_bytes_per_token']:,} bytes/token[/bold] "
        f"= {r['kv_cache_formula']}; for seq_len {r['seq_len']} x batch {r['batch']}: "
        f"{r['kv_cache_bytes']:,} bytes ({human_bytes(r['kv_cache_bytes'])})")
    _print_parametrization(r["parametrization"], say)
    if "optimizer" in r:
        _print_optimizer(r["optimizer"], say)


def _print_parametrization(p: dict, say) -> None:
    """The param axis: its base shape and multipliers, and under mup / completep a table of rules."""
    from rich.table import Table

    from ablate.terminal import print_table

    say(f"parametrization [bold]{p['param']}[/bold]: base width {p['base_width']}, base depth "
        f"{p['base_depth']}; width x{p['width_mult']:.4g}, depth x{p['depth_mult']:.4g}; logits "
        f"x{p['logit_mult']:.4g}, attention scale {p['attn_scale']:.4g}, residual branches "
        f"x{p['branch_mult']:.4g}, AdamW eps {p['adam_eps']:.3g}"
        + ("" if p["rules"] else "; every parameter at the base LR and init (docs/parametrization.md)"))
    if not p["rules"]:
        return
    t = Table(title=f"param={p['param']}: init and LR by parameter role")
    for col, right in (("role", False), ("tensors", True), ("params", True), ("fan-in (base)", True),
                       ("init std", True), ("LR x", True), ("decay x", True)):
        t.add_column(col, justify="right" if right else "left")
    for row in p["rules"]:
        fan = "-" if row["fan_in"] is None else f"{row['fan_in']} ({row['base_fan_in']})"
        std = "-" if row["init_std"] is None else f"{row['init_std']:.4g}"
        t.add_row(row["role"], str(row["tensors"]), f"{row['params']:,}", fan, std,
                  f"{row['lr_mult']:.4g}", f"{row['weight_decay_mult']:.4g}")
    print_table(t)


def _print_optimizer(o: dict, say) -> None:
    """optim=muon: each parameter's matrices, the optimizer, the orthogonalized shape, the LR."""
    from rich.markup import escape
    from rich.table import Table

    from ablate.terminal import print_table

    adam = f"; AdamW part at optim.adam_lr {o['adam_lr']:g}" if o["adam_lr"] is not None else ""
    say(f"optimizer [bold]{o['optim']}[/bold] (optim.adjust={o['adjust']}): Muon on each logical matrix, "
        f"AdamW on the rest; LRs at train.lr {o['train_lr']:g}{adam}, before the schedule")
    t = Table(title="the matrices each optimizer updates (layers with the same rows: one row)")
    for col, right in (("parameter", False), ("matrix", False), ("optimizer", False), ("shape", True),
                       ("LR", True), ("layers", True)):
        t.add_column(col, justify="right" if right else "left")
    for m in o["matrices"]:
        t.add_row(escape(m["parameter"]), m["matrix"] or "-", m["optimizer"], " x ".join(map(str, m["shape"])),
                  f"{m['effective_lr']:.4g}", str(m["layers"]))
    print_table(t)


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
