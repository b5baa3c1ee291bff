"""The component contract (torch-free): what the model, `ablate inspect`, the KV cache, the
trainer, diagnostics and coord-check ask of an attention or FFN option, so that each of them is a
loop over components instead of a reading of attribute names.

Two sides, each stated once here:

- `LayerComponent`, the declaration (an AttnOption or FfnOption, ablate/model/axis.py): for a
  ModelSpec and a layer index it builds the module and answers, without building it, for its
  parameters, active parameters, training FLOPs per token at a sequence length and its decode
  cache (`CacheLayout`). The model's totals are sums of these over the layers (ablate/model/spec.py).
- `Sublayer`, the built module (mixed into its nn.Module class): after a forward pass it reports
  its auxiliary losses (weighted terms the objective adds, logged as `loss/<name>`), cheap
  statistics for every log row (`stat/<name>`, reduced over layers as the declaration says), and,
  while diagnostics or coord-check record, its detailed statistics (`diag/<name>/block<i>`).

OLMo-core's AttentionConfig / FeedForwardConfig / MoEConfig (build beside num_params and
num_active_params) are the model for the first side, its routers' auxiliary losses for the second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Optional, Protocol

if TYPE_CHECKING:
    import torch

Spec = Any  # ablate.model.spec.ModelSpec (which imports the declarations, so not imported here)

LOSS_PREFIX = "loss/"  # metrics.jsonl key of an auxiliary term: loss/<name> (ablate/names.py)
STAT_PREFIX = "stat/"  # metrics.jsonl key of a component's every-row statistic: stat/<name>
# The statistics every attention component records while recording (diagnostics, coord-check):
# the largest scaled q.k logit and the mean |scaled q.k logit| over the causal entries.
MAX_ATTN_LOGIT, MEAN_ABS_ATTN_LOGIT = "max_attn_logit", "mean_abs_attn_logit"
# The statistic every FFN component records while recording: the mean |hidden activation| (a
# dense FFN's act(up x) or act(gate x) * up x; an MoE's, over its experts' rows), which
# coord-check reads.
MEAN_ABS_FFN_HIDDEN = "mean_abs_ffn_hidden"


@dataclass(frozen=True)
class CacheTensor:
    """One tensor a layer's decode cache holds for each position it keeps.

    shape: per position, without batch and positions (keys of GQA: (n_kv_heads, head_dim); an MLA
    latent: (kv_rank,)); seq_dim: where the positions axis goes among those dims, so the tensor is
    (B, *shape[:seq_dim], positions, *shape[seq_dim:]) (keys: (B, n_kv_heads, positions, head_dim))."""

    name: str
    shape: tuple[int, ...]
    seq_dim: int = 0

    @property
    def numel_per_position(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class CacheLayout:
    """A layer's decode cache: its tensors, and how many positions it keeps (window: a sliding
    layer keeps the last `window`; None: every position). `ablate inspect`'s KV bytes, compare's KV
    column and KVCache's allocation all read it, so the figures and the tensors cannot disagree."""

    tensors: tuple[CacheTensor, ...]
    window: Optional[int] = None

    def positions(self, context: int) -> int:
        """Positions held after `context` tokens."""
        return context if self.window is None else min(context, self.window)

    def bytes_per_position(self, bytes_per_elem: int) -> int:
        return sum(t.numel_per_position for t in self.tensors) * bytes_per_elem

    def bytes(self, context: int, bytes_per_elem: int) -> int:
        """Bytes held after `context` tokens (per sequence)."""
        return self.positions(context) * self.bytes_per_position(bytes_per_elem)


def kv_layout(n_kv_heads: int, head_dim: int, window: Optional[int] = None) -> CacheLayout:
    """Keys and values, n_kv_heads x head_dim each, positions on dim 2: (B, KV, P, hd)."""
    return CacheLayout((CacheTensor("k", (n_kv_heads, head_dim), 1), CacheTensor("v", (n_kv_heads, head_dim), 1)),
                       window)


class Reduce(str, Enum):
    """How a log-row statistic is reduced over the layers that report it."""

    MEAN = "mean"
    MAX = "max"  # the worst layer (a router's imbalance)
    SUM = "sum"


class LayerComponent(Protocol):
    """The declaration side: an attention or FFN option for one layer of a spec."""

    losses: tuple[str, ...]  # the auxiliary terms its modules may report (loss/<name>)
    stats: Any  # Mapping[str, Reduce]: its every-row statistics and their reduction over layers

    def build(self, spec: Spec, layer: int) -> Any:
        """The module of layer `layer` (0-based): an nn.Module that is a Sublayer."""

    def count(self, spec: Spec, layer: int) -> int:
        """Its parameters in that layer."""

    def count_active(self, spec: Spec, layer: int) -> int:
        """The parameters one token uses (a routed FFN: its chosen experts); = count when dense."""

    def train_flops(self, spec: Spec, layer: int, seq_len: int) -> int:
        """Training FLOPs per token (forward + backward) at sequence length seq_len."""

    def cache_layout(self, spec: Spec, layer: int) -> Optional[CacheLayout]:
        """Its decode cache (None: it caches nothing, an FFN)."""


def sublayers(block: Any) -> tuple:
    """A block's components, the Sublayers of its layer: its attention and its FFN."""
    return block.attn, block.ffn


class Sublayer:
    """The module side, mixed into a component's nn.Module class (`class MyAttn(Sublayer,
    nn.Module)`); the defaults say "nothing to add". Values are of the last forward pass.

    aux_losses(): {name: weighted scalar} the objective adds to the LM loss (differentiable),
                  each logged as loss/<name> summed over layers; names declared in `losses=`.
    log_stats():  {name: scalar} cheap, detached, logged on every log row as stat/<name>,
                  reduced over layers as `stats=` declares; computed in the training forward.
    record(on):   diagnostics and coord-check turn recording on around their own forward pass;
    diag_stats(): {name: scalar} recorded while on (diag/<name>/block<i>); an attention component
                  records MAX_ATTN_LOGIT and MEAN_ABS_ATTN_LOGIT (coord-check reads the latter).
    after_update(loads): called by the trainer after each applied optimizer step (never after a
                  skipped one, an evaluation or any other forward) for state that follows the
                  training rather than the gradient (an MoE's choice bias); loads: the tokens per
                  expert the step routed through this layer, summed over micro-steps and ranks.
    """

    def aux_losses(self) -> dict[str, "torch.Tensor"]:
        return {}

    def log_stats(self) -> dict[str, "torch.Tensor"]:
        return {}

    def record(self, on: bool) -> None:
        pass

    def diag_stats(self) -> dict[str, "torch.Tensor"]:
        return {}

    def after_update(self, loads: Optional["torch.Tensor"]) -> None:
        pass
