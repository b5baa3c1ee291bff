"""The tables of `ablate inspect`: its report (the `--json` dict of ablate/measure/inspect.py,
unchanged by this module) as typed rows and the Columns of the one table model
(ablate/tables/table.py): the parameters by component, with the variant's axes and dimensions
above them and what the counts mean below; under param=mup or completep the init and LR of each
parameter role; under optim=muon the matrices each optimizer updates, with their shapes and LRs.
Torch-free."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ablate.names import LR
from ablate.tables.table import Align, Column, JsonRow, Table, num
from ablate.terminal import human_bytes

COMPONENTS = ("embedding", "attention", "ffn", "norm", "head")


@dataclass
class ComponentRow(JsonRow):
    component: str
    params: int
    share: float  # of the total


PARAM_COLUMNS: list[Column] = [
    Column("component", lambda x: x.component, ("component",), align=Align.LEFT),
    Column("params", lambda x: f"{x.params:,}", ("params",)),
    Column("share", lambda x: f"{100 * x.share:.1f}%" if x.share < 1 else "100%", ("share",)),
]


@dataclass
class RuleRow(JsonRow):
    """A parameter role under a parametrization (ablate/model/parametrization.py rule_rows)."""

    role: str
    tensors: int
    params: int
    fan_in: Optional[int]
    base_fan_in: Optional[int]
    init_std: Optional[float]
    lr_mult: float
    weight_decay_mult: float


RULE_COLUMNS: list[Column] = [
    Column("role", lambda x: x.role, ("role",), align=Align.LEFT),
    Column("tensors", lambda x: str(x.tensors), ("tensors",)),
    Column("params", lambda x: f"{x.params:,}", ("params",)),
    Column("fan-in (base)", lambda x: "-" if x.fan_in is None else f"{x.fan_in} ({x.base_fan_in})",
           ("fan_in", "base_fan_in"), short="fan-in\n(base)"),
    Column("init std", lambda x: num(x.init_std, ".4g"), ("init_std",), short="init\nstd"),
    Column("LR x", lambda x: f"{x.lr_mult:.4g}", ("lr_mult",)),
    Column("decay x", lambda x: f"{x.weight_decay_mult:.4g}", ("weight_decay_mult",), short="decay\nx"),
]


@dataclass
class LayerRow(JsonRow):
    """One layer's attention: its window (None: full), the keys its last query sees at the
    report's context, its RoPE base, its cache there (inspect.layer_rows)."""

    layer: int
    window: Optional[int]
    keys: int
    rope_base: Optional[float]
    kv_positions: int
    kv_bytes: int


LAYER_COLUMNS: list[Column] = [
    Column("layer", lambda x: str(x.layer), ("layer",)),
    Column("attention", lambda x: "full" if x.window is None else f"window {x.window:,}", ("window",),
           align=Align.LEFT),
    Column("keys seen", lambda x: f"{x.keys:,}", ("keys",), short="keys\nseen"),
    Column("RoPE base", lambda x: num(x.rope_base, ",.0f"), ("rope_base",), short="RoPE\nbase"),
    Column("KV positions", lambda x: f"{x.kv_positions:,}", ("kv_positions",), short="KV\npositions"),
    Column("KV bytes", lambda x: f"{x.kv_bytes:,}", ("kv_bytes",)),
]


def inspect_tables(r: dict) -> list[Table]:
    """`ablate inspect`'s report (inspect_config's, with cross_check's built_params)."""
    s, p = r["spec"], r["params"]
    settings = [f"{a}.{k}={v}" for a, values in s.get("settings", {}).items() for k, v in values.items()]
    head = [" ".join([f"{k}={v}" for k, v in r["axes"].items()] + settings),  # norm.alpha0=0.5 with dyt
            f"d_model {s['d_model']}, {s['n_layers']} layers, {s['n_heads']} heads x head_dim {r['head_dim']}, "
            f"{s['n_kv_heads']} KV heads, d_ff {s['d_ff']}, max_seq_len {s['max_seq_len']}"]
    total = p["total"]
    rows = [ComponentRow(k, p[k], p[k] / total) for k in COMPONENTS]
    rows += [ComponentRow("total", total, 1.0),
             ComponentRow("non-embedding", r["non_embedding_params"], r["non_embedding_params"] / total)]
    if r["active_params"] != total:  # an MoE: the parameters one token uses
        rows.append(ComponentRow("active (per token)", r["active_params"], r["active_params"] / total))
    vb = r["vs_baseline"]
    changed = [f"{k}={v}" for k, v in r["axes"].items() if vb["baseline_axes"].get(k) != v]
    active = ("" if vb["active_delta"] == vb["delta"] else
              f"; active per token {vb['active_delta']:+,} ({vb['active_delta_pct']:+.2f}%)")
    foot = [f"vs baseline (every axis at its default{'; this variant: ' + ', '.join(changed) if changed else ''}): "
            f"{vb['delta']:+,} params ({vb['delta_pct']:+.2f}%){active}"]
    if "built_params" in r:
        foot.append(f"--build: a model built on the meta device has {r['built_params']['total']:,} parameters, "
                    "equal to the analytic count in every component")
    if s["tied"]:
        foot.append("embedding includes the output head (tied); learned positions are counted in embedding")
    foot += [f"vocab: {r['vocab']['note']}", f"FFN: {r['ffn']['why']}",
             *([f"MoE: {r['moe']['why']}"] if "moe" in r else []),
             f"FLOPs/token (training, seq_len {r['seq_len']}): {r['flops_per_token']:,} = {r['flops_formula']}",
             f"KV cache ({r['dtype']}) at context {r['kv_cache_context']:,} (--seq-len): "
             f"{r['kv_cache_bytes_per_token']:,} bytes/token = {r['kv_cache_formula']}; "
             f"x batch {r['batch']}: {r['kv_cache_bytes']:,} bytes ({human_bytes(r['kv_cache_bytes'])})",
             _parametrization(r["parametrization"])]
    tables = [Table("parameters", PARAM_COLUMNS, rows, head=head, foot=foot)]
    if "attn_details" in r:
        tables.append(_attn_details(r["attn_details"]))
    layers = [LayerRow.of(x) for x in r.get("layers", [])]
    if any(x.window is not None for x in layers):  # sliding windows: which layers slide, at which base
        tables.append(Table(f"attention by layer, at context {r['kv_cache_context']:,} (--seq-len)", LAYER_COLUMNS,
                            layers, foot=[f"keys seen: by the last query, min(window, context); KV: per sequence "
                                          f"at {r['dtype']}; a sliding layer keeps at most its window's positions, "
                                          "and costs 12 * d_attn * min(W, T) attention FLOPs per token"]))
    rules = r["parametrization"]["rules"]
    if rules:
        tables.append(Table(f"param={r['parametrization']['param']}: init and LR by parameter role", RULE_COLUMNS,
                            [RuleRow.of(x) for x in rules]))
    if "optimizer" in r:
        tables.append(_optimizer(r["optimizer"]))
    return tables


@dataclass
class MatrixRow(JsonRow):
    parameter: str
    matrix: str  # its rows in a fused parameter ("rows 0:128"), a declared label, a bank's experts, or "-"
    optimizer: str
    shape: str  # the shape it is orthogonalized (Muon) or updated (AdamW) at
    lr: float  # its LR at train.lr, before the schedule (Muon's adjusted)
    layers: int  # the layers with the same rows


MATRIX_COLUMNS: list[Column] = [
    Column("parameter", lambda x: x.parameter, ("parameter",), align=Align.LEFT),
    Column("matrix", lambda x: x.matrix, ("matrix",), align=Align.LEFT),
    Column("optimizer", lambda x: x.optimizer, ("optimizer",), align=Align.LEFT),
    Column("shape", lambda x: x.shape, ("shape",)),
    Column("LR", lambda x: f"{x.lr:.4g}", (LR,)),
    Column("layers", lambda x: str(x.layers), ("layers",)),
]


def _optimizer(o: dict) -> Table:
    """optim=muon: each parameter's matrices, the optimizer, the orthogonalized shape, the LR."""
    adam = f"; AdamW part at optim.adam_lr {o['adam_lr']:g}" if o["adam_lr"] is not None else ""
    rows = [MatrixRow(m["parameter"], m["matrix"] or "-", m["optimizer"], " x ".join(map(str, m["shape"])),
                      m["effective_lr"], m["layers"]) for m in o["matrices"]]
    head = [f"optimizer {o['optim']} (optim.adjust={o['adjust']}): Muon on each logical matrix, AdamW on the "
            f"rest; LRs at train.lr {o['train_lr']:g}{adam}, before the schedule"]
    return Table("the matrices each optimizer updates (layers with the same rows: one row)", MATRIX_COLUMNS, rows,
                 head=head)


@dataclass
class ProjectionRow(JsonRow):
    projection: str
    params: int


PROJECTION_COLUMNS: list[Column] = [
    Column("projection", lambda x: x.projection, ("projection",), align=Align.LEFT),
    Column("params", lambda x: f"{x.params:,}", ("params",)),
]


def _attn_details(d: dict) -> Table:
    """The attention option's own view of one layer (its declaration's `details`; MLA: the
    ranks, the logit scale, parameters by projection, one decode step's FLOPs)."""
    rows = [ProjectionRow(k, n) for k, n in d.get("params_by_projection", {}).items()]

    def show(v) -> str:
        return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else f"{v:.4g}" if isinstance(v, float) else str(v)

    scalars = ", ".join(f"{k} {show(v)}" for k, v in d.items() if k not in ("attn", "params_by_projection"))
    return Table(f"attn={d['attn']}: parameters by projection, per layer", PROJECTION_COLUMNS, rows,
                 foot=[f"attn={d['attn']} per layer: {scalars}"])


def _parametrization(p: dict) -> str:
    """The param axis: its base shape and multipliers (under mup / completep a table of rules follows)."""
    return (f"parametrization {p['param']}: base width {p['base_width']}, base depth {p['base_depth']}; width "
            f"x{p['width_mult']:.4g}, depth x{p['depth_mult']:.4g}; logits x{p['logit_mult']:.4g}, attention "
            f"scale {p['attn_scale']:.4g}, residual branches x{p['branch_mult']:.4g}, AdamW eps {p['adam_eps']:.3g}"
            + ("" if p["rules"] else "; every parameter at the base LR and init (docs/parametrization.md)"))
