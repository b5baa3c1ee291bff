"""Registries of the axes whose options are values rather than modules (torch-free).

The module-valued axes have their registries beside their classes: NORMS (norms.py),
BLOCKS (blocks.py, axis norm_pos), ACTIVATIONS (ffn.py, axis act), POSITIONS (positions.py).
"""

from __future__ import annotations

from typing import Callable

from ablate.registry import Registry

# attn: n_kv_heads as a function of (n_heads, kv_group)
ATTENTION: Registry[Callable[[int, int], int]] = Registry("attn")
ATTENTION.add("mha", lambda n_heads, kv_group: n_heads)
ATTENTION.add("gqa", lambda n_heads, kv_group: max(1, n_heads // kv_group))
ATTENTION.add("mqa", lambda n_heads, kv_group: 1)

# tie: whether the output head shares the token embedding matrix
TIE: Registry[bool] = Registry("tie")
TIE.add("tied", True)
TIE.add("untied", False)

# bias: whether linear layers (and LayerNorm) carry an additive bias
BIAS: Registry[bool] = Registry("bias")
BIAS.add("on", True)
BIAS.add("off", False)

# dropout: whether dropout.rate applies (embedding, attention probabilities, residual branches)
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
