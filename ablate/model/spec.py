"""ModelSpec: the resolved, validated description of one model variant (torch-free).

The model files receive a ModelSpec, never the Hydra config. It holds one typed config per
component axis (`spec.norm`, `spec.norm_pos`, `spec.act`, `spec.pos`, `spec.attn`, `spec.ffn`:
the option's name with its settings as typed attributes, ablate/model/axis.py: AxisConfig), the
model's sizes, and the values the flag axes, `param` and the model keys set. Its constructor and
`to_dict` are flat (an axis's option by name, its settings in `settings`): the Hugging Face
families, inspect's JSON and the tests build and read it that way.

The analytic counts live here too, each a sum over the layers of what every component declares
(ablate/model/component.py): `ablate inspect` answers without building the model, and tests
assert analytic == built for every option.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional, Union

from ablate.errors import ConfigError
from ablate.model import options
from ablate.model.axis import AxisConfig, OptionSettings
from ablate.model.component import CacheLayout
from ablate.model.options import ffn_layer_params
from ablate.model.sliding import check_spec as check_sliding

VOCAB_MULTIPLE = 64  # padded vocab: faster matmuls; the padding ids are never targets
FFN_MULTIPLE = 16  # model.ffn_multiple_of's default (ablate/config/schema.py)


def round_up(x: int, multiple: int) -> int:
    return ((x + multiple - 1) // multiple) * multiple


def gated_d_ff(plain_d_ff: int, d_model: int, multiple: int, bias: bool) -> int:
    """The gated width, a multiple of `multiple`, whose FFN parameter count is closest to the
    plain FFN's (Shazeer 2020 shrinks d_ff by 2/3 to keep params equal). Both multiples around
    2/3 * plain_d_ff are tried, so the width is rounded to the nearer count, not always up; a
    tie goes to the smaller width (never more capacity than the baseline for free)."""
    target = ffn_layer_params(d_model, plain_d_ff, False, bias)
    low = max(multiple, (2 * plain_d_ff // 3) // multiple * multiple)
    candidates = [w for w in (low - multiple, low, low + multiple) if w >= multiple]
    return min(candidates, key=lambda w: (abs(ffn_layer_params(d_model, w, True, bias) - target), w))


@dataclass(frozen=True)
class ModelSpec:
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    max_seq_len: int
    # The axes' defaults: what a run without overrides trains (ablate/model/options.py). A
    # component axis is given by its option's name (or its typed config) and held as its typed
    # config; attn=None: the option whose KV head count n_kv_heads is (mha, gqa or mqa).
    norm: Union[AxisConfig, str] = options.AXES["norm"].default
    norm_eps: float = options.AXES["norm"].config["eps"].default
    norm_pos: Union[AxisConfig, str] = options.AXES["norm_pos"].default
    act: Union[AxisConfig, str] = options.AXES["act"].default
    pos: Union[AxisConfig, str] = options.AXES["pos"].default
    rope_base: float = options.AXES["pos"].config["base"].default
    attn: Union[AxisConfig, str, None] = None
    ffn: Union[AxisConfig, str] = options.AXES["ffn"].default
    tied: bool = options.default("tie").value
    bias: bool = options.default("bias").value
    dropout: float = 0.0  # embedding sum and sublayer outputs (residual dropout)
    attn_dropout: Optional[float] = None  # attention probabilities; None: the same as dropout
    qk_norm: bool = options.default("qk_norm").value
    init: str = "normal"  # normal | xavier (roles.init_weights)
    init_std: float = 0.02
    depth_scaled_init: bool = True
    emb_scale: bool = False
    parallel_block: bool = False
    z_loss: float = 0.0
    attn_softcap: Optional[float] = None
    logit_softcap: Optional[float] = None
    act_clamp: Optional[float] = None
    mtp_heads: int = 0
    mtp_weight: float = 0.3
    tokenizer_vocab: Optional[int] = None  # before padding, for reporting
    # model.ffn_multiple_of: the widths a derived FFN width rounds to (read by ffn=moe's fair
    # expert width, which follows d_ff, so a muP base model gets its own)
    ffn_multiple_of: int = FFN_MULTIPLE
    # The parametrization (axis `param`) and its reference shape: None resolves to this model's
    # own width, depth and FFN width (where every param option trains as sp). base_d_ff: the FFN
    # width of the base model (from_config derives it by the run's own d_ff rule).
    param: str = options.AXES["param"].default
    base_width: Optional[int] = None
    base_depth: Optional[int] = None
    base_d_ff: Optional[int] = None
    # The chosen options' settings by axis ({"norm": {"alpha0": 0.5}} with norm=dyt), the flat
    # view of the typed configs: given as a plain mapping (a typed config given for an axis wins
    # for its keys), kept as OptionSettings with every declared default filled in.
    settings: OptionSettings = OptionSettings()

    def __post_init__(self):
        self._resolve_axes()
        self._resolve_base()
        self.check()

    def _resolve_base(self) -> None:
        """The base shape's None -> this model's own; base_d_ff None -> d_ff scaled to the base width."""
        for key, own in (("base_width", self.d_model), ("base_depth", self.n_layers)):
            if getattr(self, key) is None:
                object.__setattr__(self, key, own)
        if self.base_d_ff is None:
            same = self.base_width == self.d_model
            object.__setattr__(self, "base_d_ff", self.d_ff if same else
                               max(1, round(self.d_ff * self.base_width / self.d_model)))

    def _resolve_axes(self) -> None:
        """Each component axis's typed config (declared defaults filled in, unknown keys and
        mistyped values refused) and `settings`, their flat view; an axis whose option has no
        settings (or only optional ones left at null) is left out of it, so a spec without
        settings reads as it always has."""
        given = dict(self.settings or {})
        flat = {}
        for axis in options.component_axes():
            value = getattr(self, axis)
            if value is None:  # attn: named by its KV head count
                value = next((o.name for o in options.declared(axis) if o.fits and o.fits(self.n_heads, self.n_kv_heads)),
                             options.AXES[axis].default)
            name = value.name if isinstance(value, AxisConfig) else str(value)
            own = given.pop(axis, None) or {}
            if name not in options.names(axis):  # an unknown name is check()'s to report
                object.__setattr__(self, axis, name)
                continue
            config = options.get(axis, name).config_of(own)
            if isinstance(value, AxisConfig) and value != config:
                if own:  # e.g. dataclasses.replace(spec, settings=...) beside spec's own typed config
                    raise ConfigError(f"{axis}: the typed config {value.settings} and settings {own} disagree; "
                                      f"give the option by name ({axis}='{name}') with its settings, or a typed config")
                config = value
            object.__setattr__(self, axis, config)
            declared = config.option.all_settings
            # an optional setting left at its null default is left out (attn.window on every mha
            # model), so a spec that sets none reads as it always has; its implementation takes
            # that keyword's default, None
            kept = {k: v for k, v in config.settings.items() if not (v is None and declared[k].default is None)}
            if kept:
                flat[axis] = kept
        if given:
            raise ConfigError(f"settings for {', '.join(given)}: no option of that axis takes settings here")
        object.__setattr__(self, "settings", OptionSettings(flat))

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def gated(self) -> bool:
        return options.get("act", self.act).gated

    @property
    def attn_dropout_rate(self) -> float:
        return self.dropout if self.attn_dropout is None else self.attn_dropout

    @property
    def embedding_std(self) -> float:
        """Std of the token embeddings at init (before emb_scale): init_std, or d^-1/2 for xavier
        (tensor2tensor's N(0, d^-1/2), unit RMS once multiplied by sqrt(d))."""
        return self.d_model ** -0.5 if self.init == "xavier" else self.init_std

    def check(self) -> None:
        for axis, value, names in (
            *((axis, getattr(self, axis), options.names(axis)) for axis in options.component_axes()),
            ("model.init", self.init, options.INIT_NAMES),
            ("param", self.param, options.names("param")),
        ):
            if value not in names:
                raise ConfigError(f"unknown {axis} option '{value}'; valid options: {', '.join(names)}")
        if self.n_kv_heads <= 0 or self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"model.n_heads={self.n_heads} is not divisible by model.n_kv_heads="
                f"{self.n_kv_heads}; pick n_kv_heads that divides n_heads")
        options.check_kv_heads(self.attn, self.n_heads, self.n_kv_heads)  # the attn option says it
        check_sliding(self)  # attn.window, attn.global_every, attn.local_rope_base
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}")
        for axis in ("attn", "ffn"):  # what a component cannot build (MLA: its ranks, qk_norm)
            option = options.get(axis, getattr(self, axis))
            if option.check is not None:
                option.check(self)
        if self.pos == "rope" and options.get("attn", self.attn).rotary_dim(self) % 2:
            raise ConfigError(
                f"pos=rope needs an even head dim, but model.d_model/model.n_heads = "
                f"{self.d_model}/{self.n_heads} = {self.head_dim}")
        # Non-positive values train (eps 0: NaN on a zero row; base <= 0: NaN angles) or init
        # (a negative std) into nonsense, so they are refused here, before anything runs.
        for key, value in (("norm.eps", self.norm_eps), ("pos.base", self.rope_base),
                           ("model.init_std", self.init_std)):
            if not value > 0:
                raise ConfigError(f"{key} must be positive, got {value}")
        if self.d_ff <= 0:
            raise ConfigError(f"model.d_ff must be positive, got {self.d_ff}")
        for axis in ("attn", "ffn"):  # a component's own checks of its settings
            own = options.get(axis, getattr(self, axis)).check
            if own is not None:
                own(self)
        self._check_base()
        if self.parallel_block and self.norm_pos != "pre":
            raise ConfigError("model.parallel_block=true needs norm_pos=pre")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout.rate must be in [0, 1), got {self.dropout}")
        if self.attn_dropout is not None and not 0.0 <= self.attn_dropout < 1.0:
            raise ConfigError(f"dropout.attn must be in [0, 1) or null, got {self.attn_dropout}")
        if self.mtp_heads < 0:
            raise ConfigError(f"model.mtp_heads must be >= 0, got {self.mtp_heads}")
        for key in ("attn_softcap", "logit_softcap", "act_clamp"):
            v = getattr(self, key)
            if v is not None and v <= 0:
                raise ConfigError(f"model.{key} must be positive or null, got {v}")
        if self.z_loss < 0 or self.mtp_weight < 0:
            raise ConfigError(f"model.z_loss and model.mtp_weight must be >= 0, got "
                              f"{self.z_loss} and {self.mtp_weight}")
        if self.act_clamp is not None and not self.gated:  # it clamps act(gate) * up
            gated = [o.name for o in options.declared("act") if o.gated]
            raise ConfigError(f"model.act_clamp clamps a gated FFN's activations; act={self.act} is "
                              f"not gated (use {', '.join(gated)}) or set it to null")

    def _check_base(self) -> None:
        for key in ("base_width", "base_depth"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"model.{key} must be a positive integer or null (the run's own "
                                  f"shape), got {value}")
        if not options.get("param", self.param).width:
            return
        if self.base_width % self.n_heads:
            raise ConfigError(
                f"model.base_width={self.base_width} is not divisible by model.n_heads={self.n_heads} "
                f"(param={self.param} reads the base head dim from it); pick a multiple of {self.n_heads}")
        # Width-dependent embedding scales would undo muP's width-independent embeddings
        # (docs/parametrization.md); arch=vaswani sets both.
        bad = [(key, str(value).lower(), fix) for key, value, fix in (("model.init", self.init, "normal"),
                                                                      ("model.emb_scale", self.emb_scale, "false"))
               if str(value).lower() != fix]
        if bad:  # every conflicting key at once
            raise ConfigError(f"{' and '.join(f'{k}={v}' for k, v, _ in bad)} scale{'s' * (len(bad) == 1)} the "
                              f"embeddings with the width, which param={self.param} keeps width-independent: set "
                              f"{' '.join(f'{k}={fix}' for k, _, fix in bad)} or use param=sp")

    @classmethod
    def from_config(cls, cfg: Any, tokenizer_vocab: Optional[int] = None) -> "ModelSpec":
        """Resolve derived sizes: n_kv_heads from the attn axis, d_ff from ffn_ratio, the vocab."""
        from ablate.data.tokenizers import TOKENIZERS

        m = cfg.model
        if tokenizer_vocab is None:
            tokenizer_vocab = TOKENIZERS.get(cfg.tokenizer.name).vocab_size
        if m.vocab_size is None:
            vocab = round_up(tokenizer_vocab, VOCAB_MULTIPLE)
        else:
            vocab = int(m.vocab_size)
            if vocab < tokenizer_vocab:
                raise ConfigError(
                    f"model.vocab_size={vocab} is smaller than tokenizer={cfg.tokenizer.name}'s "
                    f"{tokenizer_vocab} ids; raise it or leave it null")
        if m.n_kv_heads is not None:
            n_kv = int(m.n_kv_heads)
            options.check_kv_heads(cfg.attn.name, m.n_heads, n_kv, explicit=True)
        else:
            n_kv = options.get("attn", cfg.attn.name).n_kv_heads(m.n_heads, cfg.attn.kv_group)
        act = cfg.act.name
        bias = options.get("bias", cfg.bias.name).value
        d_ff = ffn_width(m, m.d_model, act, bias)
        base_width = m.get("base_width")  # absent from configs saved before it existed
        # the base model's FFN by the same rule at its width (an explicit d_ff: scaled with it)
        base_d_ff = None if base_width is None or m.d_ff is not None else ffn_width(m, base_width, act, bias)
        dropout_on = options.get("dropout", cfg.dropout.name).value
        attn_rate = cfg.dropout.get("attn")  # absent from configs saved before it existed
        return cls(
            vocab_size=vocab, d_model=m.d_model, n_layers=m.n_layers, n_heads=m.n_heads,
            n_kv_heads=n_kv, d_ff=d_ff, max_seq_len=m.max_seq_len,
            norm=cfg.norm.name, norm_eps=float(cfg.norm.eps), norm_pos=cfg.norm_pos.name,
            act=act, pos=cfg.pos.name, rope_base=float(cfg.pos.base), attn=cfg.attn.name,
            ffn=axis_name(cfg, "ffn"),
            tied=options.get("tie", cfg.tie.name).value, bias=bias,
            dropout=float(cfg.dropout.rate) if dropout_on else 0.0,
            attn_dropout=float(attn_rate) if dropout_on and attn_rate is not None else None,
            qk_norm=options.get("qk_norm", cfg.qk_norm.name).value,
            init=str(m.get("init", "normal")), init_std=m.init_std, depth_scaled_init=m.depth_scaled_init, emb_scale=m.emb_scale,
            parallel_block=m.parallel_block, z_loss=m.z_loss, attn_softcap=m.attn_softcap,
            logit_softcap=m.logit_softcap, act_clamp=m.act_clamp, mtp_heads=m.mtp_heads,
            mtp_weight=m.mtp_weight, tokenizer_vocab=tokenizer_vocab, settings=config_settings(cfg),
            param=cfg.param.name if "param" in cfg else options.AXES["param"].default,
            base_width=base_width, base_depth=m.get("base_depth"), base_d_ff=base_d_ff,
            ffn_multiple_of=int(m.ffn_multiple_of),
        )

    def to_dict(self) -> dict:
        """The flat view as JSON values: each component axis by its option's name, `settings`
        only when a chosen option has some, `ffn_multiple_of` only when not its default.
        ModelSpec(**spec.to_dict()) == spec."""
        out = asdict(self)
        for axis in options.component_axes():
            out[axis] = str(getattr(self, axis))
        if out["ffn_multiple_of"] == FFN_MULTIPLE:
            del out["ffn_multiple_of"]
        settings = out.pop("settings")
        return {**out, "settings": settings.to_dict()} if settings else out


def axis_name(cfg: Any, axis: str) -> str:
    """The config's option of `axis`; its default for a config saved before the axis existed."""
    return str(cfg[axis].name) if axis in cfg else options.AXES[axis].default


def ffn_width(m: Any, d_model: int, act: str, bias: bool) -> int:
    """d_ff of a model of width d_model with config `m`: model.d_ff when set, else ffn_ratio x
    d_model (gated: the width nearest in parameters to that plain FFN)."""
    if m.d_ff is not None:
        return int(m.d_ff)
    d_ff = int(m.ffn_ratio * d_model)
    if options.get("act", act).gated:  # three matrices: ~2/3 of the width keeps params equal
        d_ff = gated_d_ff(d_ff, d_model, m.ffn_multiple_of, bias)
    return d_ff


def config_settings(cfg: Any) -> dict[str, dict[str, Any]]:
    """The chosen options' settings (the axis's and their own) as the config gives them: a config
    saved before a setting (or its axis) existed lacks its key, and ModelSpec fills in the default."""
    out = {}
    for axis in options.component_axes():
        if axis not in cfg:
            continue
        keys = options.get(axis, cfg[axis].name).all_settings
        given = {key: cfg[axis][key] for key in keys if key in cfg[axis]}
        if given:
            out[axis] = given
    return out


def layers(spec: ModelSpec, axis: str) -> list[tuple[int, Any]]:
    """(layer index, the declaration of its `axis` component) for every layer."""
    option = options.get(axis, getattr(spec, axis))
    return [(layer, option) for layer in range(spec.n_layers)]


def count_params(spec: ModelSpec) -> dict[str, int]:
    """Analytic parameter count by component (tied weights counted once, in `embedding`): over
    the layers, each component's declared count (ablate/model/options.py)."""
    d = spec.d_model
    norm = options.get("norm", spec.norm).count(spec, d)  # one norm of width d
    block = options.get("norm_pos", spec.norm_pos)
    final_norm = norm if block.final_norm else 0
    embedding = spec.vocab_size * d
    position = options.get("pos", spec.pos).count(spec)
    head = 0 if spec.tied else spec.vocab_size * d
    mtp = spec.mtp_heads * (norm + d * d)  # each: norm + d x d projection, shared unembedding
    out = {
        "embedding": embedding + position,
        "attention": sum(attn.count(spec, layer) for layer, attn in layers(spec, "attn")),
        "ffn": sum(ffn.count(spec, layer) for layer, ffn in layers(spec, "ffn")),
        "norm": sum(block.count(spec, norm, layer) for layer in range(spec.n_layers)) + final_norm,
        "head": head + mtp,
    }
    out["total"] = sum(out.values())
    return out


def active_params(spec: ModelSpec) -> int:
    """The parameters one token uses: the total less each component's inactive ones (a routed
    FFN's unchosen experts); the total for a dense model."""
    inactive = sum(option.count(spec, layer) - option.count_active(spec, layer)
                   for axis in ("attn", "ffn") for layer, option in layers(spec, axis))
    return count_params(spec)["total"] - inactive


def non_embedding_params(spec: ModelSpec) -> int:
    p = count_params(spec)
    return p["total"] - p["embedding"] - (0 if spec.tied else spec.vocab_size * spec.d_model)


def active_non_embedding_params(spec: ModelSpec) -> int:
    """The non-embedding parameters one token uses (a ladder sizes an MoE's tokens by them)."""
    return non_embedding_params(spec) - (count_params(spec)["total"] - active_params(spec))


def flops_per_token(spec: ModelSpec, seq_len: int) -> int:
    """Training FLOPs per token (PaLM appendix B: 6 * N + 12 * L * d_attn * T for MHA): each
    layer's attention and FFN components' own (ablate/model/component.py), plus 6 x the output
    head's d x V weights (a tied head is still a matmul) and the MTP heads' matmuls."""
    d, V = spec.d_model, spec.vocab_size
    layer_flops = sum(option.train_flops(spec, layer, seq_len)
                      for axis in ("attn", "ffn") for layer, option in layers(spec, axis))
    return int(layer_flops + 6 * (V * d + spec.mtp_heads * d * (d + V)))


def cache_layouts(spec: ModelSpec) -> list[CacheLayout]:
    """Each layer's decode cache, as its attention component declares it."""
    return [attn.cache_layout(spec, layer) for layer, attn in layers(spec, "attn")]


def kv_cache_bytes(spec: ModelSpec, context: int, bytes_per_elem: int = 2) -> int:
    """Bytes of one sequence's decode cache after `context` tokens, every layer."""
    return sum(layout.bytes(context, bytes_per_elem) for layout in cache_layouts(spec))


def kv_cache_bytes_per_token(spec: ModelSpec, bytes_per_elem: int = 2, context: Optional[int] = None) -> int:
    """Bytes per token of context, every layer: the cache after `context` tokens over `context`
    (rounded to a byte; a sliding layer keeps at most its window's positions, so the figure
    falls as the context grows past W); None: each cached position's bytes, the same for a
    model whose layers keep every position."""
    if context is None:
        return sum(layout.bytes_per_position(bytes_per_elem) for layout in cache_layouts(spec))
    return round(kv_cache_bytes(spec, context, bytes_per_elem) / context)
