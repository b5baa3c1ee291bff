"""The logical matrices of a parameter: what Muon orthogonalizes, one at a time. The one place
the optimizer reads the model's structure.

ablate keeps fused parameters fused (init, checkpoints and export see one tensor), so Muon's step
splits the update by the matrices a parameter holds:
- a 2-D weight is one matrix, unless ablate.model.roles.linear(..., fused=(...)) recorded its rows
  as several (attention's q, k and v; a gated FFN's gate and up): each part is its own matrix,
  all heads together (no per-head split: Moonlight warns that small per-head matrices get
  oversized updates);
- a 3-D bank (E, A, B) is E matrices of (A, B) (MoE experts, each its own), each split by the
  bank's fused parts along its rows;
- a module may declare the matrices of its own parameters, where rows of one matrix are not
  contiguous (key and value rows interleaved by head in one weight; MLA's kv_b keeps all of
  W_UK's rows, then W_UV's, so its fused parts are its two matrices and it declares nothing):
  `optimizer_matrices(self) -> {parameter name relative to the module ("kv_b.weight"): {label:
  [(start, stop), ...]}}`, the row ranges of each matrix in order (of each expert's, in a bank).
Which parameters Muon takes is decided by role (MUON_ROLES): hidden matrices; a router, gains,
biases, embeddings and the head stay on AdamW.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Mapping, Optional, Sequence

from ablate.model.roles import Role, fused_parts, role_of

if TYPE_CHECKING:
    import torch
    from torch import nn

# Roles whose parameters Muon updates: matrices that read or write the residual stream (both
# dimensions are widths). Tables (embedding, positions, head) and vectors stay on AdamW, as in
# modded-nanogpt and OLMo-core; a role added later is AdamW's until it is listed here.
MUON_ROLES = (Role.INPUT, Role.OUTPUT)
HOOK = "optimizer_matrices"  # the method a module declares its parameters' matrices with


@dataclass(frozen=True)
class Matrix:
    """One logical matrix of a parameter: row ranges of the parameter's (rows, cols) matrix (of
    expert `expert` of a 3-D bank), taken in order."""

    label: str
    rows: tuple[tuple[int, int], ...]
    cols: int
    expert: Optional[int] = None

    @property
    def shape(self) -> tuple[int, int]:
        return sum(b - a for a, b in self.rows), self.cols

    def take(self, t: torch.Tensor) -> torch.Tensor:
        """This matrix's values in `t`, a tensor of the parameter's full shape: (rows, cols)."""
        import torch

        m = t if self.expert is None else t[self.expert]
        if len(self.rows) == 1:
            a, b = self.rows[0]
            return m[a:b]
        return torch.cat([m[a:b] for a, b in self.rows])

    def add_(self, target: torch.Tensor, value: torch.Tensor, alpha: float | torch.Tensor, start: int = 0) -> None:
        """target[this matrix] += alpha * value, where `target` holds the parameter's first-dimension
        indices start .. start + len(target) (all of them, or one FSDP shard). alpha a tensor: the
        compiled step's LR (a float would be a guard that fails every step)."""
        end = start + target.shape[0]
        if self.expert is not None:
            if not start <= self.expert < end:
                return
            target = target[self.expert - start]  # (rows, cols): all of this expert's rows
            start, end = 0, target.shape[0]
        offset = 0
        for a, b in self.rows:
            lo, hi = max(a, start), min(b, end)
            if lo < hi:
                part = value[offset + lo - a:offset + hi - a]
                if isinstance(alpha, float):
                    target[lo - start:hi - start].add_(part, alpha=alpha)
                else:
                    target[lo - start:hi - start].add_(part.to(target.dtype) * alpha)
            offset += b - a


def _parts(rows: int, counts: Sequence[int]) -> list[tuple[int, int]]:
    bounds, start = [], 0
    for n in counts:
        bounds.append((start, start + n))
        start += n
    assert start == rows, (counts, rows)
    return bounds


def matrices_of(param: torch.Tensor, declared: Optional[Mapping[str, Sequence[tuple[int, int]]]] = None) -> list[Matrix]:
    """The logical matrices of one parameter (2-D or a 3-D bank; see the module docstring)."""
    *bank, rows, cols = param.shape
    if len(bank) > 1:
        raise ValueError(f"a parameter of shape {tuple(param.shape)} is no matrix or bank of matrices")
    if declared:
        layout = [(label, tuple((int(a), int(b)) for a, b in ranges)) for label, ranges in declared.items()]
    else:
        counts = fused_parts(param)  # untagged: (rows,), one matrix
        counts = counts if sum(counts) == rows else (rows,)
        bounds = _parts(rows, counts)
        layout = [(f"rows {a}:{b}" if len(bounds) > 1 else "", ((a, b),)) for a, b in bounds]
    if not bank:
        return [Matrix(label, ranges, cols) for label, ranges in layout]
    return [Matrix(f"expert {e}" + (f" {label}" if label else ""), ranges, cols, expert=e)
            for e in range(bank[0]) for label, ranges in layout]


def declared_matrices(model: nn.Module) -> dict[int, Mapping[str, Sequence[tuple[int, int]]]]:
    """id(parameter) -> its matrices as a module declared them (the HOOK)."""
    out = {}
    for module in model.modules():
        hook = getattr(module, HOOK, None)
        if hook is None:
            continue
        own = dict(module.named_parameters())  # names relative to the declaring module
        for name, layout in hook().items():
            out[id(own[name])] = layout
    return out


def takes(param: torch.Tensor) -> bool:
    """Muon updates this parameter: a hidden matrix (MUON_ROLES), 2-D or a bank of them."""
    return param.ndim in (2, 3) and role_of(param) in MUON_ROLES


def muon_matrices(model: nn.Module) -> Iterator[tuple[str, torch.Tensor, list[Matrix]]]:
    """(name, parameter, its logical matrices) for each trainable parameter Muon takes, in
    registration order, a tied one once."""
    declared = declared_matrices(model)
    seen = set()
    for name, p in model.named_parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        if takes(p):
            yield name, p, matrices_of(p, declared.get(id(p)))
