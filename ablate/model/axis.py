"""How an axis option is declared: once, by one `register_option` call (torch-free).

A declaration carries everything the project knows about an option, side by side (as OLMo-core's
config classes hold `build()` and `num_params()`): its axis and name, its implementation (a class
or function, or its "module:attr" path, imported on first use so that `ablate axes`, `inspect` and
config checks need no torch), the parameters it adds as a function of the ModelSpec, and the
values its config group sets. The name lists, the Hydra config groups, `inspect`'s counts and
FLOPs, `ablate axes` and the tests all read these declarations. The built-in options are declared
in ablate/model/options.py; a plugin module (ablate/plugins.py) calls the same function.

What each axis's implementation is (`impl`), and its count (`params`; None: counted on the class,
built on the meta device, which imports torch: built-in options declare theirs):
  norm      a class `impl(d, eps=, bias=)` -> nn.Module;   params(spec, d): one norm of width d
  norm_pos  a Block class `impl(spec, make_norm)`;          params(spec, norm): a block's own
            parameters besides attention and FFN, given one norm's count; final_norm: whether
            the model norms the last block's output
  act       a function of a tensor;                        gated: a GLU (three FFN matrices);
            relu_family: it outputs exact zeros (diagnostics count dead units)
  pos       a Positional class `impl(spec)`;                params(spec)
  attn      a function `(n_heads, kv_group) -> n_kv_heads`; fits(n_heads, n_kv): what an
            explicit model.n_kv_heads must satisfy, `needs` says it in words
  tie, bias, dropout, qk_norm: the bool the option sets
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

from ablate.errors import ConfigError

Spec = Any  # ablate.model.spec.ModelSpec (which imports this module, so not imported here)


@dataclass(frozen=True)
class Option:
    axis: str
    name: str
    impl: Any  # the implementation, or "module:attr" (imported by load())
    config: Mapping[str, Any] = field(default_factory=dict)  # its config group's values besides name
    plugin: Optional[str] = None  # the plugin module that registered it; None: built in

    def load(self) -> Any:
        if not isinstance(self.impl, str):
            return self.impl
        module, _, attr = self.impl.partition(":")
        return getattr(importlib.import_module(module), attr)


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

    def build(self, d: int, eps: float, bias: bool) -> Any:
        return self.load()(d, eps=eps, bias=bias)

    def count(self, spec: Spec, d: int) -> int:
        if self.params is not None:
            return self.params(spec, d)
        return _numel(_on_meta(lambda: self.build(d, spec.norm_eps, spec.bias)))


@dataclass(frozen=True)
class BlockOption(Option):
    params: Optional[Callable[[Spec, int], int]] = None
    final_norm: bool = True

    def build(self, spec: Spec, make_norm: Callable[[int], Any]) -> Any:
        return self.load()(spec, make_norm)

    def count(self, spec: Spec, norm: int) -> int:
        if self.params is not None:
            return self.params(spec, norm)
        make_norm = norm_factory(spec.norm, spec.norm_eps, spec.bias)
        block = _on_meta(lambda: self.build(spec, make_norm))
        return _numel(block) - _numel(block.attn) - _numel(block.ffn)


@dataclass(frozen=True)
class ActOption(Option):
    gated: bool = False
    relu_family: bool = False  # outputs exact zeros, so a unit can die (diagnostics count them)


@dataclass(frozen=True)
class PosOption(Option):
    params: Optional[Callable[[Spec], int]] = None

    def build(self, spec: Spec) -> Any:
        return self.load()(spec)

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


AXES: dict[str, Axis] = {}  # in the order axes are listed and used in run names
_OPTIONS: dict[str, dict[str, Option]] = {}
_plugin: Optional[str] = None  # the plugin module being imported (ablate.plugins.load)
_hydra = False  # whether options go into Hydra's ConfigStore as they are registered


def declare_axis(name: str, kind: type, default: str, **config: Any) -> Axis:
    AXES[name] = Axis(name, kind, default, config)
    _OPTIONS[name] = {}
    return AXES[name]


def register_option(axis: str, name: str, impl: Any, *, config: Optional[Mapping[str, Any]] = None,
                    **declared: Any) -> Any:
    """Declare option `name` of `axis`: `impl` and the fields of that axis's kind (params=,
    final_norm=, gated=, ...; see this module's docstring), and `config`, the values its config
    group sets besides `name` (the axis's keys, e.g. {"eps": 1e-6} for a norm). Returns `impl`."""
    if axis not in AXES:
        raise ValueError(f"register_option: unknown axis '{axis}'; axes: {', '.join(AXES)}")
    kind = AXES[axis].kind
    if axis == "act" and hasattr(impl, "fn") and hasattr(impl, "gated"):  # an ffn.Activation
        declared = {"gated": impl.gated, "relu_family": getattr(impl, "relu_family", False), **declared}
        impl = impl.fn
    unknown = set(config or {}) - set(AXES[axis].config)
    fields = {f.name for f in dataclasses.fields(kind)} - {f.name for f in dataclasses.fields(Option)}
    if set(declared) - fields or unknown:
        bad = sorted(set(declared) - fields) or sorted(unknown)
        raise ValueError(f"register_option: {axis} option '{name}' got '{bad[0]}'; {axis} takes "
                         f"{', '.join(sorted(fields)) or 'no field'} and config keys "
                         f"{', '.join(AXES[axis].config) or '(none)'}")
    if name in _OPTIONS[axis]:
        raise ValueError(f"{axis}: option '{name}' registered twice")
    option = kind(axis=axis, name=name, impl=impl, config=dict(config or {}), plugin=_plugin, **declared)
    _OPTIONS[axis][name] = option
    if _hydra:
        _store(option)
    return impl


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


def norm_factory(name: str, eps: float, bias: bool) -> Callable[[int], Any]:
    option = get("norm", name)
    return lambda d: option.build(d, eps, bias)


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


def _store(option: Option) -> None:
    from hydra.core.config_store import ConfigStore

    conf = conf_dir_of(sys.modules.get(option.plugin)) if option.plugin else None
    if conf is not None and (conf / option.axis / f"{option.name}.yaml").is_file():
        return  # the plugin's own file is the option's config (both: Hydra warns, schema matching)
    ConfigStore.instance().store(group=option.axis, name=option.name,
                                 node={"name": option.name, **option.config}, provider="ablate")


def store_in_hydra() -> None:
    """Put every option (and those registered later) in Hydra's ConfigStore, where the config
    groups find them: `norm=rmsnorm` composes the declaration's {name, **config}."""
    global _hydra
    from hydra.core.config_store import ConfigStore

    for options in _OPTIONS.values():
        for option in options.values():
            _store(option)
    ConfigStore.instance().store(name=AXES_DEFAULTS, provider="ablate",
                                 node={"defaults": [{a: ax.default} for a, ax in AXES.items()]})
    _hydra = True
