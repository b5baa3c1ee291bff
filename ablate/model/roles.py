"""Parameter roles: init and weight decay are decided by role, defined once, never by name or rank.

Modules tag each parameter they create with `tag(param, Role.X)`. `init_weights` and the
optimizer's decay groups read these tags, so switching an axis (bias on/off, a gated FFN, an
untied head) changes only the parameters that axis owns.
"""

from __future__ import annotations

import hashlib
import math
from enum import Enum
from typing import Optional

import torch
from torch import nn


class Role(str, Enum):
    EMBEDDING = "embedding"  # token embedding (and the tied head)
    POSITION = "position"  # learned absolute positions
    INPUT = "input"  # projections that read the residual stream: qkv, FFN up/gate, MTP proj
    OUTPUT = "output"  # projections that write into the residual stream: attention out, FFN down
    HEAD = "head"  # untied output projection
    GAIN = "gain"  # norm scales
    BIAS = "bias"  # additive biases (linear and LayerNorm beta)


# Decay the matrices, never gains or biases: an explicit table, so bias=off cannot move a
# weight between groups.
DECAY = {Role.EMBEDDING: True, Role.POSITION: True, Role.INPUT: True, Role.OUTPUT: True,
         Role.HEAD: True, Role.GAIN: False, Role.BIAS: False}

_ATTR = "_ablate_role"


def tag(param: nn.Parameter | None, role: Role) -> None:
    if param is not None:
        setattr(param, _ATTR, role)


def role_of(param: nn.Parameter) -> Role:
    try:
        return getattr(param, _ATTR)
    except AttributeError:
        raise RuntimeError(f"parameter of shape {tuple(param.shape)} has no role tag") from None


def linear(d_in: int, d_out: int, bias: bool, role: Role) -> nn.Linear:
    layer = nn.Linear(d_in, d_out, bias=bias)
    tag(layer.weight, role)
    tag(layer.bias, Role.BIAS)
    return layer


def param_seed(seed: int, name: str) -> int:
    """A 63-bit seed for one parameter, a function of (seed, its name) only (stable across
    processes and Python versions, unlike hash())."""
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2 ** 63 - 1)


@torch.no_grad()
def init_weights(model: nn.Module, init_std: float, n_layers: int, depth_scaled: bool,
                 seed: Optional[int] = None) -> None:
    """Normal(0, init_std) for matrices; residual outputs scaled by 1/sqrt(2 * n_layers).

    Each matrix is drawn from its own generator keyed by (seed, parameter name), not from one
    shared stream: toggling an option that adds or removes tensors (bias, an untied head, MTP
    heads) would otherwise shift every later draw. So two variants built with the same seed
    start with identical values in every tensor they share (same name and shape). Values are
    drawn on the CPU, so a model built on another device gets the same numbers. seed=None:
    torch.initial_seed(), i.e. the seed of the last torch.manual_seed (seed_everything).
    """
    base = torch.initial_seed() if seed is None else int(seed)
    out_std = init_std / math.sqrt(2 * n_layers) if depth_scaled else init_std
    for name, p in model.named_parameters():  # a tied weight is listed once, under its first name
        r = role_of(p)
        if r is Role.GAIN:
            p.fill_(1.0)
        elif r is Role.BIAS:
            p.zero_()
        elif p.device.type != "meta":  # meta: shapes only (inspect --build)
            g = torch.Generator().manual_seed(param_seed(base, name))
            std = out_std if r is Role.OUTPUT else init_std
            if p.device.type == "cpu" and p.dtype == torch.float32:
                p.normal_(0.0, std, generator=g)
            else:
                p.copy_(torch.empty(p.shape, dtype=torch.float32).normal_(0.0, std, generator=g))


def unique_parameters(model: nn.Module):
    """Parameters in registration order, each once (a tied weight appears once)."""
    seen = set()
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            yield p


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for p in unique_parameters(model):
        if p.requires_grad:
            (decay if DECAY[role_of(p)] else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay, "name": "decay"},
            {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"}]
