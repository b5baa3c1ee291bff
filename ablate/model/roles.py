"""Parameter roles: init and weight decay are decided by role, defined once, never by name or rank.

Modules tag each parameter they create with `tag(param, Role.X)`. `init_weights` and the
optimizer's decay groups read these tags, so switching an axis (bias on/off, a gated FFN, an
untied head) changes only the parameters that axis owns. A module may also initialise its own
parameters (`init_parameters(init)`, called after the role defaults: DyT's alpha starts at the
option's alpha0); a role with no default (SCALAR) requires it.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from enum import Enum
from typing import Mapping, Optional

import torch
from torch import nn


class Role(str, Enum):
    EMBEDDING = "embedding"  # token embedding (and the tied head)
    POSITION = "position"  # learned absolute positions
    INPUT = "input"  # projections that read the residual stream: qkv, FFN up/gate, MTP proj
    ROUTER = "router"  # an MoE router: reads the residual stream, writes one logit per expert
    OUTPUT = "output"  # projections that write into the residual stream: attention out, FFN down
    HEAD = "head"  # untied output projection
    GAIN = "gain"  # norm scales
    BIAS = "bias"  # additive biases (linear and LayerNorm beta)
    SCALAR = "scalar"  # one learned number scaling a signal (DyT's alpha); its module sets its value


# Decay the matrices, never gains, biases or scalars: an explicit table, so bias=off cannot move
# a weight between groups. A scalar is a gain on a whole tensor, so it is not decayed either (as
# DyT's ViT/ConvNeXt recipe exempts 1-D parameters; its LLaMA code decays every parameter).
DECAY = {Role.EMBEDDING: True, Role.POSITION: True, Role.INPUT: True, Role.ROUTER: True, Role.OUTPUT: True,
         Role.HEAD: True, Role.GAIN: False, Role.BIAS: False, Role.SCALAR: False}
# Roles whose value is a constant at init; SCALAR has none: its module's init_parameters sets it.
CONSTANT = {Role.GAIN: 1.0, Role.BIAS: 0.0}

_ATTR = "_ablate_role"
_FUSED = "_ablate_fused"  # row counts of the independent matrices stacked in one weight


def tag(param: nn.Parameter | None, role: Role) -> None:
    if param is not None:
        setattr(param, _ATTR, role)


def role_of(param: nn.Parameter) -> Role:
    try:
        return getattr(param, _ATTR)
    except AttributeError:
        raise RuntimeError(f"parameter of shape {tuple(param.shape)} has no role tag") from None


def linear(d_in: int, d_out: int, bias: bool, role: Role,
           fused: Optional[tuple[int, ...]] = None) -> nn.Linear:
    """fused: the output rows are several matrices in one matmul (q, k, v; gate, up), with these
    row counts; each gets the fan of its own matrix at init (init=xavier)."""
    layer = nn.Linear(d_in, d_out, bias=bias)
    tag(layer.weight, role)
    tag(layer.bias, Role.BIAS)
    if fused is not None:
        assert sum(fused) == d_out, (fused, d_out)
        setattr(layer.weight, _FUSED, tuple(fused))
    return layer


def bank(n: int, d_out: int, d_in: Optional[int], role: Role,
         fused: Optional[tuple[int, ...]] = None) -> nn.Parameter:
    """n matrices (d_out, d_in) in one 3-D parameter (n, d_out, d_in), as n Linear weights stacked
    (an MoE's experts); d_in None: n bias vectors (n, d_out). fused: as `linear`'s, the row
    counts of the matrices stacked in each one (an expert's gate and up)."""
    p = nn.Parameter(torch.empty(n, d_out) if d_in is None else torch.empty(n, d_out, d_in))
    tag(p, role)
    if fused is not None:
        assert sum(fused) == d_out, (fused, d_out)
        setattr(p, _FUSED, tuple(fused))
    return p


def fused_parts(param: nn.Parameter) -> tuple[int, ...]:
    """Row counts of the matrices stacked in a weight (one part when it is one matrix): a 2-D
    weight's rows, or each matrix's rows in a 3-D bank (n, rows, fan_in)."""
    return getattr(param, _FUSED, (param.shape[-2],))


# Roles of lookup tables (rows are read, not multiplied): xavier draws them N(0, d^-1/2) as
# tensor2tensor does its (shared) embedding and softmax weights, not with a fan-based bound.
TABLES = (Role.EMBEDDING, Role.POSITION, Role.HEAD)


def glorot_bounds(param: nn.Parameter) -> torch.Tensor:
    """(rows, 1): each row's Glorot-uniform bound sqrt(6 / (fan_in + fan_out)) of its own matrix
    (in a 3-D bank, of each matrix of the bank: the bound broadcasts over its first dim)."""
    fan_in = param.shape[-1]
    return torch.cat([torch.full((rows, 1), math.sqrt(6.0 / (fan_in + rows)))
                      for rows in fused_parts(param)])


def param_seed(seed: int, name: str) -> int:
    """A 63-bit seed for one parameter, a function of (seed, its name) only (stable across
    processes and Python versions, unlike hash())."""
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2 ** 63 - 1)


@dataclass(frozen=True)
class ParamInit:
    """What a module's `init_parameters(init)` gets: a generator per parameter keyed by (seed,
    its name in the model), so a module's own random draws keep init_weights' property. Draw
    on the CPU and copy (`p.copy_(torch.empty(p.shape).normal_(0, s, generator=g))`), so a
    model built on another device gets the same numbers."""
    seed: int
    names: Mapping[int, str]  # id(parameter) -> its name in the model

    def generator(self, param: nn.Parameter) -> torch.Generator:
        return torch.Generator().manual_seed(param_seed(self.seed, self.names[id(param)]))


def _own_inits(model: nn.Module, init: ParamInit) -> None:
    """Each module's init_parameters, innermost first, so an outer module's word is the last;
    a SCALAR parameter of a module without one is refused (its value would be arbitrary)."""
    for module in reversed(list(model.modules())):
        own = getattr(module, "init_parameters", None)
        if own is not None:
            own(init)
        elif any(role_of(p) is Role.SCALAR for p in module.parameters(recurse=False)):
            raise RuntimeError(f"{type(module).__name__} has a Role.SCALAR parameter but no "
                               "init_parameters(init) to set it")


def normal_std(role: Role, std: float, out_div: float, mult: float = 1.0) -> float:
    """The std a normally drawn parameter of `role` starts with: `std` times the
    parametrization's multiplier, an output projection's divided by out_div (1/sqrt(2L))."""
    if mult != 1.0:
        std = std * mult
    return std / out_div if role is Role.OUTPUT else std


@torch.no_grad()
def init_weights(model: nn.Module, init_std: float, n_layers: int, depth_scaled: bool,
                 seed: Optional[int] = None, scheme: str = "normal",
                 std_mult: Optional[Mapping[str, float]] = None) -> None:
    """scheme "normal" (GPT-2): N(0, init_std) for matrices and tables. "xavier" (Vaswani et al.
    2017, tensor2tensor's uniform_unit_scaling, gain 1): U(-a, a), a = sqrt(6 / (fan_in +
    fan_out)) per matrix, fused projections split into their matrices (q, k, v each d x d);
    embedding, position and untied head tables N(0, d^-1/2). Either way residual output
    projections are scaled by 1/sqrt(2 * n_layers) when depth_scaled, gains are 1, biases 0.

    Each matrix is drawn from its own generator keyed by (seed, parameter name), not from one
    shared stream: toggling an option that adds or removes tensors (bias, an untied head, MTP
    heads) would otherwise shift every later draw. So two variants built with the same seed
    start with identical values in every tensor they share (same name and shape). Values are
    drawn on the CPU, so a model built on another device gets the same numbers. seed=None:
    torch.initial_seed(), i.e. the seed of the last torch.manual_seed (seed_everything).

    Then every module that defines `init_parameters(init)` (a ParamInit) sets what it owns
    instead of the role default: an option's own init (DyT's alpha = its alpha0).

    std_mult: parameter name -> a factor on its std (the parametrization's, e.g. muP's
    sqrt(base_fan_in / fan_in) for hidden matrices); absent: 1.
    """
    base = torch.initial_seed() if seed is None else int(seed)
    out_div = math.sqrt(2 * n_layers) if depth_scaled else 1.0
    names = {}
    for name, p in model.named_parameters():  # a tied weight is listed once, under its first name
        names[id(p)] = name
        r = role_of(p)
        if r in CONSTANT:
            p.fill_(CONSTANT[r])
        elif r is not Role.SCALAR and p.device.type != "meta":  # meta: shapes only (inspect --build)
            g = torch.Generator().manual_seed(param_seed(base, name))
            div = out_div if r is Role.OUTPUT else 1.0
            w = torch.empty(p.shape, dtype=torch.float32)
            if scheme == "xavier" and r not in TABLES:
                w.uniform_(-1.0, 1.0, generator=g).mul_(glorot_bounds(p) / div)
            else:
                std = p.shape[1] ** -0.5 if scheme == "xavier" else init_std
                w.normal_(0.0, normal_std(r, std, out_div, (std_mult or {}).get(name, 1.0)), generator=g)
            p.copy_(w)
    _own_inits(model, ParamInit(base, names))


def unique_parameters(model: nn.Module):
    """Parameters in registration order, each once (a tied weight appears once)."""
    seen = set()
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            yield p


def param_groups(model: nn.Module, weight_decay: float,
                 rules: Optional[Mapping[str, tuple[float, float]]] = None) -> list[dict]:
    """AdamW's groups: decayed and not, by role; rules (name -> (lr_mult, wd_mult), the
    parametrization's) split off a group per multiplier: `lr_mult` rides in the group, which
    the schedule keeps (ablate/train/optimizer.py: set_lr). Without rules (or with all of them 1)
    the two groups "decay" and "no_decay", as always."""
    groups: dict[tuple, dict] = {(True, 1.0, 1.0): {"params": [], "weight_decay": weight_decay, "name": "decay"},
                                 (False, 1.0, 1.0): {"params": [], "weight_decay": 0.0, "name": "no_decay"}}
    seen = set()
    for name, p in model.named_parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        decay = DECAY[role_of(p)]
        lr_mult, wd_mult = (rules or {}).get(name, (1.0, 1.0))
        key = (decay, lr_mult, wd_mult if decay else 1.0)
        if key not in groups:
            groups[key] = {"params": [], "weight_decay": weight_decay * wd_mult if decay else 0.0,
                           "name": f"{'decay' if decay else 'no_decay'} lr x{lr_mult:.6g}", "lr_mult": lr_mult}
        groups[key]["params"].append(p)
    return list(groups.values())
