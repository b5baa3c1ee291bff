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
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

import torch


@dataclass
class LayerKV:
    """One layer's cache: k and v of shape (B, n_kv_heads, capacity, head_dim), filled up to `length`."""

    k: torch.Tensor
    v: torch.Tensor
    length: int = 0

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append k, v (B, n_kv_heads, T, head_dim); return every position's keys and values so
        far, (B, n_kv_heads, length + T, head_dim), in k's dtype."""
        start, end = self.length, self.length + k.shape[2]
        if end > self.k.shape[2]:
            raise ValueError(f"KV cache full: {end} positions do not fit its capacity of {self.k.shape[2]}")
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        self.length = end
        return self.k[:, :, :end].to(k.dtype), self.v[:, :, :end].to(v.dtype)


class KVCache:
    """Every layer's LayerKV (see the module docstring for how to use it)."""

    def __init__(self, layers: list[LayerKV]):
        self.layers = layers

    @classmethod
    def for_model(cls, model, batch: int, capacity: int, dtype: Optional[torch.dtype] = None,
                  device: Optional[torch.device] = None) -> "KVCache":
        """An empty cache for `model` (an ablate Transformer) with room for `capacity` positions
        of `batch` sequences; dtype and device default to the model's parameters'."""
        spec, param = model.spec, next(model.parameters())
        shape = (batch, spec.n_kv_heads, capacity, spec.head_dim)  # (B, KV, capacity, hd)
        kw = dict(dtype=dtype or param.dtype, device=device or param.device)
        return cls([LayerKV(torch.empty(shape, **kw), torch.empty(shape, **kw)) for _ in range(spec.n_layers)])

    @property
    def length(self) -> int:
        """Positions held: the position the next token decoded takes."""
        return self.layers[0].length

    @property
    def capacity(self) -> int:
        return self.layers[0].k.shape[2]

    def bytes(self) -> int:
        """Bytes of the cache's tensors (all layers, k and v, at full capacity)."""
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
