"""How an axis option is declared: once, by one `register_option` call (torch-free).

A declaration carries everything the project knows about an option, side by side (as OLMo-core's
config classes hold `build()` and `num_params()`): its axis and name, its implementation (a class
or function, or its "module:attr" path, imported on first use so that `ablate axes`, `inspect` and
config checks need no torch), its parameters, the values its config group sets, and its own
settings (`settings={"alpha0": 0.5}`). The name lists, the Hydra config groups, `inspect`'s
counts and FLOPs, `ablate axes` and the tests all read these declarations. The built-in options
are declared in ablate/model/options.py; a plugin module (ablate/plugins.py) calls the same function.

Settings are typed by their declaration: a default of a bool, int, float or str types its key, and
`setting(None, int)` declares an optional int that is null by default (`attn.window=1024` composes
as 1024, `attn.window=1.5` is refused). An axis may declare settings every option of it has
(`declare_axis(..., settings={...})`), an option settings of its own. A setting takes one path:
its config group node (`norm=dyt norm.alpha0=1.0`, typed by the option's schema, a subclass of the
axis's), then the ModelSpec (its typed config of the axis, `spec.norm.alpha0`, and the flat view
`spec.settings`), then keyword arguments of the implementation. The component axes (norm,
norm_pos, act, pos, attn, ffn) take settings; the flag axes and param are values components read.

What each axis's implementation is (`impl`), and what else its declaration says:
  norm      a class `impl(d, eps=, bias=, **settings)`;     params(spec, d): one norm of width d;
            normalizes: its output's scale does not follow its input's (False: DyT)
  norm_pos  a Block class `impl(spec, make_norm, **settings)` (ablate/model/blocks.py: its layer
            index is `self.layer`); params(spec, norm): a block's own parameters besides attention
            and FFN, given one norm's count; final_norm: whether the model norms the last output
  act       a function `impl(x, **settings)` of a tensor;  gated: a GLU (three FFN matrices);
            relu_family: it outputs exact zeros (the dense FFN reports dead units)
  pos       a Positional class `impl(spec, **settings)`;    params(spec)
  attn, ffn components (ablate/model/component.py states the contract): a module class or
            factory `impl(spec, layer, **settings)` whose modules are Sublayers; params(spec,
            layer), active(spec, layer) (None: = params), flops(spec, layer, seq_len) (None:
            6 x active params), cache(spec, layer) -> CacheLayout (attn; None: keys and values of
            n_kv_heads x head_dim), losses=(names of its auxiliary terms), stats={name: Reduce},
            check(spec): refuses what it cannot build (one line).
            attn also: kv_heads(n_heads, kv_group) -> n_kv_heads; fits(n_heads, n_kv): what an
            explicit model.n_kv_heads must satisfy, `needs` says it in words (no_kv_heads: why
            any explicit value is refused); flops_formula and cache_formula: inspect's formulas
            in words; rope_width(spec): the dims RoPE rotates (None: head_dim); details(spec,
            layer, seq_len): inspect's view of its shape and costs (MLA: ranks, parameters by
            projection, decode FLOPs)
  tie, bias, dropout, qk_norm: the bool the option sets
  optim     the optimizer of the hidden matrices (the trainer's axis, not in ModelSpec: its keys
            reach ablate/train/optimizer.py as an OptimSpec); state_per_param: its fp32 state
            tensors per parameter (the micro-batch probe's optimizer memory)
  param     the parametrization (ablate/model/parametrization.py): width: muP's width rules
            (hidden-matrix init and LR by fan-in, readout and attention multipliers);
            depth_alpha: the residual branches scaled by (base_depth / n_layers)^alpha
            (CompleteP, alpha = 1; None: no depth rules)
A count left None (params=) is counted on the module built on the meta device (imports torch).
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import importlib
import sys
from collections.abc import Mapping as MappingABC
from contextlib import contextmanager
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Mapping, Optional

from ablate.errors import ConfigError
from ablate.model.component import CacheLayout, Reduce, Sublayer, kv_layout

Spec = Any  # ablate.model.spec.ModelSpec (which imports this module, so not imported here)

SETTING_TYPES = (bool, int, float, str)
_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
# Names a setting cannot take: the node's `name`, and the typed config's own attributes.
RESERVED = ("name", "option", "settings", "axis")


@dataclass(frozen=True)
class Setting:
    """A config key's default and type: `setting(None, int)` is an optional integer, null by
    default; a plain default (0.5) declares a key of that default's type."""

    default: Any
    type: type
    optional: bool = False  # null is a value (always when the default is null)

    @property
    def annotation(self) -> Any:
        return Optional[self.type] if self.optional else self.type

    def check(self, key: str, value: Any) -> Any:
        """`value` as this key's type (an integer for a float key becomes a float); ConfigError,
        one line naming the key, for anything else."""
        if value is None and self.optional:
            return None
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if type(value) is self.type:
            return value
        null = " or null" if self.optional else ""
        raise ConfigError(f"{key}={value!r} must be {_TYPE_WORDS[self.type]}{null}")


def setting(default: Any, type: Optional[type] = None, optional: bool = False) -> Setting:
    """A typed setting: `setting(None, int)` (an optional int, null by default), `setting(4,
    optional=True)` (an int that may be null); `setting(0.5)` is what a plain 0.5 declares."""
    kind = type if type is not None else (None if default is None else default.__class__)
    if kind not in SETTING_TYPES:
        raise ValueError(f"setting({default!r}): a setting is a bool, int, float or str (or null with its "
                         "type: setting(None, int))")
    out = Setting(default, kind, optional or default is None)
    if default is not None:
        out.check("default", default)
    return out


def _as_setting(where: str, key: str, value: Any) -> Setting:
    if isinstance(value, Setting):
        return value
    if value is None or type(value) not in SETTING_TYPES:
        raise ValueError(f"{where}: setting '{key}' needs a bool, int, float or str default (it types the "
                         f"config key), or setting(None, int) for a key that is null by default; got {value!r}")
    return setting(value)


def _schema(name: str, values: Mapping[str, Setting], base: Optional[type] = None) -> type:
    """A config node's dataclass: each key typed by its declaration."""
    fields = [(key, s.annotation, field(default=s.default)) for key, s in values.items()]
    return make_dataclass(name, fields, bases=(base,) if base else ())


def _camel(name: str) -> str:
    return "".join(part.title() for part in "".join(c if c.isalnum() else "_" for c in name).split("_"))


class AxisConfig:
    """One component axis's choice in a ModelSpec (`spec.attn`, `spec.ffn`, `spec.norm`, ...):
    the option's `name` and its settings as typed attributes (`spec.norm.alpha0` with norm=dyt),
    the axis's and the option's own. Each option has its frozen dataclass of this base
    (Option.config_type). It compares equal to its name, hashes and prints as it (as a
    names.Status does), so `spec.pos == "rope"` and `f"pos={spec.pos}"` read as they always have."""

    name: str
    axis: ClassVar[str] = ""

    @property
    def option(self) -> Any:
        return get(self.axis, self.name)

    @property
    def settings(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "name"}

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, str):
            return self.name == other
        if isinstance(other, AxisConfig):
            return (self.axis, self.name, self.settings) == (other.axis, other.name, other.settings)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.name)  # equal to its name: hashes as it

    def __str__(self) -> str:
        return self.name

    def __format__(self, spec: str) -> str:
        return format(self.name, spec)

    def __repr__(self) -> str:
        return repr(self.name)

    def __reduce__(self):  # its class is made by make_dataclass: rebuilt from the declaration
        return _axis_config, (self.axis, self.name, self.settings)

    def __deepcopy__(self, memo: dict) -> "AxisConfig":
        return self  # immutable


def _axis_config(axis: str, name: str, settings: Mapping[str, Any]) -> AxisConfig:
    return get(axis, name).config_of(settings)


@dataclass(frozen=True)
class Option:
    axis: str
    name: str
    impl: Any  # the implementation, or "module:attr" (imported by load())
    config: Mapping[str, Any] = field(default_factory=dict)  # its config group's values besides name
    plugin: Optional[str] = None  # the plugin module that registered it; None: built in
    settings: Mapping[str, Setting] = field(default_factory=dict)  # its own keys, typed
    takes_settings: ClassVar[bool] = False  # a component axis: settings reach it

    def load(self) -> Any:
        if not isinstance(self.impl, str):
            return self.impl
        module, _, attr = self.impl.partition(":")
        return getattr(importlib.import_module(module), attr)

    @property
    def all_settings(self) -> dict[str, Setting]:
        """The axis's settings, then its own."""
        return {**AXES[self.axis].settings, **self.settings}

    @functools.cached_property
    def schema(self) -> type:
        """Its config node's dataclass: the axis's, plus its own settings (Hydra checks
        `norm.alpha0=abc` and `norm.foo=1` against it at compose time)."""
        base = AXES[self.axis].schema
        if not self.settings:
            return base
        return _schema(f"{_camel(self.axis)}{_camel(self.name)}Config", self.settings, base)

    @functools.cached_property
    def config_type(self) -> type:
        """The typed config a ModelSpec holds for this option (an AxisConfig dataclass)."""
        fields = [("name", str, field(default=self.name))]
        fields += [(key, s.annotation, field(default=s.default)) for key, s in self.all_settings.items()]
        cls = make_dataclass(f"{_camel(self.axis)}{_camel(self.name)}Choice", fields, bases=(AxisConfig,),
                             frozen=True, eq=False, repr=False)
        cls.axis = self.axis
        return cls

    def config_of(self, given: Optional[Mapping[str, Any]] = None) -> AxisConfig:
        """Its typed config: the declared defaults, overridden by `given` (typed by the
        declaration); a key it does not declare raises ConfigError listing those it does."""
        declared = self.all_settings
        unknown = sorted(set(given or {}) - set(declared))
        if unknown:
            valid = ", ".join(declared) or "none"
            raise ConfigError(f"{self.axis}.{unknown[0]} is not a setting of {self.axis}={self.name}; "
                              f"its settings: {valid}")
        values = {key: s.default for key, s in declared.items()}
        values.update({key: declared[key].check(f"{self.axis}.{key}", v) for key, v in (given or {}).items()})
        return self.config_type(**values)


def _numel(module: Any) -> int:
    return sum(p.numel() for p in module.parameters())


def _on_meta(build: Callable[[], Any]) -> Any:
    """Build a module on the meta device (no memory, no init cost) to count its parameters."""
    import torch

    with torch.device("meta"):
        return build()


@dataclass(frozen=True)
class NormOption(Option):
    params: Optional[Callable[[Spec, int], int]] = None
    # Its output's scale does not follow its input's (LayerNorm, RMSNorm: RMS ~1 times the gain).
    # False (DyT: tanh(alpha0 * x) ~ alpha0 * x near 0): what reads it starts at its input's scale.
    normalizes: bool = True
    takes_settings: ClassVar[bool] = True

    def build(self, d: int, eps: float, bias: bool, settings: Mapping[str, Any]) -> Any:
        return self.load()(d, eps=eps, bias=bias, **settings)

    def count(self, spec: Spec, d: int) -> int:
        if self.params is not None:
            return self.params(spec, d)
        return _numel(_on_meta(lambda: norm_factory(spec)(d)))


# The layer a block is being built for: Block.__init__ reads it, so a plugin block written to
# `impl(spec, make_norm)` (before blocks knew their index) gets it without a new argument.
_building_layer: contextvars.ContextVar[int] = contextvars.ContextVar("building_layer", default=0)


def building_layer() -> int:
    """The index of the layer BlockOption.build is building (0 outside it)."""
    return _building_layer.get()


@dataclass(frozen=True)
class BlockOption(Option):
    params: Optional[Callable[[Spec, int], int]] = None
    final_norm: bool = True
    takes_settings: ClassVar[bool] = True

    def build(self, spec: Spec, make_norm: Callable[[int], Any], layer: int = 0) -> Any:
        token = _building_layer.set(layer)
        try:
            return self.load()(spec, make_norm, **spec.settings.of(self.axis))
        finally:
            _building_layer.reset(token)

    def count(self, spec: Spec, norm: int, layer: int = 0) -> int:
        if self.params is not None:
            return self.params(spec, norm)
        block = _on_meta(lambda: self.build(spec, norm_factory(spec), layer))
        return _numel(block) - _numel(block.attn) - _numel(block.ffn)


@dataclass(frozen=True)
class ActOption(Option):
    gated: bool = False
    relu_family: bool = False  # outputs exact zeros, so a unit can die (diagnostics count them)
    takes_settings: ClassVar[bool] = True

    def function(self, spec: Spec) -> Callable[[Any], Any]:
        """The activation with the spec's settings for it bound."""
        settings = spec.settings.of(self.axis)
        return functools.partial(self.load(), **settings) if settings else self.load()


@dataclass(frozen=True)
class PosOption(Option):
    params: Optional[Callable[[Spec], int]] = None
    takes_settings: ClassVar[bool] = True

    def build(self, spec: Spec) -> Any:
        return self.load()(spec, **spec.settings.of(self.axis))

    def count(self, spec: Spec) -> int:
        if self.params is not None:
            return self.params(spec)
        return _numel(_on_meta(lambda: self.build(spec)))


@dataclass(frozen=True)
class ComponentOption(Option):
    """An attention or FFN option: a LayerComponent (ablate/model/component.py)."""

    params: Optional[Callable[[Spec, int], int]] = None  # None: counted on the module built on meta
    active: Optional[Callable[[Spec, int], int]] = None  # None: every parameter is active
    flops: Optional[Callable[[Spec, int, int], int]] = None  # None: 6 x active params (PaLM's 6N)
    cache: Optional[Callable[[Spec, int], Optional[CacheLayout]]] = None
    losses: tuple[str, ...] = ()
    stats: Mapping[str, Reduce] = field(default_factory=dict)
    # refuses a spec it cannot build, in one line (ConfigError): a combination or a setting's value
    check: Optional[Callable[[Spec], None]] = None
    takes_settings: ClassVar[bool] = True

    def build(self, spec: Spec, layer: int) -> Any:
        module = self.load()(spec, layer, **spec.settings.of(self.axis))
        if not isinstance(module, Sublayer):
            raise ConfigError(f"{self.axis}={self.name} built a {type(module).__name__}, which is not a Sublayer: "
                              "derive its class from ablate.model.component.Sublayer (docs/extending.md)")
        return module

    def count(self, spec: Spec, layer: int) -> int:
        if self.params is not None:
            return self.params(spec, layer)
        return _numel(_on_meta(lambda: self.build(spec, layer)))

    def count_active(self, spec: Spec, layer: int) -> int:
        return self.count(spec, layer) if self.active is None else self.active(spec, layer)

    def train_flops(self, spec: Spec, layer: int, seq_len: int) -> int:
        if self.flops is not None:
            return self.flops(spec, layer, seq_len)
        return 6 * self.count_active(spec, layer)

    def cache_layout(self, spec: Spec, layer: int) -> Optional[CacheLayout]:
        return None if self.cache is None else self.cache(spec, layer)


@dataclass(frozen=True)
class AttnOption(ComponentOption):
    kv_heads: Optional[Callable[[int, int], int]] = None  # (n_heads, kv_group) -> n_kv_heads; None: n_heads
    fits: Optional[Callable[[int, int], bool]] = None  # (n_heads, n_kv_heads): None accepts any
    needs: str = ""  # what fits() demands, with {n_heads}: "model.n_kv_heads=1"
    flops_formula: str = ""  # inspect's FLOPs/token formula in words (empty: a generic sentence)
    cache_formula: str = ""  # inspect's KV bytes/token formula in words
    # why an explicit model.n_kv_heads means nothing to it (empty: fits() judges the value)
    no_kv_heads: str = ""
    rope_width: Optional[Callable[[Spec], int]] = None  # the dims RoPE rotates per head; None: head_dim
    details: Optional[Callable[[Spec, int, int], Mapping[str, Any]]] = None  # inspect's view of a layer at a seq_len

    def rotary_dim(self, spec: Spec) -> int:
        return spec.head_dim if self.rope_width is None else self.rope_width(spec)

    def n_kv_heads(self, n_heads: int, kv_group: int) -> int:
        return n_heads if self.kv_heads is None else self.kv_heads(n_heads, kv_group)

    def cache_layout(self, spec: Spec, layer: int) -> Optional[CacheLayout]:
        if self.cache is None:  # an attention that caches keys and values, as most do
            return kv_layout(spec.n_kv_heads, spec.head_dim)
        return self.cache(spec, layer)


@dataclass(frozen=True)
class FfnOption(ComponentOption):
    pass


@dataclass(frozen=True)
class ParamOption(Option):
    width: bool = False  # muP's width rules, relative to model.base_width
    depth_alpha: Optional[float] = None  # CompleteP's depth rules, relative to model.base_depth


@dataclass(frozen=True)
class OptimOption(Option):
    """Axis `optim`, the trainer's (not in ModelSpec): impl is the optimizer of the hidden
    matrices ("module:attr"; AdamW takes the rest), built by ablate/train/optimizer.py."""
    state_per_param: int = 2  # fp32 state tensors its update keeps per parameter it takes


@dataclass(frozen=True)
class FlagOption(Option):
    @property
    def value(self) -> bool:
        return bool(self.impl)


@dataclass(frozen=True)
class Axis:
    name: str
    kind: type  # the Option subclass its declarations are
    default: str  # the option a run without overrides trains
    # its keys besides name that ModelSpec reads into fields of its own (norm.eps -> norm_eps)
    config: Mapping[str, Setting] = field(default_factory=dict)
    settings: Mapping[str, Setting] = field(default_factory=dict)  # keys every option of it has

    @functools.cached_property
    def schema(self) -> type:
        """Its config node's dataclass (ablate/config/schema.py): the option's name, the axis's keys
        and settings; an option with settings of its own has a subclass of it (Option.schema)."""
        return _schema(_camel(self.name) + "Config",
                       {"name": setting(self.default), **self.config, **self.settings})

    def defaults(self) -> dict[str, Any]:
        """Its keys and settings with their defaults (`ablate axes`)."""
        return {key: s.default for key, s in {**self.config, **self.settings}.items()}


class OptionSettings(MappingABC):
    """The chosen options' settings (the axis's and their own), {axis: {key: value}}
    (ModelSpec.settings, the flat view of its typed configs): immutable and hashable like the
    frozen spec that holds it; `of(axis)` is one option's keyword arguments."""

    def __init__(self, by_axis: Optional[Mapping[str, Mapping[str, Any]]] = None):
        self._by_axis = {axis: dict(values) for axis, values in (by_axis or {}).items()}

    def of(self, axis: str) -> dict[str, Any]:
        return dict(self._by_axis.get(axis, {}))

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {axis: dict(values) for axis, values in self._by_axis.items()}

    def __getitem__(self, axis: str) -> Mapping[str, Any]:
        return dict(self._by_axis[axis])

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_axis)

    def __len__(self) -> int:
        return len(self._by_axis)

    def __hash__(self) -> int:
        return hash(tuple((a, tuple(sorted(v.items()))) for a, v in sorted(self._by_axis.items())))

    def __deepcopy__(self, memo: dict) -> "OptionSettings":
        return self  # immutable (dataclasses.asdict deep-copies field values)

    def __repr__(self) -> str:
        return repr(self._by_axis)  # as messages show it: {'norm': {'alpha0': 0.5}}


def component_axes() -> list[str]:
    """The axes whose options are components (they take settings; the ModelSpec holds a typed
    config for each), in axis order."""
    return [axis for axis, ax in AXES.items() if ax.kind.takes_settings]


AXES: dict[str, Axis] = {}  # in the order axes are listed and used in run names
_OPTIONS: dict[str, dict[str, Option]] = {}
_plugin: Optional[str] = None  # the plugin module being imported (ablate.plugins.load)
_hydra = False  # whether options go into Hydra's ConfigStore as they are registered


def declare_axis(name: str, kind: type, default: str, settings: Optional[Mapping[str, Any]] = None,
                 **config: Any) -> Axis:
    """An axis: its kind, its default option, `config` (keys the ModelSpec resolves into fields
    of its own: norm.eps) and `settings` (typed keys every option of it has: they reach the
    typed config and the implementation as its other settings do)."""
    where = f"declare_axis: {name}"
    typed = {key: _as_setting(where, key, value) for key, value in config.items()}
    own = {key: _as_setting(where, key, value) for key, value in (settings or {}).items()}
    if own and not kind.takes_settings:
        raise ValueError(f"{where}: settings on an axis whose options take none")
    for key in own:
        _check_key(where, key, typed)
    AXES[name] = Axis(name, kind, default, typed, own)
    _OPTIONS[name] = {}
    return AXES[name]


def register_option(axis: str, name: str, impl: Any, *, config: Optional[Mapping[str, Any]] = None,
                    settings: Optional[Mapping[str, Any]] = None, **declared: Any) -> Any:
    """Declare option `name` of `axis`: `impl` and the fields of that axis's kind (params=,
    final_norm=, gated=, flops=, cache=, losses=, ...; see this module's docstring), `config`,
    the values its config group sets for the axis's keys (e.g. {"eps": 1e-6} for a norm), and
    `settings`, keys of its own with their defaults (e.g. {"alpha0": 0.5}, or
    {"rank": setting(None, int)}): they become keys of its config group node, attributes of the
    ModelSpec's typed config and keyword arguments of `impl`. Returns `impl`."""
    if axis not in AXES:
        raise ValueError(f"register_option: unknown axis '{axis}'; axes: {', '.join(AXES)}")
    kind = AXES[axis].kind
    known = {**AXES[axis].config, **AXES[axis].settings}
    unknown = set(config or {}) - set(known)
    fields = {f.name for f in dataclasses.fields(kind)} - {f.name for f in dataclasses.fields(Option)}
    if set(declared) - fields or unknown:
        bad = sorted(set(declared) - fields) or sorted(unknown)
        raise ValueError(f"register_option: {axis} option '{name}' got '{bad[0]}'; {axis} takes "
                         f"{', '.join(sorted(fields)) or 'no field'} and config keys "
                         f"{', '.join(known) or '(none)'}")
    typed = _check_settings(axis, name, kind, settings or {})
    if name in _OPTIONS[axis]:
        raise ValueError(f"{axis}: option '{name}' registered twice")
    if "stats" in declared:
        declared["stats"] = {key: Reduce(value) for key, value in declared["stats"].items()}
    if "losses" in declared:
        declared["losses"] = tuple(declared["losses"])
    option = kind(axis=axis, name=name, impl=impl, config=dict(config or {}), plugin=_plugin,
                  settings=typed, **declared)
    _OPTIONS[axis][name] = option
    if _hydra:
        _store(option)
    return impl


def _check_key(where: str, key: str, taken: Mapping[str, Any]) -> None:
    if not key.isidentifier() or key in RESERVED or key in taken:
        raise ValueError(f"{where}: setting '{key}' must be a new identifier (not {', '.join(RESERVED)} or "
                         f"the axis's keys {', '.join(taken) or '(none)'})")


def _check_settings(axis: str, name: str, kind: type, settings: Mapping[str, Any]) -> dict[str, Setting]:
    """Settings are new keys of the option's node, typed, on an axis that passes them."""
    if not settings:
        return {}
    where = f"register_option: {axis} option '{name}'"
    if not kind.takes_settings:
        takers = ", ".join(a for a, ax in AXES.items() if ax.kind.takes_settings)
        raise ValueError(f"{where} got settings; only the options of {takers} take settings")
    taken = {**AXES[axis].config, **AXES[axis].settings}
    for key in settings:
        _check_key(where, key, taken)
    return {key: _as_setting(where, key, value) for key, value in settings.items()}


def get(axis: str, name: str) -> Any:
    try:
        return _OPTIONS[axis][name]
    except KeyError:
        raise ConfigError(f"unknown {axis} option '{name}'; valid options: {', '.join(names(axis))}") from None


def names(axis: str) -> list[str]:
    return list(_OPTIONS[axis])


def declared(axis: str) -> list[Any]:
    return list(_OPTIONS[axis].values())


def default(axis: str) -> Any:
    """The declaration of the axis's default option."""
    return get(axis, AXES[axis].default)


def norm_factory(spec: Spec, eps: Optional[float] = None) -> Callable[[int], Any]:
    """width -> the spec's norm (its eps unless `eps` is given, its bias, its settings)."""
    option = get("norm", spec.norm)
    eps = spec.norm_eps if eps is None else eps
    return lambda d: option.build(d, eps, spec.bias, spec.settings.of("norm"))


@contextmanager
def registering_for(module: str) -> Iterator[None]:
    """Options registered inside are attributed to plugin `module`."""
    global _plugin
    _plugin = module
    try:
        yield
    finally:
        _plugin = None


# ---- Hydra: each option is an option of its config group; the axes' defaults a defaults list --
AXES_DEFAULTS = "axes"  # conf/config.yaml lists it: every axis at its default option


def conf_dir_of(module: Any) -> Optional[Path]:
    """A plugin's `conf/`, beside the module's file (for a package's __init__, inside the package)."""
    file = getattr(module, "__file__", None)
    if not file:
        return None
    conf = Path(file).resolve().parent / "conf"
    return conf if conf.is_dir() else None


_stored: dict = {}  # (group, name) -> (what was stored, its ConfigStore entry)


def store_once(group: str, name: str, source: Any, node: Callable[[], Any], provider: Optional[str] = "ablate") -> None:
    """`node()` in Hydra's ConfigStore as group/name, unless the entry made from `source` is still
    there: storing again would cost ~4 ms an option at every composition, and a new entry
    object makes the compositions the test suite's memo keeps (tests/composition_memo.py) look
    stale."""
    from hydra.core.config_store import ConfigStore

    held = _stored.get((group, name))
    if held is not None and held[0] is source and held[1] is _entry(group, name):
        return
    ConfigStore.instance().store(group=group or None, name=name, node=node(), provider=provider)
    _stored[(group, name)] = (source, _entry(group, name))


def _entry(group: str, name: str) -> Any:
    from hydra.core.config_store import ConfigStore

    repo = ConfigStore.instance().repo
    for part in group.split("/") if group else ():
        repo = repo.get(part, {})
    return repo.get(f"{name}.yaml")


def _store(option: Option) -> None:
    conf = conf_dir_of(sys.modules.get(option.plugin)) if option.plugin else None
    if conf is not None and (conf / option.axis / f"{option.name}.yaml").is_file():
        return  # the plugin's own file is the option's config (both: Hydra warns, schema matching)
    store_once(option.axis, option.name, option, lambda: option.schema(name=option.name, **option.config))


def store_in_hydra() -> None:
    """Put every option (and those registered later) in Hydra's ConfigStore, where the config
    groups find them: `norm=rmsnorm` composes the declaration's {name, **config, **settings},
    typed by its schema."""
    global _hydra

    for options in _OPTIONS.values():
        for option in options.values():
            _store(option)
    store_once("", AXES_DEFAULTS, AXES, lambda: {"defaults": [{a: ax.default} for a, ax in AXES.items()]})
    _hydra = True
