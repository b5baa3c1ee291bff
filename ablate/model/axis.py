"""How an axis option is declared: once, by one `register_option` call (torch-free).

A declaration carries everything the project knows about an option, side by side (as OLMo-core's
config classes hold `build()` and `num_params()`): its axis and name, its implementation (a class
or function, or its "module:attr" path, imported on first use so that `ablate axes`, `inspect` and
config checks need no torch), the parameters it adds as a function of the ModelSpec, the values
its config group sets, and its own settings (`settings={"alpha0": 0.5}`: keys that only this
option has, typed by their defaults). The name lists, the Hydra config groups, `inspect`'s
counts and FLOPs, `ablate axes` and the tests all read these declarations. The built-in options
are declared in ablate/model/options.py; a plugin module (ablate/plugins.py) calls the same function.

An option's settings take one path: its config group node (`norm=dyt norm.alpha0=1.0`, typed by
the option's own schema, a subclass of the axis's), then ModelSpec.settings (the chosen options'
settings, by axis), then keyword arguments of its implementation. Only the axes whose option the
ModelSpec names (norm, norm_pos, act, pos) take settings.

What each axis's implementation is (`impl`), and its count (`params`; None: counted on the class,
built on the meta device, which imports torch: built-in options declare theirs):
  norm      a class `impl(d, eps=, bias=, **settings)`;     params(spec, d): one norm of width d;
            normalizes: its output's scale does not follow its input's (False: DyT)
  norm_pos  a Block class `impl(spec, make_norm, **settings)`; params(spec, norm): a block's own
            parameters besides attention and FFN, given one norm's count; final_norm: whether
            the model norms the last block's output
  act       a function `impl(x, **settings)` of a tensor;  gated: a GLU (three FFN matrices);
            relu_family: it outputs exact zeros (diagnostics count dead units)
  pos       a Positional class `impl(spec, **settings)`;    params(spec)
  attn      a function `(n_heads, kv_group) -> n_kv_heads`; fits(n_heads, n_kv): what an
            explicit model.n_kv_heads must satisfy, `needs` says it in words
  tie, bias, dropout, qk_norm: the bool the option sets
  optim     the optimizer of the hidden matrices (the trainer's axis, not in ModelSpec: its keys
            reach ablate/train/optimizer.py as an OptimSpec); state_per_param: its fp32 state
            tensors per parameter (the micro-batch probe's optimizer memory)
  param     the parametrization (ablate/model/parametrization.py): width: muP's width rules
            (hidden-matrix init and LR by fan-in, readout and attention multipliers);
            depth_alpha: the residual branches scaled by (base_depth / n_layers)^alpha
            (CompleteP, alpha = 1; None: no depth rules)
"""

from __future__ import annotations

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

Spec = Any  # ablate.model.spec.ModelSpec (which imports this module, so not imported here)


def _schema(name: str, values: Mapping[str, Any], base: Optional[type] = None) -> type:
    """A config node's dataclass: each key typed by its default (None: an optional float)."""
    fields = [(key, Optional[float] if value is None else type(value), field(default=value))
              for key, value in values.items()]
    return make_dataclass(name, fields, bases=(base,) if base else ())


def _camel(name: str) -> str:
    return "".join(part.title() for part in "".join(c if c.isalnum() else "_" for c in name).split("_"))


@dataclass(frozen=True)
class Option:
    axis: str
    name: str
    impl: Any  # the implementation, or "module:attr" (imported by load())
    config: Mapping[str, Any] = field(default_factory=dict)  # its config group's values besides name
    plugin: Optional[str] = None  # the plugin module that registered it; None: built in
    settings: Mapping[str, Any] = field(default_factory=dict)  # its own keys and their defaults
    takes_settings: ClassVar[bool] = False  # the ModelSpec names this axis's option (settings reach it)

    def load(self) -> Any:
        if not isinstance(self.impl, str):
            return self.impl
        module, _, attr = self.impl.partition(":")
        return getattr(importlib.import_module(module), attr)

    @functools.cached_property
    def schema(self) -> type:
        """Its config node's dataclass: the axis's, plus its own settings (Hydra checks
        `norm.alpha0=abc` and `norm.foo=1` against it at compose time)."""
        base = AXES[self.axis].schema
        if not self.settings:
            return base
        return _schema(f"{_camel(self.axis)}{_camel(self.name)}Config", self.settings, base)


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


@dataclass(frozen=True)
class BlockOption(Option):
    params: Optional[Callable[[Spec, int], int]] = None
    final_norm: bool = True
    takes_settings: ClassVar[bool] = True

    def build(self, spec: Spec, make_norm: Callable[[int], Any]) -> Any:
        return self.load()(spec, make_norm, **spec.settings.of(self.axis))

    def count(self, spec: Spec, norm: int) -> int:
        if self.params is not None:
            return self.params(spec, norm)
        block = _on_meta(lambda: self.build(spec, norm_factory(spec)))
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
class AttnOption(Option):
    fits: Optional[Callable[[int, int], bool]] = None  # (n_heads, n_kv_heads): None accepts any
    needs: str = ""  # what fits() demands, with {n_heads}: "model.n_kv_heads=1"

    def kv_heads(self, n_heads: int, kv_group: int) -> int:
        return self.load()(n_heads, kv_group)


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
    config: Mapping[str, Any] = field(default_factory=dict)  # its keys besides name, and their defaults

    @functools.cached_property
    def schema(self) -> type:
        """Its config node's dataclass (ablate/config/schema.py): the option's name and the axis's keys;
        an option with settings of its own has a subclass of it (Option.schema)."""
        return _schema(_camel(self.name) + "Config", {"name": self.default, **self.config})


class OptionSettings(MappingABC):
    """The chosen options' own settings, {axis: {key: value}} (ModelSpec.settings): immutable and
    hashable like the frozen spec that holds it; `of(axis)` is one option's keyword arguments."""

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


def chosen_settings(axis: str, name: str, given: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """Option `name`'s settings: its declared defaults, overridden by `given`; a key it does not
    declare raises ConfigError listing those it does."""
    option = get(axis, name)
    unknown = sorted(set(given or {}) - set(option.settings))
    if unknown:
        valid = ", ".join(option.settings) or "none"
        raise ConfigError(f"{axis}.{unknown[0]} is not a setting of {axis}={name}; its settings: {valid}")
    return {**option.settings, **(given or {})}


AXES: dict[str, Axis] = {}  # in the order axes are listed and used in run names
_OPTIONS: dict[str, dict[str, Option]] = {}
_plugin: Optional[str] = None  # the plugin module being imported (ablate.plugins.load)
_hydra = False  # whether options go into Hydra's ConfigStore as they are registered


def declare_axis(name: str, kind: type, default: str, **config: Any) -> Axis:
    AXES[name] = Axis(name, kind, default, config)
    _OPTIONS[name] = {}
    return AXES[name]


def register_option(axis: str, name: str, impl: Any, *, config: Optional[Mapping[str, Any]] = None,
                    settings: Optional[Mapping[str, Any]] = None, **declared: Any) -> Any:
    """Declare option `name` of `axis`: `impl` and the fields of that axis's kind (params=,
    final_norm=, gated=, ...; see this module's docstring), `config`, the values its config
    group sets for the axis's keys (e.g. {"eps": 1e-6} for a norm), and `settings`, keys of its
    own with their defaults (e.g. {"alpha0": 0.5}): they become keys of its config group node
    and keyword arguments of `impl`. Returns `impl`."""
    if axis not in AXES:
        raise ValueError(f"register_option: unknown axis '{axis}'; axes: {', '.join(AXES)}")
    kind = AXES[axis].kind
    unknown = set(config or {}) - set(AXES[axis].config)
    fields = {f.name for f in dataclasses.fields(kind)} - {f.name for f in dataclasses.fields(Option)}
    if set(declared) - fields or unknown:
        bad = sorted(set(declared) - fields) or sorted(unknown)
        raise ValueError(f"register_option: {axis} option '{name}' got '{bad[0]}'; {axis} takes "
                         f"{', '.join(sorted(fields)) or 'no field'} and config keys "
                         f"{', '.join(AXES[axis].config) or '(none)'}")
    _check_settings(axis, name, kind, settings or {})
    if name in _OPTIONS[axis]:
        raise ValueError(f"{axis}: option '{name}' registered twice")
    option = kind(axis=axis, name=name, impl=impl, config=dict(config or {}), plugin=_plugin,
                  settings=dict(settings or {}), **declared)
    _OPTIONS[axis][name] = option
    if _hydra:
        _store(option)
    return impl


def _check_settings(axis: str, name: str, kind: type, settings: Mapping[str, Any]) -> None:
    """Settings are new keys of the option's node, with a typed default, on an axis that passes them."""
    if not settings:
        return
    where = f"register_option: {axis} option '{name}'"
    if not kind.takes_settings:
        takers = ", ".join(a for a, ax in AXES.items() if ax.kind.takes_settings)
        raise ValueError(f"{where} got settings; only the options of {takers} take settings")
    for key, value in settings.items():
        if not key.isidentifier() or key == "name" or key in AXES[axis].config:
            raise ValueError(f"{where}: setting '{key}' must be a new identifier (not name or the "
                             f"axis's keys {', '.join(AXES[axis].config) or '(none)'})")
        if type(value) not in (bool, int, float, str):
            raise ValueError(f"{where}: setting '{key}' needs a bool, int, float or str default "
                             f"(it types the config key), got {value!r}")


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
    object makes the compositions ablate/config/compose.py keeps look stale."""
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
