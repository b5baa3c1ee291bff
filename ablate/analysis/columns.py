"""The comparison's columns, written once on the one table model (ablate/tables/table.py):
every format renders them (render.py). Markdown, LaTeX and the one-field-per-line blocks show
`head`/`cell`; the terminal table `term_head`/`markup`, a narrow terminal `short`/`compact`;
csv writes `fields`, --json every key of Row.as_dict().

Adding a statistic: compute it where the rows are built (ablate/analysis/compare.py: a field
of Row, or of Versus for a per-reference test, and its key in as_dict), then add one Column
here: its header, how its cell reads, the raw fields csv carries, where it shows and how early a
narrow terminal leaves it out (`priority`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any, Optional

from ablate.analysis.stats import SEEDS_NEEDED_LIMIT
from ablate.tables.table import ONLY_TEXT, Align, Column, Field, Table, lines, num
from ablate.names import TOKENS_PER_S, Status

VERDICT_WORDS = {"better": "yes, better", "worse": "yes, worse", "noise": "no"}
VERDICT_COLORS = {"better": "green", "worse": "red"}


@dataclass(frozen=True)
class Ctx:
    metric: str
    alpha: float
    routed: bool = False  # some variant routes its tokens (an MoE): the active parameters get a column

    @property
    def ci(self) -> str:
        return f"{100 * (1 - self.alpha):g}% CI"


def pct(v: Optional[float]) -> str:
    return "" if v is None else f" ({v:+.2f}%)"


COLLAPSED = "routing collapsed"  # the mark of a variant whose router collapsed (compare.routing_collapsed)


def variant_name(r) -> str:
    return (r.variant + (" (baseline)" if r.baseline and r.variant != "baseline" else "")
            + (f" ({COLLAPSED})" if getattr(r, "collapsed", None) else ""))


def seeds(r) -> str:
    return f"{r.n}" + (f" of {r.runs}" if r.runs != r.n else "")


def mean_std(r, sep: str = " ") -> str:
    return "-" if r.mean is None else f"{r.mean:.4f}" + (f"{sep}± {r.std:.4f}" if r.std is not None else "")


def params(r) -> str:
    return num(r.params, ",") + (f" ({r.params_delta_pct:+.2f}%)" if r.params_delta else "")


def speed(r) -> str:
    """The median of the seeds' tokens/s; `~` before it: the seeds' figures disagree (a note says why)."""
    return ("~" if r.tokens_per_s_unsteady else "") + num(r.tokens_per_s, ",.0f")


def _ok(r) -> bool:
    return list(r.status) == [Status.COMPLETED]


def status(r) -> str:
    return "ok" if _ok(r) else ", ".join(f"{n} {st}" for st, n in r.status.items())


# ---- a test against a reference: the baseline (vs) or the previous rung (vs_prev) -------------
def _skip(r, prev: bool) -> bool:
    return r.prev is None if prev else r.baseline


def _vs(r, prev: bool):
    return r.vs_prev if prev else r.vs


def delta(r, prev: bool = False) -> str:
    v = _vs(r, prev)
    return "" if _skip(r, prev) else num(v.delta, "+.4f") + pct(v.delta_pct)


def ci(r, prev: bool = False) -> str:
    t = _vs(r, prev).test
    if _skip(r, prev):
        return ""
    return "-" if t.ci_low is None else f"[{t.ci_low:+.4f}, {t.ci_high:+.4f}]"


def p_holm(r, prev: bool = False) -> str:
    v = _vs(r, prev)
    if _skip(r, prev):
        return ""
    return "-" if v.test.p_value is None else f"{v.test.p_value:.3g} ({v.p_holm:.3g})"


def word(r, prev: bool = False) -> str:
    v = _vs(r, prev)
    if _skip(r, prev):
        return ""
    if v.verdict is None:
        return "no test" if v.delta is not None else "-"
    return VERDICT_WORDS[v.verdict] + (f" ({len(v.test.test_seeds)} seeds)" if v.few_seeds else "")


def effect(r) -> str:
    e = r.vs.test.effect
    if r.baseline:
        return ""
    if e is None:
        return "-"
    return f"{'+' if e > 0 else '-'}inf σ" if math.isinf(e) else f"{e:+.2f}σ"


def needed(r) -> str:
    t = r.vs.test
    if r.baseline:
        return ""
    if t.seeds_needed is not None:
        return str(t.seeds_needed)
    if t.test is None:
        return "-"
    return "∞" if t.effect == 0 else f">{SEEDS_NEEDED_LIMIT}"


# ---- rich markup of the cells that hold more than their plain text ----------------------------
def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def rich_variant(r, sep: str = " ") -> str:
    return (_escape(r.variant) + (f"{sep}[dim](baseline)[/dim]" if r.baseline and r.variant != "baseline" else "")
            + (f"{sep}[red]({COLLAPSED})[/red]" if getattr(r, "collapsed", None) else ""))


def active(r) -> str:
    return num(r.active_params, ",") + (f" ({r.active_delta_pct:+.2f}%)" if r.active_delta else "")


def _rich_count(r, count: Optional[int], delta: Optional[int], pct: Optional[float], sep: str) -> str:
    """A parameter count with its % difference from the baseline, yellow when it is too large."""
    cell = num(count, ",")
    if delta:
        color = "yellow" if r.size_differs else "dim"
        cell += f"{sep}[{color}]({pct:+.2f}%)[/{color}]"
    return cell


def rich_active(r, sep: str = " ") -> str:
    return _rich_count(r, r.active_params, r.active_delta, r.active_delta_pct, sep)


def rich_params(r, sep: str = " ") -> str:
    return _rich_count(r, r.params, r.params_delta, r.params_delta_pct, sep)


def rich_delta(r, prev: bool = False) -> str:
    """The Δ, its CI on the line below."""
    v = _vs(r, prev)
    if _skip(r, prev):
        return ""
    if v.delta is None:
        return "-"
    return f"{v.delta:+.4f}" + pct(v.delta_pct) + (f"\n[dim]{ci(r, prev)}[/dim]" if v.test.ci_low is not None else "")


def rich_test(r, prev: bool = False, compact: bool = False) -> str:
    """The verdict, the test, its p and Holm p: on one line, or (compact) one a line."""
    v, sep = _vs(r, prev), "\n" if compact else " "
    if _skip(r, prev):
        return ""
    t = v.test
    if t.test is None:
        return f"[dim]no test{sep}(needs ≥2 seeds each)[/dim]" if v.delta is not None else "-"
    color = VERDICT_COLORS.get(v.verdict, "dim")
    said = f"[{color}]{VERDICT_WORDS[v.verdict]}[/{color}]"
    name = t.test + (" on seeds " + ",".join(map(str, t.test_seeds))
                     if t.test == "paired t" and len(t.test_seeds) < r.n else "")  # a seed missing on the other side
    details = [name, f"p={t.p_value:.3g}", f"Holm p={v.p_holm:.3g}"]
    few = f"[yellow]only {len(t.test_seeds)} seeds[/yellow]" if v.few_seeds else None
    if compact:
        return lines(said, *details, few)
    return f"{said} ({', '.join(details)})" + (f" {few}" if few else "")


def rich_speed(r) -> str:
    return "[yellow]~[/yellow]" + speed(r)[1:] if r.tokens_per_s_unsteady else speed(r)


def _status_color(status: str) -> str:
    try:
        return Status(status).color
    except ValueError:  # "no val_loss", a status this version does not know
        return "yellow"


def rich_status(r, sep: str = ", ") -> str:
    if _ok(r):
        return f"[{Status.COMPLETED.color}]ok[/{Status.COMPLETED.color}]"
    return sep.join(f"[{_status_color(st)}]{n} {_escape(st)}[/{_status_color(st)}]" for st, n in r.status.items())


# ---- the tables ---------------------------------------------------------------------------------
def _versus_columns(ctx: Ctx, prev: bool) -> list[Column]:
    """The Δ against a reference, its CI and p (Holm), and whether it is beyond seed noise:
    against the baseline, or (`prev`) a study's step from the rung before."""
    suffix, rank = ("_prev", 1) if prev else ("", 0)
    versus, priority = ("previous rung", 1) if prev else ("baseline", 0)
    cols = [
        Column(f"Δ vs {versus}", partial(delta, prev=prev), ("prev", "delta_prev") if prev else ("delta", "delta_pct"),
               term_head=f"Δ vs {versus} [{ctx.ci}]", short=f"Δ vs {versus}\n[{ctx.ci}]",
               markup=partial(rich_delta, prev=prev), priority=priority, csv_rank=rank),
        Column(ctx.ci if prev else f"{ctx.ci} of Δ", partial(ci, prev=prev),
               ("ci_low_prev", "ci_high_prev") if prev else ("test", "test_delta", "ci_low", "ci_high"),
               targets=ONLY_TEXT, csv_rank=rank),
        Column("p (Holm)", partial(p_holm, prev=prev), ("p_prev", "p_holm_prev") if prev else ("t", "df", "p_value", "p_holm"),
               targets=ONLY_TEXT, csv_rank=rank)]
    step = "step beyond seed noise?" if prev else "beyond seed noise?"
    cols.append(Column(step, partial(word, prev=prev), ("verdict_prev", "seeds_needed_prev") if prev else ("verdict",),
                       term_head=step if prev else f"{step} (Holm p<{ctx.alpha:g})",
                       short=("step beyond\nnoise?" if prev else "beyond noise?") + f"\nHolm p<{ctx.alpha:g}",
                       markup=partial(rich_test, prev=prev), compact=partial(rich_test, prev=prev, compact=True),
                       align=Align.LEFT, priority=priority, csv_rank=rank))
    return cols


def variant_columns(ctx: Ctx, study: bool) -> list[Column]:
    """One row per variant: the baseline first (a study: its rungs in ladder order)."""
    head = [
        Column("variant", variant_name, ("variant", "baseline", "metric"), markup=rich_variant,
               compact=partial(rich_variant, sep="\n"), align=Align.LEFT),
        Column("seeds", seeds, ("n", "runs"), priority=2),
        Column("params", params, markup=rich_params, compact=partial(rich_params, sep="\n"), priority=3)]
    if ctx.routed:  # what an MoE is judged by: the parameters a token uses
        head.append(Column("active params", active, ("active_params", "active_delta", "active_delta_pct"),
                           markup=rich_active, compact=partial(rich_active, sep="\n"), short="active\nparams",
                           priority=3))
    head += [
        Column(f"{ctx.metric} (mean ± std)", mean_std, ("mean", "std"), term_head=ctx.metric,
               compact=partial(mean_std, sep="\n"))]
    tail = [
        Column("effect (Δ/σ)", effect, ("effect",), short="Δ/σ", priority=4),
        Column("seeds needed", needed, ("seeds_needed", "seeds_needed_alpha", "few_seeds"),
               term_head=f"seeds needed (80% power, Holm p<{ctx.alpha:g})", short="seeds\nneeded", priority=4),
        Column("", lambda r: "", ("params", "params_delta", "params_delta_pct", "size_differs", "flops_per_token"),
               targets=frozenset())]  # csv only: the params column's raw fields
    tail += _versus_columns(ctx, prev=True) if study else []
    tail += [
        # what attn=gqa/mqa are chosen for, beside their loss; the first a narrow terminal drops
        Column("KV cache bytes/token", lambda r: num(r.kv_cache_bytes_per_token, ","), ("kv_cache_bytes_per_token",),
               short="KV cache\nbytes/token", priority=6),
        Column("tokens/s", speed, (TOKENS_PER_S, "tokens_per_s_unsteady"), short="tok/s", markup=rich_speed, priority=5),
        Column("status", status, (Field("status", lambda r: ";".join(f"{n} {st}" for st, n in r.status.items())),),
               markup=rich_status, compact=partial(rich_status, sep="\n"), align=Align.LEFT, priority=2)]
    return head + _versus_columns(ctx, prev=False) + tail


def seed_columns(ctx: Ctx) -> list[Column]:
    """--per-seed: one row per run (compare.SeedRow)."""
    return [
        Column("variant", variant_name, ("variant", "baseline"), align=Align.LEFT),
        Column("seed", lambda r: str(r.seed), ("seed",)),
        Column("status", lambda r: r.status, ("status",), align=Align.LEFT, priority=1),
        Column(ctx.metric, lambda r: num(r.value, ".4f"), ("metric", "value")),
        Column("Δ vs baseline (same seed)", lambda r: "" if r.baseline else num(r.delta, "+.4f"), ("delta",),
               short="Δ vs baseline\n(same seed)"),
        Column("params", lambda r: num(r.params, ",.0f"), ("params",), priority=3),
        Column("tokens/s", lambda r: num(r.tokens_per_s, ",.0f"), (TOKENS_PER_S,), short="tok/s", priority=4),
        Column("run dir", lambda r: r.dir, ("dir",), align=Align.LEFT, priority=2),
    ]


def comparison_table(cmp: Any, per_seed: bool = False) -> Table:
    """A Comparison (ablate/analysis/compare.py) as a Table: one row per variant, or per run."""
    from ablate.analysis.comparable import describe_mixed
    from ablate.analysis.compare import per_seed_rows

    ctx = Ctx(cmp.metric, cmp.alpha, any(r.routed for r in cmp))
    if per_seed:
        title, columns, rows = f"ablate compare: final {cmp.metric}, one row per run", seed_columns(ctx), per_seed_rows(cmp)
    else:
        title = f"ablate compare: final {cmp.metric} (mean ± std over seeds)" + (
            "; study: rungs in ladder order, each step vs the previous rung" if cmp.study else "")
        columns, rows = variant_columns(ctx, cmp.study), list(cmp)
    warning = (f"MIXED (--allow-mixed): the runs also differ in {describe_mixed(cmp.mixed)}; "
               "a delta here is not the effect of the variant alone") if cmp.mixed else None
    head = [f"baseline: {cmp.baseline} ({cmp.baseline_reason})"] if cmp.baseline else []
    return Table(title, columns, rows, head, warning, list(cmp.notes))


COMPARE_HINT = "ablate compare --wide shows every column"  # what a narrow terminal's note says


def print_comparison(cmp: Any, console: Any = None, per_seed: bool = False, wide: bool = False) -> None:
    """`ablate compare`'s table of a Comparison (one line per variant, or per run)."""
    from ablate.tables.render import print_table

    print_table(comparison_table(cmp, per_seed), console, wide, COMPARE_HINT)
