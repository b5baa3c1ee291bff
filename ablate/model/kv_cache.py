"""The decode cache of incremental decoding: what each layer keeps of the tokens seen so far, so
a decode step runs only the new token through the model.

    cache = KVCache.for_model(model, batch=B, capacity=P + N)  # empty; room for P + N positions
    logits = model.decode(prompt, cache)   # prefill: prompt (B, P) -> logits (B, P, V)
    logits = model.decode(tokens, cache)   # one step: tokens (B, 1) -> logits (B, 1, V)
    cache.length                           # positions held (P + steps so far)
    cache.bytes()                          # bytes of every layer's tensors

What a layer keeps is its attention component's declared CacheLayout (ablate/model/component.py),
the same one `ablate inspect` counts bytes from: for MHA, GQA and MQA keys and values of shape
(B, n_kv_heads, capacity, head_dim) in the cache's dtype (default: the model's parameters'), one
entry per KV head, never repeated to n_heads, so a GQA or MQA cache is n_heads / n_kv_heads times
smaller than MHA's; another attention may keep one latent per position. The tensors are
preallocated at `capacity` positions when the cache is made: decoding then copies nothing and
allocates nothing for the cache, and bytes() (measured from the tensors: numel x element size)
is what the cache holds from the first step on. Writing past the capacity raises ValueError.

Keys are cached after QK-norm and RoPE (each key's rotation is fixed by its own position), so a
decode step only rotates the new token's query and key. The model passes each layer its slice
while model.decode runs (`attached`); a plain forward pass never sees a cache.

A layer whose layout has a window (a sliding-window attention layer, attn.window = W,
ablate/model/sliding.py) keeps min(capacity, W) positions in a ring buffer: position p in slot
p % W, so its memory stops growing at W while the model's full layers keep every position. Past
W its tensors come back in slot order with each slot's position (`Held.positions`), from which
the attention builds its mask (and ALiBi its bias). A chunk of several tokens attends over the
kept positions and its own, concatenated, before its last W overwrite the oldest; one token is
written first and attends over the buffer itself, which then holds exactly the W positions its
window covers (nothing is copied).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import contextmanager
from typing import Iterator, Optional

import torch

from ablate.model.component import CacheLayout


class Held(Mapping):
    """What a layer attends over in one decode pass: each cached tensor by name (`held["k"]`,
    positions on its positions axis); `start`, the position of the pass's first new token; and
    `positions` (S,), each returned position's index where they are not 0 .. S - 1 in order (a
    ring buffer's), else None."""

    def __init__(self, tensors: dict[str, torch.Tensor], start: int, positions: Optional[torch.Tensor] = None):
        self.tensors, self.start, self.positions = tensors, start, positions

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    def __iter__(self):
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)


class LayerCache:
    """One layer's cache: a tensor per CacheTensor of its layout, (B, *shape[:seq_dim], slots,
    *shape[seq_dim:]), filled up to `length` positions; slots = capacity, or min(capacity, window)
    for a layout with a window (a ring buffer). Each tensor is also an attribute (`layer.k`)."""

    def __init__(self, layout: CacheLayout, batch: int, capacity: int, dtype: torch.dtype,
                 device: torch.device):
        self.layout, self.length = layout, 0
        self.capacity = capacity  # positions the cache may reach
        self.slots = layout.positions(capacity)  # positions it keeps
        self.tensors = {t.name: torch.empty((batch, *t.shape[:t.seq_dim], self.slots, *t.shape[t.seq_dim:]),
                                            dtype=dtype, device=device) for t in layout.tensors}
        self._dims = {t.name: 1 + t.seq_dim for t in layout.tensors}

    def __getattr__(self, name: str) -> torch.Tensor:
        tensors = self.__dict__.get("tensors", {})
        if name in tensors:
            return tensors[name]
        raise AttributeError(name)

    def append(self, **new: torch.Tensor) -> Held:
        """Write the new positions of every tensor (each (B, ..., T, ...) with T on its positions
        axis) at length .. length + T - 1; return what the new queries attend over, in the new
        tensors' dtype: every position so far, or for a ring past its window the kept ones and
        the new, with their positions."""
        if set(new) != set(self.tensors):
            raise ValueError(f"this cache holds {', '.join(self.tensors)}; got {', '.join(new)}")
        T = next(new[name].shape[self._dims[name]] for name in new)
        start, end = self.length, self.length + T
        if end > self.capacity:
            raise ValueError(f"KV cache full: {end} positions do not fit its capacity of {self.capacity}")
        self.length = end
        if end <= self.slots:  # every position has its own slot: in order
            out = {}
            for name, value in new.items():
                held = self.tensors[name].narrow(self._dims[name], 0, end)
                held.narrow(self._dims[name], start, T).copy_(value)
                out[name] = held.to(value.dtype)
            return Held(out, start)
        W, device = self.slots, next(iter(new.values())).device  # a ring of the window's size from here on
        if T == 1:  # write first: the ring then holds exactly positions end - W .. end - 1
            for name, value in new.items():
                self.tensors[name].narrow(self._dims[name], start % W, 1).copy_(value)
            return Held({name: self.tensors[name].to(value.dtype) for name, value in new.items()}, start,
                        self.positions(end, device))
        kept = min(start, W)  # slots 0 .. kept - 1 are filled
        out = {name: torch.cat([self.tensors[name].narrow(self._dims[name], 0, kept).to(value.dtype), value],
                               dim=self._dims[name]) for name, value in new.items()}
        positions = torch.cat([self.positions(start, device)[:kept], torch.arange(start, end, device=device)])
        newest = torch.arange(max(start, end - W), end, device=device)  # they overwrite the oldest
        for name, value in new.items():
            dim, held = self._dims[name], self.tensors[name]
            held.index_copy_(dim, newest % W, value.index_select(dim, newest - start).to(held.dtype))
        return Held(out, start, positions)

    def positions(self, length: int, device) -> torch.Tensor:
        """(slots,) the position each slot holds after `length` positions: the latest p < length
        with p % slots == slot (negative for a slot not yet written)."""
        slot = torch.arange(self.slots, device=device)
        return slot + self.slots * torch.div(length - 1 - slot, self.slots, rounding_mode="floor")

    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


class KVCache:
    """Every layer's LayerCache (see the module docstring for how to use it)."""

    def __init__(self, layers: list[LayerCache]):
        self.layers = layers

    @classmethod
    def for_model(cls, model, batch: int, capacity: int, dtype: Optional[torch.dtype] = None,
                  device: Optional[torch.device] = None) -> "KVCache":
        """An empty cache for `model` (an ablate Transformer) with room for `capacity` positions
        of `batch` sequences, each layer as its attention component declares (ModelSpec's
        cache_layouts; a sliding layer keeps its window's); dtype and device default to the
        model's parameters'."""
        from ablate.model.spec import cache_layouts

        param = next(model.parameters())
        kw = dict(dtype=dtype or param.dtype, device=device or param.device)
        return cls([LayerCache(layout, batch, capacity, **kw) for layout in cache_layouts(model.spec)])

    @property
    def length(self) -> int:
        """Positions held: the position the next token decoded takes."""
        return self.layers[0].length

    @property
    def capacity(self) -> int:
        """Positions the cache may reach (every layer's; a sliding layer keeps fewer)."""
        return self.layers[0].capacity

    def bytes(self) -> int:
        """Bytes of the cache's tensors (all layers, at full capacity; a sliding layer's at
        min(capacity, window) positions)."""
        return sum(layer.bytes() for layer in self.layers)

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
