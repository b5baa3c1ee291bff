"""The comparison's columns, written once: every output format renders this list (the rich
table, markdown, LaTeX and the narrow-terminal blocks show `head`/`cell`; csv writes `fields`,
the raw values of Row.as_dict(); --json writes every key).

Adding a statistic: compute it where the rows are built (ablate/analysis/compare.py: a field
of Row, or of Versus for a per-reference test, and its key in as_dict), then add one Column
here: its header, how its cell reads, the raw fields csv carries, and in which formats it shows
(`formats`; `study=True`: only when a study's rungs are compared).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ablate.analysis.stats import ALPHA, SEEDS_NEEDED_LIMIT

PLAIN, RICH = "plain", "rich"  # markdown/LaTeX/blocks; the rich table


@dataclass(frozen=True)
class Ctx:
    metric: str
    alpha: float = ALPHA

    @property
    def ci(self) -> str:
        return f"{100 * (1 - self.alpha):g}% CI"


@dataclass(frozen=True)
class Column:
    head: Callable[[Ctx], str]
    cell: Callable[[Any], str]  # plain text of a row's cell
    fields: tuple = ()  # the csv fields this column stands for
    formats: frozenset = frozenset({PLAIN, RICH})
    rich_head: Optional[Callable[[Ctx], str]] = None  # the rich table's header, if another
    rich_cell: Optional[Callable[[Any], str]] = None  # rich markup, if more than the plain text
    rich: dict = field(default_factory=dict)  # rich column options
    text: bool = False  # left-aligned (words), else right-aligned (numbers)
    study: bool = False  # only with a study's rungs


def num(v: Optional[float], spec: str, default: str = "-") -> str:
    return default if v is None else format(v, spec)


def pct(v: Optional[float]) -> str:
    return "" if v is None else f" ({v:+.2f}%)"


VERDICT_WORDS = {"better": "yes, better", "worse": "yes, worse", "noise": "no"}
VERDICT_COLORS = {"better": "green", "worse": "red"}
STATUS_COLORS = {"completed": "green", "diverged": "yellow", "failed": "red", "killed": "red",
                 "interrupted": "magenta", "preempted": "magenta", "running": "cyan"}


def variant_name(r) -> str:
    return r.variant + (" (baseline)" if r.baseline and r.variant != "baseline" else "")


def seeds(r) -> str:
    return f"{r.n}" + (f" of {r.runs}" if r.runs != r.n else "")


def mean_std(r) -> str:
    return "-" if r.mean is None else f"{r.mean:.4f}" + (f" ± {r.std:.4f}" if r.std is not None else "")


def speed(r) -> str:
    """The median of the seeds' tokens/s; `~` before it: the seeds' figures disagree (a note says why)."""
    return ("~" if r.tokens_per_s_unsteady else "") + num(r.tokens_per_s, ",.0f")


def status(r) -> str:
    return "ok" if list(r.status) == ["completed"] else ", ".join(f"{n} {st}" for st, n in r.status.items())


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


def rich_variant(r) -> str:
    return _escape(r.variant) + (" [dim](baseline)[/dim]" if r.baseline and r.variant != "baseline" else "")


def rich_params(r) -> str:
    cell = "-" if r.params is None else f"{r.params:,}"
    if r.params_delta:
        color = "yellow" if r.size_differs else "dim"
        cell += f" [{color}]({r.params_delta_pct:+.2f}%)[/{color}]"
    return cell


def rich_delta(r, prev: bool = False) -> str:
    v = _vs(r, prev)
    if _skip(r, prev):
        return ""
    if v.delta is None:
        return "-"
    return f"{v.delta:+.4f}" + pct(v.delta_pct) + (f"\n[dim]{ci(r, prev)}[/dim]" if v.test.ci_low is not None else "")


def rich_test(r, prev: bool = False) -> str:
    v = _vs(r, prev)
    if _skip(r, prev):
        return ""
    t = v.test
    if t.test is None:
        return "[dim]no test (needs ≥2 seeds each)[/dim]" if v.delta is not None else "-"
    color = VERDICT_COLORS.get(v.verdict, "dim")
    name = t.test + (" on seeds " + ",".join(map(str, t.test_seeds))
                     if t.test == "paired t" and len(t.test_seeds) < r.n else "")  # a seed missing on the other side
    few = f" [yellow]only {len(t.test_seeds)} seeds[/yellow]" if v.few_seeds else ""
    return (f"[{color}]{VERDICT_WORDS[v.verdict]}[/{color}] ({name}, p={t.p_value:.3g}, "
            f"Holm p={v.p_holm:.3g})" + few)


def rich_speed(r) -> str:
    return "[yellow]~[/yellow]" + speed(r)[1:] if r.tokens_per_s_unsteady else speed(r)


def rich_status(r) -> str:
    if list(r.status) == ["completed"]:
        return "[green]ok[/green]"
    return ", ".join(f"[{STATUS_COLORS.get(st, 'yellow')}]{n} {_escape(st)}[/{STATUS_COLORS.get(st, 'yellow')}]"
                     for st, n in r.status.items())


RIGHT = {"justify": "right", "overflow": "fold"}
FOLD = {"overflow": "fold"}
ONLY_PLAIN, ONLY_RICH = frozenset({PLAIN}), frozenset({RICH})

COLUMNS: list[Column] = [
    Column(lambda c: "variant", variant_name, ("variant", "baseline", "metric"), text=True,
           rich_cell=rich_variant, rich={"style": "bold", "no_wrap": True}),
    Column(lambda c: "seeds", seeds, ("n", "runs"), rich=RIGHT),
    Column(lambda c: "params", lambda r: num(r.params, ",") + (f" ({r.params_delta_pct:+.2f}%)" if r.params_delta else ""),
           rich_cell=rich_params, rich=RIGHT),  # its raw fields: the csv-only column below
    Column(lambda c: f"{c.metric} (mean ± std)", mean_std, ("mean", "std"), rich_head=lambda c: c.metric, rich=RIGHT),
    Column(lambda c: "Δ vs baseline", delta, ("delta", "delta_pct"), rich_head=lambda c: f"Δ vs baseline [{c.ci}]",
           rich_cell=rich_delta, rich=RIGHT),
    Column(lambda c: f"{c.ci} of Δ", ci, ("test", "test_delta", "ci_low", "ci_high"), formats=ONLY_PLAIN),
    Column(lambda c: "p (Holm)", p_holm, ("t", "df", "p_value", "p_holm"), formats=ONLY_PLAIN),
    Column(lambda c: "beyond seed noise?", word, ("verdict",), text=True,
           rich_head=lambda c: f"beyond seed noise? (Holm p<{c.alpha:g})", rich_cell=rich_test, rich=FOLD),
    Column(lambda c: "effect (Δ/σ)", effect, ("effect",), rich=RIGHT),
    Column(lambda c: "seeds needed", needed, ("seeds_needed", "seeds_needed_alpha", "few_seeds"),
           rich_head=lambda c: f"seeds needed (80% power, Holm p<{c.alpha:g})", rich=RIGHT),
    Column(lambda c: "", lambda r: "", ("params", "params_delta", "params_delta_pct", "size_differs",
                                        "flops_per_token"), formats=frozenset()),  # csv only
    Column(lambda c: "Δ vs previous rung", lambda r: delta(r, True), ("prev", "delta_prev"), study=True,
           rich_head=lambda c: f"Δ vs previous rung [{c.ci}]", rich_cell=lambda r: rich_delta(r, True), rich=RIGHT),
    Column(lambda c: c.ci, lambda r: ci(r, True), ("ci_low_prev", "ci_high_prev"), formats=ONLY_PLAIN, study=True),
    Column(lambda c: "p (Holm)", lambda r: p_holm(r, True), ("p_prev", "p_holm_prev"), formats=ONLY_PLAIN, study=True),
    Column(lambda c: "step beyond seed noise?", lambda r: word(r, True), ("verdict_prev", "seeds_needed_prev"),
           text=True, study=True, rich_cell=lambda r: rich_test(r, True), rich=FOLD),
    Column(lambda c: "tokens/s", speed, ("tokens_per_s", "tokens_per_s_unsteady"), rich_cell=rich_speed, rich=RIGHT),
    Column(lambda c: "status", status, ("status",), text=True, rich_cell=rich_status, rich=FOLD),
]

# --per-seed: one row per run (a dict of compare.per_seed_rows).
PER_SEED: list[Column] = [
    Column(lambda c: "variant", lambda r: r["variant"] + (" (baseline)" if r["baseline"] and r["variant"] != "baseline" else ""),
           ("variant", "baseline"), text=True, rich={"style": "bold", "no_wrap": True}),
    Column(lambda c: "seed", lambda r: str(r["seed"]), ("seed",), rich=RIGHT),
    Column(lambda c: "status", lambda r: r["status"], ("status",), text=True, rich=RIGHT),
    Column(lambda c: c.metric, lambda r: num(r["value"], ".4f"), ("metric", "value"), rich=RIGHT),
    Column(lambda c: "Δ vs baseline (same seed)", lambda r: "" if r["baseline"] else num(r["delta"], "+.4f"),
           ("delta",), rich=RIGHT),
    Column(lambda c: "params", lambda r: num(r["params"], ",.0f"), ("params",), rich=RIGHT),
    Column(lambda c: "tokens/s", lambda r: num(r["tokens_per_s"], ",.0f"), ("tokens_per_s",), rich=RIGHT),
    Column(lambda c: "run dir", lambda r: r["dir"], ("dir",), text=True, rich=FOLD),
]


def shown(columns: list[Column], fmt: str, study: bool) -> list[Column]:
    return [c for c in columns if fmt in c.formats and (study or not c.study)]
