"""The tables of `ablate bench`: its results (the `--json` dicts of ablate/measure/bench.py and
decode_bench.py, unchanged by this module) as typed rows and the Columns of the one table model
(ablate/tables/table.py), which ablate/tables/render.py prints at any terminal width and in a pipe.
Torch-free: a result is plain numbers.

A figure whose rounds disagree (ablate/measure/rounds.py: the median's interval wider than
±SPREAD_LIMIT) is marked with MARK and a note says what that means; a ratio's rounds are its
per-round ratios (`round_ratios`), a single model's are its round times (`bench --decode`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from ablate.measure.rounds import COVERAGE, MARK, SPREAD_LIMIT, disagree, marked, shown, spread
from ablate.names import MFU, TOKENS_PER_S
from ablate.tables.table import Align, Column, JsonRow, Table, num
from ablate.terminal import human_bytes

HINT = "--json has every figure"  # what a narrow terminal's note says of the columns it leaves out


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


def _bytes(n: Optional[float]) -> str:
    return "-" if n is None else human_bytes(n)


def disagree_note(what: str) -> str:
    return (f"{MARK}: {what} disagree (the median's {COVERAGE:.0%} interval is wider than ±{SPREAD_LIMIT:.0%} of it): "
            "the machine's load changed while it was timed, so the figure is as much noise as result; "
            "rerun on a quieter machine, or with --clock cpu and train.threads=1")


def _errors(rows: list) -> list[str]:
    return [f"{r.variant}: n/a: {r.error}" for r in rows if r.error]


# ---- `ablate bench` (and --reference) ----------------------------------------------------------
@dataclass
class SpeedRow(JsonRow):
    """One contender of `ablate bench`: ours, or the plain-PyTorch reference."""

    name: str
    tokens_per_s: float
    step_ms: float
    mfu: Optional[float]
    params: int
    peak_memory_bytes: Optional[int]

    @classmethod
    def of(cls, name: str, r: dict) -> "SpeedRow":
        return cls(name, r[TOKENS_PER_S], r["step_ms"], r[MFU], r["params"], r["peak_memory_bytes"])


SPEED_COLUMNS: list[Column] = [
    Column("", lambda x: x.name, align=Align.LEFT),
    Column("tokens/s", lambda x: f"{x.tokens_per_s:,.0f}", (TOKENS_PER_S,)),
    Column("ms/step", lambda x: f"{x.step_ms:.1f}", ("step_ms",)),
    Column("MFU", lambda x: _pct(x.mfu), (MFU,)),
    Column("params", lambda x: f"{x.params:,}", ("params",)),
    Column("peak memory", lambda x: _gb(x.peak_memory_bytes), ("peak_memory_bytes",), short="peak\nmemory"),
]


def bench_table(r: dict) -> Table:
    """`ablate bench` (ablate.measure.bench.bench's result)."""
    ref = r.get("reference")
    rows = [SpeedRow.of("ablate", r)] + ([SpeedRow.of("reference (plain PyTorch GPT)", ref)] if ref else [])
    foot = [f"{r['device']}, {r['precision']}, compile={'on' if r['compile'] else 'off'}, batch "
            f"{r['batch_size']} x seq {r['seq_len']} x accum {r['grad_accum']} = {r['tokens_per_step']} "
            f"tokens/step, {r['steps']} timed steps in {r['rounds']} rounds after {r['warmup']} warm-up, "
            f"{r['clock']} clock",
            f"model FLOPs/token: {_flops(r['flops_per_token'])} (6N + 12·L·d·T); achieved "
            f"{_flops(r['achieved_flops'])}/s",
            f"peak: {r['peak_flops_source']}", f"peak memory: {r['peak_memory_kind']}"]
    notes = []
    if ref:
        s = spread(r["round_ratios"])
        rounds, ratio = ", ".join(f"{x:.3f}" for x in r["round_ratios"]), marked(f"{r['ratio']:.3f}", s.relative)
        foot.append(f"ratio ablate / reference tokens/s: {ratio} (median of "
                    f"alternating rounds: {rounds}; best round vs best round: {r['ratio_best']:.3f})")
        notes += [disagree_note("the ratio's rounds")] if s.disagrees else []
        if ref["differs_on"]:
            notes.append(f"the reference is GPT-2; this model differs on {', '.join(ref['differs_on'])}, so the "
                         "ratio compares architectures, not implementations")
    finite = r["loss_finite"] and (not ref or ref["loss_finite"])
    return Table("ablate bench", SPEED_COLUMNS, rows, warning=None if finite else
                 "warning: a non-finite loss during the benchmark", notes=notes, foot=foot)


# ---- options against the baseline: `--axes`, `--vs` (training and decode) ----------------------
@dataclass
class VersusRow(JsonRow):
    """An option timed against the baseline in alternating rounds (the baseline's own row: its
    ratios are 1). decode: a row per batch size (`batch`)."""

    variant: str
    params: Optional[int] = None
    tokens_per_s: Optional[float] = None
    baseline_tokens_per_s: Optional[float] = None
    ratio: Optional[float] = None
    ratio_best: Optional[float] = None
    ratio_spread: Optional[float] = None  # of the per-round ratios (rounds.py)
    flops_ratio: Optional[float] = None
    efficiency: Optional[float] = None
    batch: Optional[int] = None
    kv_cache_bytes_per_token: Optional[int] = None
    kv_cache_ratio: Optional[float] = None
    prefill_ratio: Optional[float] = None
    error: Optional[str] = None  # an option that cannot combine with these dims: n/a
    baseline: bool = False
    active_params: Optional[int] = None  # the parameters a token uses (an MoE's k experts)


def _ratio_spread(row: dict) -> Optional[float]:
    if "ratio_spread" in row:  # --decode records it
        return row["ratio_spread"]
    return spread(row["round_ratios"]).relative if row.get("round_ratios") else None


def _f(spec: str, get: Callable[[VersusRow], Optional[float]]) -> Callable[[VersusRow], str]:
    return lambda x: num(get(x), spec)


def _ratio_cell(x: VersusRow) -> str:
    if x.error:
        return "n/a"
    return marked(num(x.ratio, ".3f"), x.ratio_spread)


def _versus_notes(rows: list[VersusRow]) -> list[str]:
    return ([disagree_note("its rounds (the per-round ratios)")] if any(disagree(x.ratio_spread) for x in rows)
            else []) + _errors(rows)


def variants_table(r: dict) -> Table:
    """`ablate bench --axes/--vs` (ablate.measure.bench.bench_variants's result)."""
    base = VersusRow("baseline", r["baseline"]["params"], ratio=1.0, ratio_best=1.0, flops_ratio=1.0,
                     efficiency=1.0, baseline=True, active_params=r["baseline"].get("active_params"))
    rows = [base] + [VersusRow(x["variant"], error=x["error"]) if "error" in x else VersusRow(
        x["variant"], x["params"], x[TOKENS_PER_S], x["baseline_tokens_per_s"], x["ratio"], x["ratio_best"],
        _ratio_spread(x), x["flops_ratio"], x["efficiency"], active_params=x.get("active_params")) for x in r["rows"]]
    # an MoE among the rows (`--moe`): the parameters a token uses beside the total
    routed = any(x.active_params not in (None, x.params) for x in rows)
    columns = [
        Column("variant", lambda x: x.variant, ("variant",), align=Align.LEFT),
        Column("params", lambda x: num(x.params, ","), ("params",)),
        *([Column("active params", lambda x: num(x.active_params, ","), ("active_params",), short="active\nparams",
                  priority=2)] if routed else []),
        Column("tokens/s", lambda x: "" if x.baseline else num(x.tokens_per_s, ",.0f"), (TOKENS_PER_S,)),
        Column("baseline tokens/s", lambda x: "" if x.baseline else num(x.baseline_tokens_per_s, ",.0f"),
               ("baseline_tokens_per_s",), short="baseline\ntokens/s", priority=2),
        Column("ratio", _ratio_cell, ("ratio",)),
        Column("best-round ratio", _f(".3f", lambda x: x.ratio_best), ("ratio_best",), short="best-round\nratio",
               priority=3),
        Column("FLOPs ratio", _f(".3f", lambda x: x.flops_ratio), ("flops_ratio",), short="FLOPs\nratio"),
        Column("efficiency", _f(".3f", lambda x: x.efficiency), ("efficiency",), priority=1),
    ]
    fell = [x for x in r["rows"] if x.get("compile_fallback")]
    warning = None
    if fell:  # dynamo gave up compiling while these were timed: their ratios compare eager code
        warning = (f"warning: torch.compile fell back to eager while timing "
                   f"{', '.join(x['variant'] for x in fell)} ({fell[0]['compile_fallback_reason']})")
    foot = [f"{r['device']}; {r['clock']} clock; {r['tokens_per_step']} tokens/step; {r['rounds']} alternating "
            f"rounds of {r['steps_per_round']} steps; ratio = median per-round variant/baseline; FLOPs ratio = "
            "baseline/variant FLOPs per token, the ratio at equal MFU; efficiency = ratio / FLOPs ratio"]
    return Table(f"tokens/s of each option vs the baseline ({_base(r)})", columns, rows, warning=warning,
                 notes=_versus_notes(rows), foot=foot)


def _base(r: dict) -> str:
    return " ".join(r["baseline"]["overrides"]) or "defaults"


def decode_variants_table(r: dict) -> Table:
    """`ablate bench --decode --axes/--vs` (decode_bench.bench_decode_variants's result)."""
    rows = [VersusRow(x["variant"], error=x["error"]) if "error" in x else VersusRow(
        x["variant"], x["params"], x["decode_tokens_per_s_aggregate"],
        x["baseline"]["decode_tokens_per_s_aggregate"], x["ratio"], x["ratio_best"], _ratio_spread(x),
        batch=x["batch"], kv_cache_bytes_per_token=x["kv_cache_bytes_per_token"], kv_cache_ratio=x["kv_cache_ratio"],
        prefill_ratio=x["prefill_ratio"]) for x in r["rows"]]
    columns = [
        Column("variant", lambda x: x.variant, ("variant",), align=Align.LEFT),
        Column("batch", lambda x: num(x.batch, "d"), ("batch",)),
        Column("KV bytes/token", _f(",", lambda x: x.kv_cache_bytes_per_token), ("kv_cache_bytes_per_token",),
               short="KV\nbytes/token"),
        Column("KV ratio", _f(".2f", lambda x: x.kv_cache_ratio), ("kv_cache_ratio",), short="KV\nratio"),
        Column("decode tokens/s", _f(",.0f", lambda x: x.tokens_per_s), ("decode_tokens_per_s_aggregate",),
               short="decode\ntokens/s"),
        Column("baseline decode tokens/s", _f(",.0f", lambda x: x.baseline_tokens_per_s),
               ("baseline_decode_tokens_per_s",), short="baseline\ndecode\ntokens/s", priority=2),
        Column("ratio", _ratio_cell, ("ratio",)),
        Column("best-round ratio", _f(".3f", lambda x: x.ratio_best), ("ratio_best",), short="best-round\nratio",
               priority=3),
        Column("prefill ratio", _f(".3f", lambda x: x.prefill_ratio), ("prefill_ratio",), short="prefill\nratio",
               priority=1),
    ]
    foot = [f"{r['device']}, {r['precision']}, eager; prompt {r['context']} tokens, {r['new_tokens']} decode steps; "
            f"{r['rounds']} alternating rounds after {r['warmup']} warm-up, {r['clock']} clock; decode tokens/s: "
            "aggregate over the batch; ratio = median per-round variant/baseline; KV: measured from the cache "
            f"tensors at context {r['context'] + r['new_tokens']}; KV ratio = baseline/variant cache bytes"]
    return Table(f"decode tokens/s of each option vs the baseline ({_base(r)})", columns, rows,
                 notes=_versus_notes(rows), foot=foot)


# ---- `ablate bench --decode`: one model, per batch size -----------------------------------------
@dataclass
class DecodeRow(JsonRow):
    batch: int
    prefill_tokens_per_s: float
    time_to_first_token_ms: float
    decode_tokens_per_s_aggregate: float
    decode_tokens_per_s_per_stream: float
    kv_cache_bytes: int
    kv_cache_bytes_per_token: int
    peak_memory_bytes: Optional[int]
    prefill_spread: Optional[float]
    decode_spread: Optional[float]


def _prefill(spec: str, get: Callable[[DecodeRow], float], unit: str = "") -> Callable[[DecodeRow], str]:
    return lambda x: marked(format(get(x), spec) + unit, x.prefill_spread)


def _decode(spec: str, get: Callable[[DecodeRow], float]) -> Callable[[DecodeRow], str]:
    return lambda x: marked(format(get(x), spec), x.decode_spread)


DECODE_COLUMNS: list[Column] = [
    Column("batch", lambda x: str(x.batch), ("batch",)),
    Column("prefill tokens/s", _prefill(",.0f", lambda x: x.prefill_tokens_per_s), ("prefill_tokens_per_s",),
           short="prefill\ntokens/s"),
    Column("time to first token", _prefill(".1f", lambda x: x.time_to_first_token_ms, " ms"),
           ("time_to_first_token_ms",), short="time to\nfirst token"),
    Column("decode tokens/s aggregate", _decode(",.0f", lambda x: x.decode_tokens_per_s_aggregate),
           ("decode_tokens_per_s_aggregate",), short="decode\ntokens/s\naggregate"),
    Column("decode tokens/s per stream", _decode(",.1f", lambda x: x.decode_tokens_per_s_per_stream),
           ("decode_tokens_per_s_per_stream",), short="decode\ntokens/s\nper stream"),
    Column("spread prefill", lambda x: marked(shown(x.prefill_spread), x.prefill_spread), ("prefill_spread",),
           short="spread\nprefill", priority=2),
    Column("spread decode", lambda x: marked(shown(x.decode_spread), x.decode_spread), ("decode_spread",),
           short="spread\ndecode", priority=1),
    Column("KV cache", lambda x: _bytes(x.kv_cache_bytes), ("kv_cache_bytes",), priority=3),
    Column("KV bytes/token", lambda x: f"{x.kv_cache_bytes_per_token:,}", ("kv_cache_bytes_per_token",),
           short="KV\nbytes/token"),
    Column("peak memory", lambda x: _bytes(x.peak_memory_bytes), ("peak_memory_bytes",), short="peak\nmemory",
           priority=4),
]


def decode_table(r: dict) -> Table:
    """`ablate bench --decode` of one model (decode_bench.bench_decode's result)."""
    rows = [DecodeRow.of(x) for x in r["rows"]]
    foot = [f"{r['device']}, {r['precision']}, eager, {r['params']:,} params (random weights); prompt "
            f"{r['context']} tokens, then {r['new_tokens']} decode steps of one token per sequence; medians of "
            f"{r['rounds']} rounds after {r['warmup']} warm-up, {r['clock']} clock; aggregate = every sequence "
            "of the batch together, per stream = one sequence; spread: the half-width of the median's interval "
            "(90% where 5 or more rounds give one) over the median",
            f"KV cache: measured from the cache tensors at context {r['context'] + r['new_tokens']} (prompt + "
            f"decode steps) per sequence; `ablate inspect`'s formula at {r['precision']} and that context: "
            f"{r['kv_cache_formula_bytes_per_token']:,} bytes/token"
            + (f"; attention: {r['attention_layers']}" if r.get("attention_layers") else ""),
            f"peak memory: {r['peak_memory_kind']}"]
    notes = []
    if any(disagree(x.prefill_spread) or disagree(x.decode_spread) for x in rows):
        notes.append(disagree_note("its rounds"))
    if r["rounds"] == 1:
        notes.append("one round: no spread to say how sure a figure is; --rounds 5 or more gives each a 90% interval")
    notes.append("figures of one model from separate runs do not compare on a shared machine (its load changes "
                 "between them): time the models together, ablate bench --decode --vs OVERRIDES or --axes "
                 "(alternating rounds)")
    return Table("ablate bench --decode", DECODE_COLUMNS, rows, notes=notes, foot=foot)


# ---- `ablate bench --jobs-per-device` ------------------------------------------------------------
@dataclass
class PackRow(JsonRow):
    jobs_per_device: int
    threads_per_job: int
    wall_s: float
    tokens_per_s: float
    speedup: float
    training_tokens_per_s: float
    job_tokens_per_s: float

    @classmethod
    def of(cls, x: dict) -> "PackRow":
        return cls(x["jobs_per_device"], x["threads_per_job"], x["wall_s"], x[TOKENS_PER_S], x["speedup"],
                   x["training_tokens_per_s"], x["job_tokens_per_s"])


PACK_COLUMNS: list[Column] = [
    Column("jobs at once", lambda x: str(x.jobs_per_device), ("jobs_per_device",), short="jobs\nat once"),
    Column("threads/job", lambda x: str(x.threads_per_job), ("threads_per_job",)),
    Column("wall s", lambda x: f"{x.wall_s:.1f}", ("wall_s",)),
    Column("tokens/s (all jobs)", lambda x: f"{x.tokens_per_s:,.0f}", (TOKENS_PER_S,), short="tokens/s\n(all jobs)"),
    Column("speedup vs first", lambda x: f"{x.speedup:.2f}x", ("speedup",), short="speedup\nvs first"),
    Column("tokens/s while training", lambda x: f"{x.training_tokens_per_s:,.0f}", ("training_tokens_per_s",),
           short="tokens/s\nwhile\ntraining"),
    Column("tokens/s per job", lambda x: f"{x.job_tokens_per_s:,.0f}", ("job_tokens_per_s",),
           short="tokens/s\nper job"),
]


def packing_table(r: dict) -> Table:
    """`ablate bench --jobs-per-device` (bench.bench_packing's result)."""
    foot = [f"{r['device']}; {r['cores']} cores; each job: its own process, {r['warmup']} warm-up + {r['steps']} "
            f"timed steps of {r['tokens_per_step']} tokens; wall = first start to last end (imports and build "
            "included); tokens/s (all jobs) = timed tokens / wall; while training = timed tokens / time any job "
            "was in its timed steps"]
    finite = all(x["loss_finite"] for x in r["rows"])
    return Table(f"a sweep of {r['jobs']} jobs, K at a time on one device", PACK_COLUMNS,
                 [PackRow.of(x) for x in r["rows"]], foot=foot,
                 warning=None if finite else "warning: a non-finite loss during the benchmark")


def table_of(result: dict) -> Table:
    """The table of any `ablate bench` result."""
    if result.get("mode") == "jobs_per_device":
        return packing_table(result)
    if result.get("mode") == "decode":
        return decode_variants_table(result) if "baseline" in result else decode_table(result)
    return variants_table(result) if "baseline" in result else bench_table(result)

