"""Muon (Keller Jordan 2024; "Muon is Scalable for LLM Training", Liu et al. 2025) on each
logical matrix of its parameters: torch.optim.Muon's update, which treats a whole parameter as
one matrix, applied to the matrices a fused parameter holds (ablate/train/optimizers/matrices.py).

Per parameter, as torch.optim.Muon (>= 2.9) does it, element for element:
    buf <- lerp(buf, g, 1 - momentum)                       (an EMA of the gradient)
    u   <- lerp(g, buf, momentum) if nesterov else buf
    p   <- p * (1 - lr * weight_decay)                      (decoupled; the unadjusted lr)
and then per logical matrix M of shape (A, B):
    p[M] <- p[M] - adjusted_lr(lr, A, B) * NS(u[M])
NS: `ns_steps` quintic Newton-Schulz iterations in bf16 (not an exact orthogonalization: singular
values land near 0.7-1.2). adjusted_lr: `match_rms_adamw` lr * 0.2 * sqrt(max(A, B)) (Moonlight:
the update's RMS ~ AdamW's, so AdamW's lr and weight decay serve) | `original` lr * sqrt(max(1, A/B)).
Elementwise steps run on the whole tensor (the same numbers as per matrix), Newton-Schulz per matrix.

Under FSDP2 a parameter is a row shard of a DTensor: Newton-Schulz needs the full matrix, so each
rank gathers the update (one all-gather per parameter), orthogonalizes every matrix and applies
the rows of its own shard; momentum and weight decay stay sharded. Every rank computes the same
numbers (redundantly), so the result equals one process's up to the gradients' all-reduce.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Optional, Sequence

import torch
from torch import Tensor

from ablate.train.optimizers.matrices import Matrix, matrices_of

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Keller Jordan's quintic, as torch.optim.Muon's
NS_EPS = 1e-7


def orthogonalize(g: Tensor, steps: int, coefficients: Sequence[float] = NS_COEFFICIENTS,
                  eps: float = NS_EPS) -> Tensor:
    """Newton-Schulz's approximate U V^T of a matrix g = U S V^T, in bf16, by the same operations
    as torch.optim.Muon (so the numbers are equal): on the wide orientation, scaled to spectral
    norm <= 1 by its Frobenius norm."""
    a, b, c = coefficients
    x = g.bfloat16()
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def lr_ratio(adjust: str, shape: Sequence[int]) -> float:
    """The adjusted LR over the LR for a matrix of `shape` (A, B)."""
    rows, cols = shape[:2]
    if adjust == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    if adjust == "original":
        return math.sqrt(max(1, rows / cols))
    raise ValueError(f"unknown Muon LR adjustment '{adjust}'")


def adjusted_lr(lr: float, adjust: str, shape: Sequence[int]) -> float:
    return lr * lr_ratio(adjust, shape)  # lr * ratio: torch.optim.Muon's order of operations


def shard_start(p: Tensor) -> int:
    """The first global row of this rank's shard of an FSDP2 parameter (Shard(0), torch.chunk's split)."""
    from torch.distributed.tensor import Shard

    placements = tuple(p.placements)
    if len(placements) != 1 or not isinstance(placements[0], Shard) or placements[0].dim != 0:
        raise NotImplementedError(f"Muon supports parameters sharded by rows on one mesh dimension "
                                  f"(FSDP2's Shard(0)), not {placements}")
    rows, world = p.shape[0], p.device_mesh.size()
    chunk = -(-rows // world)
    return min(p.device_mesh.get_local_rank() * chunk, rows)


class Muon(torch.optim.Optimizer):
    """Muon over parameter groups of hidden matrices. `matrices`: id(parameter) -> its logical
    matrices (default: matrices_of, a 2-D weight's fused parts, a 3-D bank's experts).

    record_updates: when set, each step stores `update_rms[group name]`, the RMS of the group's
    update (adjusted LR x orthogonalized matrix; weight decay excluded) over the group's LR
    (diagnostics: match_rms_adamw aims at 0.2)."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, weight_decay: float = 0.1,
                 momentum: float = 0.95, nesterov: bool = True, ns_steps: int = 5,
                 adjust: str = "match_rms_adamw", ns_coefficients: Sequence[float] = NS_COEFFICIENTS,
                 eps: float = NS_EPS, matrices: Optional[Mapping[int, Sequence[Matrix]]] = None):
        lr_ratio(adjust, (1, 1))  # an unknown adjustment fails here
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_steps=ns_steps, adjust=adjust, ns_coefficients=tuple(ns_coefficients), eps=eps)
        super().__init__(params, defaults)
        given = dict(matrices or {})
        self.matrices = {id(p): list(given.get(id(p)) or matrices_of(p)) for p in self._params()}
        for p in self._params():  # now, not at the first step: a compiled step sees one state
            self.state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        self.record_updates = False
        self.update_rms: dict[str, Tensor] = {}

    def _params(self) -> list[Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for i, group in enumerate(self.param_groups):
            lr = group["lr"]
            if isinstance(lr, Tensor) and not torch.compiler.is_compiling():
                lr = lr.item()  # eager: a float, as torch.optim.Muon (the same rounding)
            squares: list[Tensor] = []
            count = 0
            for p in group["params"]:
                if p.grad is None:
                    continue
                update = self._momentum(p, group)
                p.mul_(1 - lr * group["weight_decay"])
                sharded = hasattr(update, "full_tensor")
                full = update.full_tensor() if sharded else update
                target, start = (p.to_local(), shard_start(p)) if sharded else (p, 0)
                for m in self.matrices[id(p)]:
                    ortho = orthogonalize(m.take(full), group["ns_steps"], group["ns_coefficients"], group["eps"])
                    step = adjusted_lr(lr, group["adjust"], m.shape)
                    m.add_(target, ortho, -step, start)
                    if self.record_updates:
                        squares.append(ortho.float().pow(2).sum() * step ** 2)
                        count += ortho.numel()
            if self.record_updates and squares:
                self.update_rms[group.get("name", str(i))] = (torch.stack(squares).sum() / count).sqrt() / lr
        return loss

    def _momentum(self, p: Tensor, group: dict) -> Tensor:
        """The momentum step, in place on the buffer; returns the matrix to orthogonalize."""
        buf, mu = self.state[p]["momentum_buffer"], group["momentum"]
        buf.lerp_(p.grad, 1 - mu)
        return p.grad.lerp(buf, mu) if group["nesterov"] else buf
