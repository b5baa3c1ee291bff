"""Axis `pos`: how a token learns where it is.

Each option is a module with two hooks, so the forward pass shows where position enters:
  add_to_embeddings(x, offset)   absolute encodings (learned, sinusoidal) are added to the
                                 embeddings;
  context(T, device, dtype, offset)
                                 per-forward tensors the attention layers use: RoPE's (cos, sin)
                                 or ALiBi's additive bias (with the causal -inf folded in, for SDPA).
offset is the position of the first of the T tokens (0 in training; a KV cache's length when
decoding): x's tokens sit at positions offset .. offset + T - 1, and the keys they attend to at
0 .. offset + T - 1. `max_positions` is how far an option reaches (None: any length; a learned
table: its rows). Declared (name, parameter count) in ablate/model/options.py.

Sliding-window layers (ablate/model/sliding.py) read the same context: RoPE's tables at a second
base for them (`local_rope`, attn.local_rope_base), and ALiBi's slopes, from which a layer whose
cached keys are not at 0 .. offset + T - 1 (a ring buffer) builds its bias (`alibi_bias_at`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from ablate.model import options
from ablate.model.roles import Role, tag
from ablate.model.sliding import settings_of, spec_windows
from ablate.model.spec import ModelSpec


@dataclass
class AttnContext:
    rope: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # (cos, sin), each (T, the rotated width)
    local_rope: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # sliding layers' (attn.local_rope_base)
    bias: Optional[torch.Tensor] = None  # (n_heads, T, offset + T) additive, causal mask included
    alibi_slopes: Optional[torch.Tensor] = None  # (n_heads,): the same bias, for FlexAttention


class Positional(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec

    @property
    def max_positions(self) -> Optional[int]:
        """The longest sequence this option can place (None: any length)."""
        return None

    def add_to_embeddings(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        return x

    def context(self, T: int, device: torch.device, dtype: torch.dtype, offset: int = 0) -> AttnContext:
        return AttnContext()


class Learned(Positional):
    """GPT-2: a trained (max_seq_len, d_model) table added to the token embeddings."""

    def __init__(self, spec):
        super().__init__(spec)
        self.emb = nn.Embedding(spec.max_seq_len, spec.d_model)
        tag(self.emb.weight, Role.POSITION)

    @property
    def max_positions(self):
        return self.emb.num_embeddings

    def add_to_embeddings(self, x, offset=0):
        return x + self.emb.weight[offset: offset + x.shape[1]]  # (B, T, d) + (T, d)


def sinusoidal_table(T: int, d: int) -> torch.Tensor:
    """Vaswani et al. 2017: PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(same)."""
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    inv = torch.pow(10000.0, -torch.arange(0, d, 2, dtype=torch.float64) / d)
    table = torch.zeros(T, d, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * inv)
    table[:, 1::2] = torch.cos(pos * inv[: d // 2])
    return table.float()


def token_embedding_rms(spec: ModelSpec) -> float:
    """RMS of the token embeddings at init, as the blocks see them (after emb_scale)."""
    return spec.embedding_std * (math.sqrt(spec.d_model) if spec.emb_scale else 1.0)


class Sinusoidal(Positional):
    """Fixed sin/cos table added to the embeddings; no parameters.

    The paper adds the raw table (RMS 1/sqrt(2)) to unit-RMS token embeddings (tensor2tensor and
    fairseq: N(0, d^-1/2) embeddings times sqrt(d); here model.init=xavier with emb_scale). With
    init=normal embeddings start at RMS init_std (0.02), so the raw table would outweigh them
    35:1 and two tokens at one position would look alike (cosine ~0.999). The table is
    multiplied by the token embeddings' init RMS instead: the paper's token:position proportion
    (1 : 0.71) at any init, and exactly the paper's table when that RMS is 1 (arch=vaswani).
    The scale is a constant, fixed at build time (it does not follow training).
    """

    def __init__(self, spec):
        super().__init__(spec)
        self.scale = token_embedding_rms(spec)
        self.register_buffer("table", self.scale * sinusoidal_table(spec.max_seq_len, spec.d_model),
                             persistent=False)

    def add_to_embeddings(self, x, offset=0):
        end = offset + x.shape[1]
        if end > self.table.shape[0]:
            self.table = self.scale * sinusoidal_table(end, self.spec.d_model).to(self.table.device)
        return x + self.table[offset:end].to(x.dtype)


def rope_tables(T: int, head_dim: int, base: float, device=None,
                position_divisor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """RoFormer (Su et al. 2021) in the half-split layout used by GPT-NeoX and Llama:
    theta_i = base^(-2i/head_dim); dims i and i + head_dim/2 rotate together. Position p turns
    by (p / position_divisor) * theta_i (a divisor > 1: position interpolation)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    positions = torch.arange(T, dtype=torch.float32, device=device) / position_divisor
    angles = torch.outer(positions, inv_freq)  # (T, hd/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, hd)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, H, T, hd). Rotates pairs (x_i, x_{i+hd/2}) by angle p * theta_i."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


ROPE_SCALINGS = ("pi", "ntk")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE stretched at evaluation time to reach past the training length, no training:
    pi:F   position interpolation (Chen et al. 2023): positions divided by F;
    ntk:F  NTK-aware (bloc97 2023): base * F^(d/(d-2)), d = head_dim: the fastest rotation
           stays, the slowest is slowed by exactly F."""

    kind: str  # one of ROPE_SCALINGS
    factor: float  # >= 1

    @classmethod
    def parse(cls, text: str) -> "RopeScaling":
        """`pi:2` or `ntk:4.0`; ValueError (one line) for anything else."""
        kind, _, value = text.strip().partition(":")
        try:
            factor = float(value)
        except ValueError:
            factor = math.nan
        if kind not in ROPE_SCALINGS or not math.isfinite(factor):
            raise ValueError(f"--rope-scaling must be pi:FACTOR or ntk:FACTOR (e.g. pi:2), got '{text}'")
        if factor < 1:
            raise ValueError(f"--rope-scaling factor must be >= 1 (it stretches RoPE to longer contexts), got {value}")
        return cls(kind, factor)

    def __str__(self) -> str:  # the key a result is recorded under: pi:2.0
        return f"{self.kind}:{self.factor!r}"

    def base_and_divisor(self, base: float, head_dim: int) -> tuple[float, float]:
        """(RoPE base, position divisor) under this scaling."""
        if self.kind == "pi":
            return base, self.factor
        if head_dim <= 2:
            raise ValueError(f"ntk scaling needs a head dim above 2, got {head_dim}")
        return base * self.factor ** (head_dim / (head_dim - 2)), 1.0


class RoPE(Positional):
    """Rotary embeddings on queries and keys: q.k depends only on the offset between positions.
    They rotate each head's whole query and key, or the part the attention declares (MLA's
    decoupled rope_dim: its rope_width).

    With `local_base` (attn.local_rope_base) the sliding layers rotate at that base and the full
    ones at pos.base (Gemma 3: 10,000 and 1,000,000). A scaling (eval --rope-scaling) stretches
    the full layers' base only, as Gemma 3 does, with one base or two: a sliding layer never sees
    a key farther than its window, a distance it was trained at, at any context length."""

    def __init__(self, spec):
        super().__init__(spec)
        self._cache: dict = {}
        self.dim = options.get("attn", spec.attn).rotary_dim(spec)
        self.scaling: Optional[RopeScaling] = None  # set by evaluation only (ablate/evaluation/lengths.py)
        self.local_base: Optional[float] = settings_of(spec)[2]
        self.slides = any(w is not None for w in spec_windows(spec))

    def context(self, T, device, dtype, offset=0):
        local_base = self.local_base  # sliding layers' own tables: at their base, never scaled
        if local_base is None and self.slides and self.scaling is not None:
            local_base = self.spec.rope_base
        key, end = (device, self.scaling, local_base), offset + T
        held = self._cache.get(key)
        if held is None or held[0][0].shape[0] < end:
            # a position's angles do not depend on the table's length, so a longer table is sliced:
            # doubling it keeps a decode step from rebuilding the tables of every position so far
            n = end if held is None else max(end, 2 * held[0][0].shape[0])
            base, divisor = self.spec.rope_base, 1.0
            if self.scaling is not None:
                base, divisor = self.scaling.base_and_divisor(base, self.dim)
            tables = rope_tables(n, self.dim, base, device, divisor)
            local = None if local_base is None else rope_tables(n, self.dim, local_base, device)
            self._cache = {key: (tables, local)}
        tables, local = self._cache[key]
        cos, sin = (t[offset:end].to(dtype) for t in tables)  # (T, dim) each
        return AttnContext(rope=(cos, sin),
                           local_rope=None if local is None else tuple(t[offset:end].to(dtype) for t in local))


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Press et al. 2022: geometric slopes 2^(-8/n), 2^(-16/n), ...; for n not a power of two,
    the slopes of the closest lower power of two, then every other slope of twice that."""

    def power_of_two(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        slopes = power_of_two(n_heads)
    else:
        closest = 2 ** math.floor(math.log2(n_heads))
        slopes = power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(n_heads: int, T: int, device=None, offset: int = 0) -> torch.Tensor:
    """(n_heads, T, offset + T): -slope * (i - j) for keys j <= query i, -inf for future keys;
    queries at positions offset .. offset + T - 1, keys at 0 .. offset + T - 1."""
    i = torch.arange(offset, offset + T, device=device)
    j = torch.arange(offset + T, device=device)
    bias = alibi_bias_at(alibi_slopes(n_heads).to(device), i, j)  # (H, T, offset + T)
    return bias.masked_fill(j[None, :] > i[:, None], float("-inf"))


def alibi_bias_at(slopes: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """(H, T, S): slope_h * (j - i) for queries at positions q_pos (T,) and keys at k_pos (S,), in
    any order (a ring buffer's); masking is the caller's."""
    dist = (k_pos[None, :] - q_pos[:, None]).float()  # <= 0 for keys at or before the query
    return slopes[:, None, None] * dist


class ALiBi(Positional):
    """Linear distance penalty on attention logits, folded into SDPA's float mask."""

    def __init__(self, spec):
        super().__init__(spec)
        self._cache: dict = {}

    def context(self, T, device, dtype, offset=0):
        key = (T, device, dtype, offset)
        if key not in self._cache:
            self._cache = {key: (alibi_bias(self.spec.n_heads, T, device, offset).to(dtype),
                                 alibi_slopes(self.spec.n_heads).to(device))}
        bias, slopes = self._cache[key]
        return AttnContext(bias=bias, alibi_slopes=slopes)


class NoPE(Positional):
    """No positional information: the causal mask alone (Kazemnejad et al. 2023)."""
