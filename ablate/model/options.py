"""Registries of the axes whose options are values rather than modules (torch-free).

The module-valued axes have their registries beside their classes: NORMS (norms.py),
BLOCKS (blocks.py, axis norm_pos), ACTIVATIONS (ffn.py, axis act), POSITIONS (positions.py).
"""

from __future__ import annotations

from typing import Callable

from ablate.errors import ConfigError
from ablate.registry import Registry


def gqa_kv_heads(n_heads: int, kv_group: int) -> int:
    """KV heads for attn=gqa: the largest divisor d of n_heads with 2 <= d <= max(2, n_heads /
    kv_group) and d < n_heads, so gqa never degenerates into mqa (1) or mha (n_heads); if no
    divisor is that small (n_heads=9 with kv_group 4) the smallest one above it."""
    proper = [d for d in range(2, n_heads) if n_heads % d == 0]
    if not proper:
        raise ConfigError(
            f"attn=gqa needs model.n_heads with a divisor d, 1 < d < n_heads, to use as the KV "
            f"head count; model.n_heads={n_heads} has none: use a head count such as 4, 6 or 8 "
            f"(or attn=mqa / attn=mha)")
    bound = max(2.0, n_heads / kv_group)
    below = [d for d in proper if d <= bound]
    return max(below) if below else min(proper)


def check_kv_heads(attn: str, n_heads: int, n_kv_heads: int) -> None:
    """An explicit model.n_kv_heads must be what the attn option means, or it says another."""
    means = {"mha": n_kv_heads == n_heads, "mqa": n_kv_heads == 1, "gqa": 1 < n_kv_heads < n_heads}
    need = {"mha": f"model.n_kv_heads == model.n_heads={n_heads}", "mqa": "model.n_kv_heads=1",
            "gqa": f"1 < model.n_kv_heads < model.n_heads={n_heads}"}
    if attn in means and not means[attn]:
        fits = next((a for a, ok in means.items() if ok), None)
        hint = (f"use attn={fits} for that value, or change model.n_kv_heads" if fits else
                "model.n_kv_heads must be between 1 and model.n_heads")
        raise ConfigError(f"model.n_kv_heads={n_kv_heads} contradicts attn={attn}, which needs "
                          f"{need[attn]}; {hint}")


# attn: n_kv_heads as a function of (n_heads, kv_group)
ATTENTION: Registry[Callable[[int, int], int]] = Registry("attn")
ATTENTION.add("mha", lambda n_heads, kv_group: n_heads)
ATTENTION.add("gqa", gqa_kv_heads)
ATTENTION.add("mqa", lambda n_heads, kv_group: 1)

# tie: whether the output head shares the token embedding matrix
TIE: Registry[bool] = Registry("tie")
TIE.add("tied", True)
TIE.add("untied", False)

# bias: whether linear layers (and LayerNorm) carry an additive bias
BIAS: Registry[bool] = Registry("bias")
BIAS.add("on", True)
BIAS.add("off", False)

# dropout: whether dropout.rate applies (embedding, residual branches; attention probabilities:
# dropout.attn, null = the same rate)
DROPOUT: Registry[bool] = Registry("dropout")
DROPOUT.add("off", False)
DROPOUT.add("on", True)

# qk_norm: RMSNorm on queries and keys per head before the dot product
QK_NORM: Registry[bool] = Registry("qk_norm")
QK_NORM.add("off", False)
QK_NORM.add("on", True)

# Option names of the module-valued axes, so torch-free code (spec validation, `ablate axes`)
# can check them; tests assert they equal the keys of the registries in the torch modules.
NORM_NAMES = ("layernorm", "rmsnorm")
NORM_POS_NAMES = ("pre", "post", "sandwich", "reordered")
ACT_NAMES = ("relu", "gelu", "silu", "swiglu", "geglu", "reglu")
GATED_ACTS = ("swiglu", "geglu", "reglu")
POS_NAMES = ("learned", "sinusoidal", "rope", "alibi", "nope")
# model.init: weight-init schemes (roles.init_weights); not an axis, a model key.
INIT_NAMES = ("normal", "xavier")
