"""Console output of a finished run: one readable table."""

from __future__ import annotations

from pathlib import Path


def _fmt(v, spec=".4f"):
    if v is None:
        return "-"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def print_summary(summary: dict, run_dir: Path) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    status = summary.get("status", "?")
    color = {"completed": "green", "diverged": "yellow", "failed": "red"}.get(status, "magenta")
    # escape: overrides such as data.paths=[a.txt] look like markup tags to rich
    t = Table(title=escape(f"ablate run: {summary.get('variant', '')} (seed {summary.get('seed')})"),
              show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    t.add_row("status", f"[{color}]{status}[/{color}]" + escape((f" ({summary['reason']})" if summary.get("reason") else "")
                                                     + (f" ({summary['error']})" if summary.get("error") else "")))
    t.add_row("axes", " ".join(f"{k}={v}" for k, v in summary.get("axes", {}).items()))
    if "params" in summary:
        t.add_row("params", f"{summary['params']:,} ({summary.get('non_embedding_params', 0):,} non-embedding)")
        t.add_row("FLOPs/token", f"{summary.get('flops_per_token', 0):,}")
    if "step" in summary:
        t.add_row("steps", f"{summary['step']}/{summary.get('steps')} ({summary.get('tokens', 0):,} tokens)")
    t.add_row("train_loss", _fmt(summary.get("train_loss")))
    t.add_row("val_loss", _fmt(summary.get("val_loss")))
    t.add_row("val_bpb", _fmt(summary.get("val_bpb")))
    if summary.get("tokens_per_s"):
        t.add_row("tokens/s", f"{summary['tokens_per_s']:,.0f} on {summary.get('device', '?')} ({summary.get('precision', '')})")
    if summary.get("time_to_first_step_s") is not None:
        t.add_row("first step after", f"{summary['time_to_first_step_s']:.2f} s")
    t.add_row("wall time", f"{summary.get('wall_time_s', 0):.1f} s")
    t.add_row("run dir", str(run_dir))
    Console(stderr=False).print(t)
