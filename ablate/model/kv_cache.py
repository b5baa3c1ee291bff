"""The KV cache of incremental decoding: each layer's keys and values of the tokens seen so far,
so a decode step runs only the new token through the model.

    cache = KVCache.for_model(model, batch=B, capacity=P + N)  # empty; room for P + N positions
    logits = model.decode(prompt, cache)   # prefill: prompt (B, P) -> logits (B, P, V)
    logits = model.decode(tokens, cache)   # one step: tokens (B, 1) -> logits (B, 1, V)
    cache.length                           # positions held (P + steps so far)
    cache.bytes()                          # bytes of every layer's k and v tensors

Each layer holds k and v of shape (B, n_kv_heads, capacity, head_dim) in the cache's dtype
(default: the model's parameters'): one entry per KV head, never repeated to n_heads, so a GQA or
MQA cache is n_heads / n_kv_heads times smaller than MHA's. The tensors are preallocated at
`capacity` positions when the cache is made: decoding then copies nothing and allocates nothing
for the cache, and bytes() (measured from the tensors: numel x element size) is what the cache
holds from the first step on. Writing past the capacity raises ValueError.

Keys are cached after QK-norm and RoPE (each key's rotation is fixed by its own position), so a
decode step only rotates the new token's query and key. The model passes each layer its slice
while model.decode runs (`attached`); a plain forward pass never sees a cache.

A sliding-window layer (attn.window = W, ablate/model/sliding.py) keeps min(capacity, W) positions
in a ring buffer: position p in slot p % W, so its memory stops growing at W while the model's
full layers keep every position. Its keys then come back in slot order with their positions
(`KeysSoFar.positions`), from which the attention builds its mask (and ALiBi its bias). A chunk
of several tokens attends over the kept keys and its own, concatenated, before its last W
overwrite the oldest; one token is written first and attends over the buffer itself, which then
holds exactly the W positions its window covers (nothing is copied).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

import torch


@dataclass
class KeysSoFar:
    """What a layer attends over in one decode pass: k, v (B, n_kv_heads, S, head_dim) and, when
    they are not at positions 0 .. S - 1 in order (a ring buffer's), each key's position (S,).
    The pass's queries are at positions start .. start + T - 1."""

    k: torch.Tensor
    v: torch.Tensor
    start: int
    positions: Optional[torch.Tensor] = None


@dataclass
class LayerKV:
    """One layer's cache: k and v of shape (B, n_kv_heads, slots, head_dim), filled up to `length`
    positions; slots = capacity, or min(capacity, window) for a sliding layer (a ring buffer)."""

    k: torch.Tensor
    v: torch.Tensor
    capacity: int  # positions the cache may reach
    window: Optional[int] = None
    length: int = 0

    @classmethod
    def empty(cls, batch: int, n_kv_heads: int, head_dim: int, capacity: int, window: Optional[int] = None,
              **kw) -> "LayerKV":
        slots = capacity if window is None else min(capacity, window)
        shape = (batch, n_kv_heads, slots, head_dim)  # (B, KV, slots, hd)
        return cls(torch.empty(shape, **kw), torch.empty(shape, **kw), capacity, window)

    @property
    def slots(self) -> int:
        return self.k.shape[2]

    def update(self, k: torch.Tensor, v: torch.Tensor) -> KeysSoFar:
        """Add k, v (B, n_kv_heads, T, head_dim) at positions length .. length + T - 1; return the
        keys and values the new queries attend over, in k's dtype: every position so far, or for
        a sliding layer past its window, the kept ones and the new."""
        start, T = self.length, k.shape[2]
        end = start + T
        if end > self.capacity:
            raise ValueError(f"KV cache full: {end} positions do not fit its capacity of {self.capacity}")
        self.length = end
        if end <= self.slots:  # every position has its own slot: in order
            self.k[:, :, start:end] = k
            self.v[:, :, start:end] = v
            return KeysSoFar(self.k[:, :, :end].to(k.dtype), self.v[:, :, :end].to(v.dtype), start)
        W = self.slots  # a ring of the window's size from here on
        if T == 1:  # write first: the ring then holds exactly positions end - W .. end - 1
            self.k[:, :, start % W] = k[:, :, 0]
            self.v[:, :, start % W] = v[:, :, 0]
            return KeysSoFar(self.k.to(k.dtype), self.v.to(v.dtype), start, self.positions(end, k.device))
        kept = min(start, W)  # slots 0 .. kept - 1 are filled
        held = self.positions(start, k.device)[:kept]
        out = KeysSoFar(torch.cat([self.k[:, :, :kept].to(k.dtype), k], dim=2),
                        torch.cat([self.v[:, :, :kept].to(v.dtype), v], dim=2), start,
                        torch.cat([held, torch.arange(start, end, device=k.device)]))
        newest = torch.arange(max(start, end - W), end, device=k.device)  # they overwrite the oldest
        self.k[:, :, newest % W] = k[:, :, newest - start].to(self.k.dtype)
        self.v[:, :, newest % W] = v[:, :, newest - start].to(self.v.dtype)
        return out

    def positions(self, length: int, device) -> torch.Tensor:
        """(slots,) the position each slot holds after `length` positions: the latest p < length
        with p % slots == slot (negative for a slot not yet written)."""
        slot = torch.arange(self.slots, device=device)
        return slot + self.slots * torch.div(length - 1 - slot, self.slots, rounding_mode="floor")


class KVCache:
    """Every layer's LayerKV (see the module docstring for how to use it)."""

    def __init__(self, layers: list[LayerKV]):
        self.layers = layers

    @classmethod
    def for_model(cls, model, batch: int, capacity: int, dtype: Optional[torch.dtype] = None,
                  device: Optional[torch.device] = None) -> "KVCache":
        """An empty cache for `model` (an ablate Transformer) with room for `capacity` positions
        of `batch` sequences (a sliding layer's: its window's); dtype and device default to the
        model's parameters'."""
        spec, param = model.spec, next(model.parameters())
        kw = dict(dtype=dtype or param.dtype, device=device or param.device)
        return cls([LayerKV.empty(batch, spec.n_kv_heads, spec.head_dim, capacity, block.attn.window, **kw)
                    for block in model.blocks])

    @property
    def length(self) -> int:
        """Positions held: the position the next token decoded takes."""
        return self.layers[0].length

    @property
    def capacity(self) -> int:
        return self.layers[0].capacity

    def bytes(self) -> int:
        """Bytes of the cache's tensors (all layers, k and v, at full capacity; a sliding layer's
        at min(capacity, window) positions)."""
        return sum(t.numel() * t.element_size() for layer in self.layers for t in (layer.k, layer.v))

    @contextmanager
    def attached(self, attentions: list) -> Iterator[None]:
        """Give each attention module (one per layer, in order) its layer's cache for one pass."""
        if len(attentions) != len(self.layers):
            raise ValueError(f"the cache has {len(self.layers)} layers, the model {len(attentions)}")
        for attn, layer in zip(attentions, self.layers):
            attn.kv_cache = layer
        try:
            yield
        finally:
            for attn in attentions:
                attn.kv_cache = None
