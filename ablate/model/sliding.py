"""Sliding-window attention's layer pattern and its settings' checks (torch-free).

`attn.window` = W is the number of keys a query sees, counting itself (Hugging Face's
`sliding_window`: query i sees keys j with i - W < j <= i), so W = 1 attends to itself only and a
window of at least the sequence length is full causal attention. `attn.global_every` = N makes
every Nth layer full (layers N-1, 2N-1, ...: Gemma 2's alternation is 2, Gemma 3's 5:1 is 6) and
the others slide; null: every layer slides. `attn.local_rope_base` is the RoPE base of the sliding
layers (Gemma 3: 10,000 there, 1,000,000 on the full ones); null: one base.

The three are settings of attn=mha, gqa and mqa (ablate/model/options.py), held in the spec's
typed attn config. The attention module reads its window from `layer_window` at its layer index
when it is built; its declared cache (min(context, W) positions), its FLOPs (12 * d_attn *
min(W, T) per token), `ablate inspect` and the HF export read `spec_window`, the same pattern, so
none of them can disagree about which layer slides.
"""

from __future__ import annotations

from typing import Any, Optional

from ablate.errors import ConfigError

# what the length reports (ablate eval --lengths, compare's) say of a windowed model
LOCAL_LAYERS = ("a sliding layer sees at most its window's keys at any length (only the full layers see the "
                "whole context); --rope-scaling stretches the full layers' RoPE base only")


def layer_window(window: Optional[int], global_every: Optional[int], layer: int) -> Optional[int]:
    """The keys layer `layer` (0-based) sees, counting the query; None: full causal attention."""
    if window is None or (global_every is not None and (layer + 1) % global_every == 0):
        return None
    return window


def layer_windows(window: Optional[int], global_every: Optional[int], n_layers: int) -> list[Optional[int]]:
    return [layer_window(window, global_every, layer) for layer in range(n_layers)]


def settings_of(spec: Any) -> tuple[Optional[int], Optional[int], Optional[float]]:
    """(window, global_every, local_rope_base) of a ModelSpec; all None for an attention option
    without them (attn=mla)."""
    return tuple(getattr(spec.attn, key, None) for key in ("window", "global_every", "local_rope_base"))


def spec_window(spec: Any, layer: int) -> Optional[int]:
    """The keys layer `layer` of a ModelSpec sees (None: full)."""
    window, global_every, _ = settings_of(spec)
    return layer_window(window, global_every, layer)


def spec_windows(spec: Any) -> list[Optional[int]]:
    return [spec_window(spec, layer) for layer in range(spec.n_layers)]


def check_spec(spec: Any) -> None:
    """check_window on a ModelSpec's settings (ModelSpec.check)."""
    check_window(*settings_of(spec), n_layers=spec.n_layers, pos=str(spec.pos))


def attended_keys(window: Optional[int], seq_len: int) -> int:
    """Keys the last query of a seq_len-token sequence sees: min(W, T) (T: full attention), the
    length the attention FLOPs count (12 * d_attn * min(W, T) per token, OLMo-core's convention)."""
    return seq_len if window is None else min(window, seq_len)


def check_window(window: Optional[int], global_every: Optional[int], local_rope_base: Optional[float],
                 n_layers: int, pos: str) -> None:
    """The three settings together, each refusal one line saying what to change."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ConfigError(f"attn.window must be a positive integer (the keys a query sees, counting itself) "
                          f"or null (full attention), got {window!r}")
    if global_every is not None:
        if isinstance(global_every, bool) or not isinstance(global_every, int) or global_every < 1:
            raise ConfigError(f"attn.global_every must be an integer >= 1 (every Nth layer full) or null, "
                              f"got {global_every!r}")
        if window is None:
            raise ConfigError(f"attn.global_every={global_every} needs attn.window (the other layers slide "
                              "over it): set attn.window, or attn.global_every=null")
        if global_every > n_layers:
            raise ConfigError(f"attn.global_every={global_every} leaves no full layer in a {n_layers}-layer model "
                              f"(full layers are {global_every - 1}, {2 * global_every - 1}, ...): use at most "
                              f"{n_layers}, or null to slide every layer")
        if global_every == 1:
            raise ConfigError("attn.global_every=1 makes every layer full, so attn.window applies nowhere: "
                              "use 2 or more, or attn.window=null")
    if local_rope_base is not None:
        if window is None:
            raise ConfigError(f"attn.local_rope_base={local_rope_base} is the RoPE base of sliding layers and "
                              "there are none: set attn.window, or attn.local_rope_base=null")
        if pos != "rope":
            raise ConfigError(f"attn.local_rope_base needs pos=rope (got pos={pos}): use pos=rope, or "
                              "attn.local_rope_base=null")
        if not local_rope_base > 0:
            raise ConfigError(f"attn.local_rope_base must be positive, got {local_rope_base}")
        if global_every is None:
            raise ConfigError("attn.local_rope_base with every layer sliding leaves pos.base unused: set "
                              "pos.base instead, or attn.global_every for full layers on pos.base")


def describe(spec: Any) -> str:
    """The pattern in words for the reports ("" without a window): "window 16 on 3 of 4 layers
    (full: 3); sliding layers' RoPE base 10,000"."""
    windows = spec_windows(spec)
    sliding = [w for w in windows if w is not None]
    if not sliding:
        return ""
    full = [str(layer) for layer, w in enumerate(windows) if w is None]
    out = f"window {sliding[0]:,} on {len(sliding)} of {len(windows)} layers (full: {', '.join(full) or 'none'})"
    local_base = settings_of(spec)[2]
    return out + (f"; sliding layers' RoPE base {local_base:,g}" if local_base is not None else "")
