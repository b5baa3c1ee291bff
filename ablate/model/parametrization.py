"""Axis `param`: how init, learning rates and multipliers follow the model's shape (torch-free
here; the per-parameter rules import torch when asked for).

sp is the standard parametrization (the model and optimizer as they are). mup (Yang et al. 2022,
"Tensor Programs V", and the `mup` package) and completep (Dey et al. 2025, "Don't be lazy")
scale them relative to a base shape, model.base_width / model.base_depth, so that the best
learning rate found at the base shape holds at other widths (and depths). At the base shape every
option trains exactly as sp (completep: as sp with model.depth_scaled_init=false).
docs/parametrization.md has each rule and its source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from ablate.model import options

Spec = Any  # ablate.model.spec.ModelSpec
ADAM_EPS = 1e-8  # torch's AdamW default: the base epsilon completep scales


@dataclass(frozen=True)
class Parametrization:
    """The multipliers of one ModelSpec under its `param` option (all 1 under sp)."""

    name: str
    width_mult: float  # d_model / base_width (1 without width rules)
    depth_mult: float  # n_layers / base_depth (1 without depth rules)
    logit_mult: float  # on the readout's input, before any soft-capping: 1 / width_mult
    # the attention logits' scale; None: 1/sqrt(head_dim) (SDPA's default, kept bit for bit)
    attn_scale: Optional[float]
    branch_mult: float  # each residual branch: depth_mult^-alpha
    eps_mult: float  # AdamW's epsilon: 1 / (width_mult * depth_mult^alpha) under completep
    depth_scaled_init: bool  # GPT-2's 1/sqrt(2L) output-projection init applies

    @classmethod
    def of(cls, spec: Spec) -> "Parametrization":
        option = options.get("param", spec.param)
        width = spec.d_model / spec.base_width if option.width else 1.0
        depth = spec.n_layers / spec.base_depth if option.depth_alpha is not None else 1.0
        alpha = option.depth_alpha or 0.0
        base_head_dim = spec.base_width // spec.n_heads
        scale = None if not option.width or base_head_dim == spec.head_dim else \
            math.sqrt(base_head_dim) / spec.head_dim
        # AdamW's epsilon follows the gradients' size under completep only (the mup package
        # leaves it); Dey et al.'s implementation scales it for every group alike
        eps = 1.0 / (width * depth ** alpha) if option.depth_alpha is not None else 1.0
        return cls(name=spec.param, width_mult=width, depth_mult=depth, logit_mult=1.0 / width,
                   attn_scale=scale, branch_mult=depth ** -alpha, eps_mult=eps,
                   depth_scaled_init=spec.depth_scaled_init and option.depth_alpha is None)


@dataclass(frozen=True)
class ParamRule:
    """One parameter's rule: multipliers of its sp init std, of the LR and of the weight decay."""

    role: str
    fan_in: Optional[int] = None  # hidden matrices: this model's and the base model's fan-in
    base_fan_in: Optional[int] = None
    init_mult: float = 1.0
    lr_mult: float = 1.0
    wd_mult: float = 1.0


HIDDEN_ROLES = ("input", "output")  # Role.INPUT, Role.OUTPUT: matrices whose both dims are widths
# Role.ROUTER: fan-in a width, fan-out the expert count. Taken as a hidden matrix by its fan-in,
# so its logits, which decide the routing, keep one size at every width at init and after updates
# (an output weight's rule, variance 1/fan_in^2, shrinks them as 1/sqrt(width_mult) and with them
# the gates: coord-check measured the MoE's FFN output shrinking with width under it, slope -0.22
# at step 3 over widths 64-256, against -0.10 with this rule; 2026-11-29).
ROUTER_ROLE = "router"


def base_spec(spec: Spec) -> Spec:
    """The base model: this spec at model.base_width (FFN width base_d_ff), as sp. Its depth is
    this model's own: no parameter's shape depends on the depth."""
    import dataclasses

    return dataclasses.replace(spec, d_model=spec.base_width, d_ff=spec.base_d_ff, param="sp",
                               base_width=None, base_depth=None, base_d_ff=None)


def base_shapes(spec: Spec, model_cls: type) -> dict[str, tuple]:
    """Each parameter's shape in the base model (model_cls: the model's own class, so this module
    need not import it), built on the meta device (no memory, no init), as the `mup` package's
    set_base_shapes reads a base model's shapes."""
    import torch

    from ablate.errors import ConfigError

    try:
        base = base_spec(spec)
    except ConfigError as e:
        raise ConfigError(f"the base model (model.base_width={spec.base_width}) is not a valid "
                          f"model: {e}") from None
    with torch.device("meta"):
        return {name: tuple(p.shape) for name, p in model_cls(base).named_parameters()}


def param_rules(model: Any) -> dict[str, ParamRule]:
    """name -> rule for each parameter of a Transformer (a tied weight once, under its first
    name); {} under sp (every multiplier 1). A parameter without a role is refused (its rule
    would be a guess), before the base model is built."""
    from ablate.errors import ConfigError
    from ablate.model.roles import role_of

    spec = model.spec
    if not options.get("param", spec.param).width:
        return {}
    roles = {}
    for name, p in model.named_parameters():
        try:
            roles[name] = role_of(p).value
        except RuntimeError:
            raise ConfigError(f"parameter {name} {tuple(p.shape)} has no role, and param={spec.param} "
                              "sets init and LR by role: tag it (ablate.model.roles.tag, "
                              "docs/extending.md) or use param=sp") from None
    shapes = base_shapes(spec, type(model))
    rules = {role: hidden_rule for role in (*HIDDEN_ROLES, ROUTER_ROLE)}
    return {name: rules[role](name, role, tuple(p.shape), shapes) if role in rules else ParamRule(role)
            for (name, p), role in zip(model.named_parameters(), roles.values())}


def _fan_ins(name: str, role: str, shape: tuple, base: dict[str, tuple]) -> tuple[int, int]:
    """(fan-in, the base model's fan-in) of a matrix, or of each matrix of a 3-D bank (an MoE's
    experts, (E, out, in): each expert is its own matrix, its fan-in the last dim)."""
    from ablate.errors import ConfigError

    if len(shape) not in (2, 3) or name not in base:
        why = "is not a matrix" if len(shape) not in (2, 3) else "has no match in the base model"
        raise ConfigError(f"parameter {name} {shape} (role {role}) {why}; param=mup needs its "
                          "fan-in at the base width")
    return shape[-1], base[name][-1]


def hidden_rule(name: str, role: str, shape: tuple, base: dict[str, tuple]) -> ParamRule:
    """muP for a hidden matrix under Adam (the `mup` package: init std x base_fan_in/fan_in ^ 1/2,
    MuAdam's LR / width_mult and weight decay x width_mult, width_mult = fan_in / base_fan_in).
    Each expert of a bank is a hidden matrix of its own fan-in."""
    fan_in, base_fan_in = _fan_ins(name, role, shape, base)
    ratio = base_fan_in / fan_in
    return ParamRule(role, fan_in, base_fan_in, init_mult=math.sqrt(ratio), lr_mult=ratio, wd_mult=1.0 / ratio)


def rule_rows(model: Any) -> list[dict]:
    """The rules of a model's parameters (built on the meta device will do), one row per (role,
    fan-ins, init std, multipliers): what `ablate inspect` shows."""
    from ablate.model.roles import CONSTANT, Role, normal_std

    spec = model.spec
    out_div = math.sqrt(2 * spec.n_layers) if model.parametrization.depth_scaled_init else 1.0
    rows: dict[tuple, dict] = {}
    for name, p in model.named_parameters():
        rule, role = model.param_rules[name], Role(model.param_rules[name].role)
        std = None if role in CONSTANT or role is Role.SCALAR else \
            normal_std(role, spec.init_std, out_div, rule.init_mult)
        key = (rule.role, rule.fan_in, rule.base_fan_in, std, rule.lr_mult, rule.wd_mult)
        row = rows.setdefault(key, {"role": rule.role, "tensors": 0, "params": 0, "fan_in": rule.fan_in,
                                    "base_fan_in": rule.base_fan_in, "init_std": std,
                                    "lr_mult": rule.lr_mult, "weight_decay_mult": rule.wd_mult})
        row["tensors"] += 1
        row["params"] += p.numel()
    return list(rows.values())
