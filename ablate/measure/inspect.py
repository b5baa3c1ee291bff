"""`ablate inspect`: what a variant costs, from the config alone (no training; no torch needed,
except for param=mup / completep's per-parameter rules, read off a model built on the meta device).

Parameter counts, FLOPs and KV bytes come from the analytic sums in ablate/model/spec.py over
each layer's components (their declarations; tests assert the counts equal the built model's,
option by option), the formulas in words from the attention component's declaration;
`build=True` cross-checks against a model built on the meta device (no memory, no init cost).
"""

from __future__ import annotations

from typing import Any, Optional

from ablate.errors import ConfigError
from ablate.model import options
from ablate.model.sliding import attended_keys, settings_of, spec_windows
from ablate.model.spec import (VOCAB_MULTIPLE, ModelSpec, active_params, cache_layouts, count_params,
                               ffn_layer_params, flops_per_token, gated_d_ff, kv_cache_bytes, kv_cache_bytes_per_token,
                               non_embedding_params)

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def formulas(spec: ModelSpec) -> tuple[str, str]:
    """(FLOPs/token, KV bytes/token) in words, as the attention component declares them; with a
    routed FFN, N counts the weights a token uses; with sliding windows, what they change."""
    attn = options.get("attn", spec.attn)
    flops = attn.flops_formula or (f"the sum over layers of each component's declared training FLOPs per token "
                                   f"(attn={attn.name}, ffn={spec.ffn}) + 6 * the d x V output head")
    cache = attn.cache_formula or f"the sum over layers of attn={attn.name}'s declared cache bytes per position"
    if active_params(spec) != count_params(spec)["total"]:
        flops += f"; N counts active weights only (ffn={spec.ffn}: the router and the experts a token is routed to)"
    if any(w is not None for w in spec_windows(spec)):
        flops += "; a sliding layer's T is min(W, T)"
        cache += " per position kept, over the context (a sliding layer keeps min(context, W) positions)"
    return flops, cache


def run_kv_cache_bytes_per_token(cfg: Any, precision: str) -> int:
    """KV-cache bytes per token (inspect's `kv_cache_bytes_per_token`, the components' declared
    caches) of cfg's model at a run's compute dtype (train.precision resolved: bf16 or fp32), as
    `inspect --dtype` gives it: the cache at the run's train.seq_len tokens over train.seq_len."""
    context = int(cfg.train.seq_len)
    return kv_cache_bytes_per_token(ModelSpec.from_config(cfg), DTYPE_BYTES[precision], context)


def layer_rows(spec: ModelSpec, context: int, bytes_per_elem: int) -> list[dict]:
    """Per layer: its window (None: full), the keys its last query sees at `context`, its RoPE
    base (None: pos is not rope) and its cache's positions and bytes per sequence at `context`."""
    local_base = settings_of(spec)[2]
    rows = []
    for layer, (window, layout) in enumerate(zip(spec_windows(spec), cache_layouts(spec))):
        base = None if spec.pos != "rope" else local_base if window is not None and local_base else spec.rope_base
        rows.append({"layer": layer, "window": window, "keys": attended_keys(window, context), "rope_base": base,
                     "kv_positions": layout.positions(context) if layout else 0,
                     "kv_bytes": layout.bytes(context, bytes_per_elem) if layout else 0})
    return rows


def ffn_sizes(cfg: Any) -> dict:
    """The FFN width each act option would get here, and why (the size-matching rule)."""
    m = cfg.model
    act = str(cfg.act.name)
    gated = options.get("act", act).gated
    bias = options.get("bias", cfg.bias.name).value
    d = m.d_model
    plain_d_ff = int(m.ffn_ratio * d)
    matched = gated_d_ff(plain_d_ff, d, m.ffn_multiple_of, bias)
    per_layer = {"plain": ffn_layer_params(d, plain_d_ff, False, bias),
                 "gated": ffn_layer_params(d, matched, True, bias)}
    delta = per_layer["gated"] - per_layer["plain"]
    match = (f"FFN params per layer {per_layer['gated']:,} gated vs {per_layer['plain']:,} plain "
             f"({delta:+,}, {100 * delta / per_layer['plain']:+.2f}%)")
    if m.d_ff is not None:
        why = (f"model.d_ff={m.d_ff} is set explicitly, so it is used as is ({'3' if gated else '2'} "
               f"matrices of width {m.d_ff}); gated and plain options are not size-matched")
    elif gated:
        why = (f"act={act} is gated (three matrices: gate, up, down), so d_ff is the multiple of "
               f"model.ffn_multiple_of={m.ffn_multiple_of} nearest in parameters to a plain FFN of "
               f"ffn_ratio {m.ffn_ratio:g} * d_model {d} = {plain_d_ff} (2/3 of it is "
               f"{2 * plain_d_ff / 3:g}): {matched}; {match}")
    else:
        why = (f"act={act} is plain (two matrices: up, down), so d_ff = ffn_ratio {m.ffn_ratio:g} * "
               f"d_model {d} = {plain_d_ff}; a gated act (three matrices) would use {matched}, the "
               f"multiple of {m.ffn_multiple_of} nearest in parameters; {match}")
    return {"act": act, "gated": gated, "d_ff_explicit": m.d_ff is not None,
            "plain_d_ff": plain_d_ff, "gated_d_ff": matched,
            "ffn_params_per_layer": per_layer, "gated_minus_plain_per_layer": delta, "why": why}


def moe_sizes(spec: ModelSpec) -> Optional[dict]:
    """ffn=moe: its experts' width and why, and the active parameters of an MoE layer against the
    dense FFN's (the gap the fair width leaves, as ffn_sizes states the GLU width's); None when dense."""
    from ablate.model.moe_spec import MoESettings, expert_params, expert_width, router_params, shared_params

    if spec.ffn != "moe":
        return None
    s = MoESettings.of(spec.ffn)
    h = expert_width(spec, s)
    dense = expert_params(spec.d_model, spec.d_ff, spec.gated, spec.bias)
    shared = shared_params(spec.d_model, h, spec.gated, spec.bias, s.shared)
    experts = s.top_k * expert_params(spec.d_model, h, spec.gated, spec.bias) + shared
    router = router_params(spec.d_model, s.experts)
    gap = experts - dense
    used = f"{s.top_k} experts" if not s.shared else f"{s.top_k} routed and {s.shared} shared experts"
    how = (f"ffn.d_expert={h} is set explicitly" if s.d_expert is not None else
           f"ffn.d_expert is null, so an expert's width is the multiple of model.ffn_multiple_of="
           f"{spec.ffn_multiple_of} whose {used}' parameters are nearest the dense FFN's "
           f"(d_ff {spec.d_ff}; the router not counted): {h}")
    why = (f"ffn=moe: {s.experts} experts, top-{s.top_k}" + (f", {s.shared} shared" if s.shared else "")
           + f"; {how}; per MoE layer a token uses {used} "
           f"= {experts:,} params vs the dense FFN's {dense:,} ({gap:+,}, {100 * gap / dense:+.2f}%), plus the "
           f"router's {router:,}; {s.experts * expert_params(spec.d_model, h, spec.gated, spec.bias) + shared + router:,} "
           f"params in all" + (f"; the first {s.dense_first} layers keep the dense FFN" if s.dense_first else ""))
    return {"experts": s.experts, "top_k": s.top_k, "d_expert": h, "d_expert_explicit": s.d_expert is not None,
            "moe_layers": spec.n_layers - s.dense_first, "dense_ffn_params_per_layer": dense,
            "active_expert_params_per_layer": experts, "router_params_per_layer": router,
            "active_minus_dense_per_layer": gap, "why": why}


def baseline_spec(cfg: Any) -> ModelSpec:
    """The same config with every axis at its default option (what `ablate run` trains without
    axis overrides): sizes, tokenizer and the other model keys unchanged."""
    import copy

    from ablate.config.axes import default_axes

    base = copy.deepcopy(cfg)
    for axis, option in default_axes().items():
        if axis in base and str(base[axis].name) != option:
            base[axis].name = option
            if axis == "attn":  # an explicit KV head count belongs to the variant's attn option
                base.model.n_kv_heads = None
        if axis in base and options.AXES[axis].kind.takes_settings:  # attn.window=8 on mha: full
            for key, declared in options.get(axis, option).all_settings.items():
                if key in base[axis]:
                    base[axis][key] = declared.default
    return ModelSpec.from_config(base)


def param_delta(cfg: Any, spec: ModelSpec) -> dict:
    """Parameters of this variant minus the default-axes baseline's (the size change to state)."""
    from ablate.config.axes import default_axes

    base_spec = baseline_spec(cfg)
    base = count_params(base_spec)["total"]
    total = count_params(spec)["total"]
    active = active_params(spec) - active_params(base_spec)
    return {"baseline_axes": default_axes(), "baseline_params": base, "delta": total - base,
            "delta_pct": 100.0 * (total - base) / base, "active_delta": active,
            "active_delta_pct": 100.0 * active / active_params(base_spec)}


def parametrization_report(spec: ModelSpec, attn: Optional[dict] = None) -> dict:
    """The parametrization (axis `param`): its multipliers, and under mup / completep each rule
    row's init std and LR multiplier (ablate/model/parametrization.py; built on the meta device).
    attn: the attention's own details, when it scales its logits itself (MLA's `logit_scale`)."""
    from ablate.model.parametrization import ADAM_EPS, Parametrization, rule_rows

    p = Parametrization.of(spec)
    scale = spec.head_dim ** -0.5 if p.attn_scale is None else p.attn_scale
    return {"param": spec.param, "base_width": spec.base_width, "base_depth": spec.base_depth,
            "width_mult": p.width_mult, "depth_mult": p.depth_mult, "logit_mult": p.logit_mult,
            "attn_scale": (attn or {}).get("logit_scale", scale),
            "branch_mult": p.branch_mult, "adam_eps": ADAM_EPS * p.eps_mult,
            "depth_scaled_init": p.depth_scaled_init,
            "rules": [] if spec.param == options.AXES["param"].default else rule_rows(_meta_model(spec))}


def optimizer_report(cfg: Any, spec: ModelSpec) -> Optional[dict]:
    """Under optim=muon: every parameter's logical matrices with the optimizer that updates them,
    the shape Newton-Schulz orthogonalizes and the LR at train.lr (Muon's adjusted LR), layers with
    the same rows as one row (built on the meta device). None under optim=adamw."""
    from ablate.train.optimizers.optim_settings import OptimSpec

    optim = OptimSpec.from_config(cfg)
    if not optim.muon:
        return None
    from ablate.train.optimizer import matrix_rows

    rows = matrix_rows(_meta_model(spec), cfg.train, optim)
    return {"optim": optim.name, "adjust": optim.adjust, "train_lr": float(cfg.train.lr),
            "adam_lr": optim.adam_lr, "matrices": [r.as_dict() for r in rows]}


def _meta_model(spec: ModelSpec) -> Any:
    """The model built on the meta device: shapes and rules, no memory, no init."""
    import torch

    from ablate.model.transformer import Transformer

    with torch.device("meta"):
        return Transformer(spec)


def run_precision(cfg: Any) -> str:
    """The dtype a run of cfg computes in (train.precision; auto: bf16 on a GPU that has it, else
    fp32), which is its KV cache's, as compare and bench count it."""
    precision = str(cfg.train.precision)
    if precision != "auto":
        return precision
    if str(cfg.train.device) == "cpu":
        return "fp32"
    from ablate.train.trainer import resolve_device, resolve_precision

    return resolve_precision("auto", resolve_device(str(cfg.train.device)))


def inspect_config(cfg: Any, seq_len: Optional[int] = None, batch: Optional[int] = None,
                   dtype: Optional[str] = None) -> dict:
    """Everything `ablate inspect` prints, as a JSON-able dict. dtype: the KV cache's (None: the
    run's own, run_precision)."""
    dtype = run_precision(cfg) if dtype is None else dtype
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"--dtype must be one of {', '.join(DTYPE_BYTES)}, got '{dtype}'")
    seq_len = int(cfg.train.seq_len if seq_len is None else seq_len)
    batch = int(cfg.train.batch_size if batch is None else batch)
    if seq_len <= 0 or batch <= 0:
        raise ConfigError(f"--seq-len and --batch must be positive, got {seq_len} and {batch}")
    spec = ModelSpec.from_config(cfg)
    params = count_params(spec)
    kv = kv_cache_bytes_per_token(spec, DTYPE_BYTES[dtype], seq_len)
    flops_formula, kv_formula = formulas(spec)
    padded = spec.vocab_size != spec.tokenizer_vocab
    if cfg.model.vocab_size is None:
        vocab_note = (f"tokenizer={cfg.tokenizer.name} has {spec.tokenizer_vocab:,} ids, padded to "
                      f"{spec.vocab_size:,} (a multiple of {VOCAB_MULTIPLE}: faster matmuls; the padding "
                      f"ids are never targets)" if padded else
                      f"tokenizer={cfg.tokenizer.name} has {spec.tokenizer_vocab:,} ids (already a multiple "
                      f"of {VOCAB_MULTIPLE})")
    else:
        vocab_note = (f"model.vocab_size={spec.vocab_size:,} set explicitly (tokenizer={cfg.tokenizer.name} "
                      f"has {spec.tokenizer_vocab:,} ids; no padding applied)")
    from ablate.config.schema import axis_values

    details = attn_details(spec, seq_len)
    optimizer = optimizer_report(cfg, spec)
    return {
        "params": {k: params[k] for k in ("total", "embedding", "attention", "ffn", "norm", "head")},
        "active_params": active_params(spec),
        "non_embedding_params": non_embedding_params(spec),
        "flops_per_token": flops_per_token(spec, seq_len),
        "flops_formula": flops_formula,
        "kv_cache_bytes_per_token": kv,
        "kv_cache_bytes": kv_cache_bytes(spec, seq_len, DTYPE_BYTES[dtype]) * batch,
        "kv_cache_formula": kv_formula,
        "kv_cache_context": seq_len,  # the context the KV figures are taken at
        "layers": layer_rows(spec, seq_len, DTYPE_BYTES[dtype]),
        "seq_len": seq_len,
        "batch": batch,
        "dtype": dtype,
        "vocab": {"tokenizer": spec.tokenizer_vocab, "model": spec.vocab_size, "padded": padded,
                  "note": vocab_note},
        "ffn": ffn_sizes(cfg),
        **({"moe": moe_sizes(spec)} if spec.ffn == "moe" else {}),
        "vs_baseline": param_delta(cfg, spec),
        "axes": axis_values(cfg),
        "spec": spec.to_dict(),
        "head_dim": spec.head_dim,
        "parametrization": parametrization_report(spec, details.get("attn_details")),
        **details,
        **({"optimizer": optimizer} if optimizer else {}),  # optim=muon only
    }


def attn_details(spec: ModelSpec, seq_len: int) -> dict:
    """{"attn_details": ...}: what the attention option says of its first layer's shape and costs
    (its declaration's `details`: MLA's ranks, parameters by projection, decode FLOPs at seq_len);
    {} for an option that declares none."""
    option = options.get("attn", spec.attn)
    return {} if option.details is None else {"attn_details": {"attn": option.name, **option.details(spec, 0, seq_len)}}


def cross_check(report: dict) -> dict:
    """Adds `built_params` and raises if the analytic count disagrees with the built model."""
    import torch

    from ablate.model.transformer import Transformer, check_counts

    spec = ModelSpec(**report["spec"])
    with torch.device("meta"):  # no memory, no init cost
        built = check_counts(Transformer(spec))
    return {**report, "built_params": built}


def grad_profile_for_config(cfg: Any) -> dict:
    """The profile of the model `ablate run` would build (same seed, same first batch), so it
    equals the step-0 row of `ablate run train.steps=0 train.diagnostics_every=1`."""
    import torch

    from ablate.data.batches import Batches
    from ablate.train.diagnostics import grad_profile
    from ablate.model.spec import ModelSpec
    from ablate.model.transformer import build_model
    from ablate.train.launch import prepare_data, seed_everything
    from ablate.train.threads import use_threads

    use_threads(cfg.train.threads)  # ablate/train/threads.py
    tok, data = prepare_data(cfg, progress=False)
    spec = ModelSpec.from_config(cfg, tokenizer_vocab=tok.vocab_size)
    seed_everything(cfg.seed)
    model = build_model(spec)
    model.train()
    x, y = Batches(data.train, cfg.train.seq_len, cfg.train.batch_size,
                   data_seed=cfg.data_seed).get(0, 0)
    layers = grad_profile(model, x, y)
    return {"layers": layers}
