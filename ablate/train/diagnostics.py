"""Diagnostics that show why a variant wins or fails: gradient norms by layer, residual-stream
RMS, the components' own statistics (attention: max and mean |logit|; a ReLU-family FFN: its dead
units; any component's through the Sublayer protocol, ablate/model/component.py), update-to-weight
ratios, under optim=muon each Muon group's update RMS over its LR (`update_rms/<group>`, what
match_rms_adamw aims at 0.2), and the loss-spike count (the guard's: ablate/train/policy.py). Their
plots are ablate/tracking/diagnostics_plots.py.

The trainer calls `Diagnostics(trainer, step)` every `train.diagnostics_every` steps, after the
backward pass and before clipping and the optimizer step (gradients are the raw ones, like the
logged `grad_norm`). It returns a callable the trainer runs after the optimizer step, which
measures the update and logs one row of `diag/...` keys to every sink.

Activation statistics come from a separate no-grad forward pass over the step's batch in eval
mode, on the unwrapped (never compiled) model: it consumes no random numbers and touches no
gradient or optimizer state, so a run's losses are the same with diagnostics on or off.
Everything is reduced on the device and read back with one synchronisation per logged row.
torch is imported inside the functions, so `ablate compare` can plot without it.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Callable, Optional

from ablate.model.component import sublayers
from ablate.names import GRAD_NORM, TOKENS

if TYPE_CHECKING:
    import torch
    from torch import nn

PREFIX = "diag/"


# ---- gradient norms by component -----------------------------------------------------------

def _full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor (FSDP2) reduced to a plain tensor; a plain tensor unchanged."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _norms(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    import torch

    if not tensors:
        return []
    if hasattr(tensors[0], "full_tensor"):  # sharded: each norm is a collective
        return [_full(torch.linalg.vector_norm(t.float())) for t in tensors]
    return [n.float() for n in torch._foreach_norm(tensors)]


def components(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """Parameters by the component their gradient norm is logged under: `block{i}` (every
    weight of the block), `block{i}.attn`, `block{i}.ffn`, `embedding` (token and learned
    positions; with tied weights it also carries the head's gradient), `head` (untied only),
    `final_norm` and `mtp` where the model has them."""
    out: dict[str, list[nn.Parameter]] = {}
    for i, block in enumerate(model.blocks):
        out[f"block{i}"] = list(block.parameters())
        for part, component in zip(("attn", "ffn"), sublayers(block)):
            out[f"block{i}.{part}"] = list(component.parameters())
    out["embedding"] = list(model.tok_emb.parameters()) + list(model.pos.parameters())
    if model.lm_head is not None:
        out["head"] = list(model.lm_head.parameters())
    out["final_norm"] = list(model.final_norm.parameters())
    out["mtp"] = list(model.mtp.parameters())
    return {k: v for k, v in out.items() if v}


def grad_norms(model: nn.Module) -> dict[str, torch.Tensor]:
    """L2 norm of the gradients of each component, as 0-dim device tensors (no sync)."""
    import torch

    from ablate.model.roles import unique_parameters

    params = [p for p in unique_parameters(model) if p.grad is not None]
    sq = {id(p): n.pow(2) for p, n in zip(params, _norms([p.grad for p in params]))}
    out = {}
    for name, ps in components(model).items():
        parts = [sq[id(p)] for p in ps if id(p) in sq]
        if parts:
            out[name] = torch.stack(parts).sum().sqrt()
    return out


# ---- activations: one extra forward pass ---------------------------------------------------

class ActivationProbe:
    """Within `with`: forward hooks on the blocks (residual-stream RMS after each block), and
    every component recording its own statistics (`<name>/block<i>`: max_attn_logit, dead_ffn_frac, ...)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.stats: dict[str, torch.Tensor] = {}
        self._handles: list = []

    def __enter__(self) -> "ActivationProbe":
        for i, block in enumerate(self.model.blocks):
            self._handles.append(block.register_forward_hook(self._resid_hook(i)))
            for component in sublayers(block):
                component.record(True)
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for i, block in enumerate(self.model.blocks):
            for component in sublayers(block):
                for name, value in component.diag_stats().items():
                    self.stats[f"{name}/block{i}"] = value.detach().float()
                component.record(False)

    def _resid_hook(self, i: int):
        def hook(module, inputs, output):
            self.stats[f"resid_rms/block{i}"] = output.detach().float().pow(2).mean().sqrt()
        return hook


def activation_stats(model: nn.Module, x: torch.Tensor, autocast: Callable = nullcontext) -> dict:
    """Residual RMS and the components' statistics per block, plus the output logits'
    max and mean log-partition (what logit soft-capping and z-loss act on). Eval mode: no
    dropout, so no random numbers are drawn."""
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), ActivationProbe(model) as probe, autocast():
            logits = model(x).logits.float()  # (B, T, V)
    finally:
        model.train(was_training)
    stats = dict(probe.stats)
    stats["max_out_logit"] = logits.amax()
    stats["mean_log_z"] = torch.logsumexp(logits, dim=-1).mean()
    return stats


# ---- update-to-weight ratio ----------------------------------------------------------------

def role_groups(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """Trainable parameters by role (embedding, input, output, head, gain, bias, ...): the
    groups whose update-to-weight ratio is logged."""
    from ablate.model.roles import Role, role_of, unique_parameters

    groups: dict[str, list[nn.Parameter]] = {}
    for p in unique_parameters(model):
        if p.requires_grad:
            groups.setdefault(Role(role_of(p)).value, []).append(p)
    return groups


def _group_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    import torch

    return torch.stack([n.pow(2) for n in _norms(tensors)]).sum().sqrt()


def update_ratios(groups: dict[str, list[nn.Parameter]], before: dict[str, list[torch.Tensor]]):
    """||W_after - W_before|| / ||W_before|| per group (NaN for an all-zero group, e.g. biases
    at initialization; such entries are not logged)."""
    import torch

    out = {}
    for name, params in groups.items():
        delta = [p.detach() - b for p, b in zip(params, before[name])]
        w = _group_norm(before[name])
        out[name] = torch.where(w > 0, _group_norm(delta) / w, torch.full_like(w, float("nan")))
    return out


def update_recorders(trainer: Any) -> list:
    """The trainer's optimizers that can record their update's RMS (Muon: `record_updates`)."""
    return [part for part in getattr(getattr(trainer, "optimizer", None), "parts", {}).values()
            if hasattr(part, "record_updates")]


# ---- the trainer hook ----------------------------------------------------------------------

class Diagnostics:
    """Trainer(on_diagnostics=Diagnostics(model)). `model` is the unwrapped Transformer."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.groups: Optional[dict] = None  # built at the first call: after any FSDP wrapping

    def __call__(self, trainer: Any, step: int) -> Callable[[bool], None]:
        """`step` is the row's step (as for the train row of this batch; 0 for the profile at
        initialization of a `train.steps=0` run). Gradients must be present."""
        import torch

        if self.groups is None:
            self.groups = role_groups(self.model)
        values = {f"grad_norm/{k}": v for k, v in grad_norms(self.model).items()}
        x, _ = trainer.batches.get(max(step - 1, 0), 0)  # the batch these gradients came from
        x = x.to(trainer.device)
        values.update(activation_stats(self.model, x, trainer.autocast))
        before = {name: [p.detach().clone() for p in ps] for name, ps in self.groups.items()}
        recorders = update_recorders(trainer)
        for part in recorders:  # the next step records its update (Muon's update_rms)
            part.record_updates = True

        def finish(updated: bool) -> None:
            """After the optimizer step (updated=True) or instead of it (a skipped step, a
            diverged step, the init profile): log the row."""
            if updated:
                values.update({f"update_ratio/{k}": v
                               for k, v in update_ratios(self.groups, before).items()})
                values.update({f"update_rms/{k}": v for part in recorders for k, v in part.update_rms.items()})
            for part in recorders:
                part.record_updates = False
                part.update_rms.clear()
            before.clear()
            keys = list(values)
            nums = torch.stack([values[k].detach().float().reshape(()) for k in keys]).tolist()
            row: dict[str, Any] = {"step": step, TOKENS: step * trainer.tokens_per_step}
            for k, v in zip(keys, nums):
                if not (k.startswith("update_ratio/") and math.isnan(v)):
                    row[PREFIX + k] = v
            row[PREFIX + "loss_spikes"] = getattr(trainer, "loss_spikes", 0)
            if trainer.is_main and trainer.sinks is not None:
                trainer.sinks.log(row)

        return finish


# ---- gradient profile at initialization (`ablate inspect --grad-profile`) ------------------

def grad_profile(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[dict]:
    """One forward/backward of the training objective on (x, y); per block the grad norm of
    all its weights (and of its attention and FFN), first block to last. No update."""
    model.zero_grad(set_to_none=True)
    model(x, y).loss.backward()
    norms = {k: float(v) for k, v in grad_norms(model).items()}
    model.zero_grad(set_to_none=True)
    return [{"layer": i, GRAD_NORM: norms[f"block{i}"], "attn": norms.get(f"block{i}.attn"),
             "ffn": norms.get(f"block{i}.ffn")} for i in range(len(model.blocks))]


def profile_from_row(row: dict) -> dict:
    """The profile from a logged diagnostics row (`diag/grad_norm/block{i}[.attn|.ffn]`)."""
    layers, i = [], 0
    while f"{PREFIX}grad_norm/block{i}" in row:
        g = f"{PREFIX}grad_norm/block{i}"
        layers.append({"layer": i, GRAD_NORM: float(row[g]), "attn": row.get(g + ".attn"),
                       "ffn": row.get(g + ".ffn")})
        i += 1
    return {"layers": layers}


def profile_json(profile: dict) -> dict:
    """The public JSON shape: {"layers": [{"layer": 0, "grad_norm": ...}, ...]}."""
    return {"layers": [{"layer": r["layer"], GRAD_NORM: r[GRAD_NORM]} for r in profile["layers"]]}


def format_profile(profile: dict) -> str:
    rows = profile["layers"]
    top = max((r[GRAD_NORM] for r in rows if math.isfinite(r[GRAD_NORM])), default=0.0) or 1.0
    lines = ["gradient norm by layer at initialization (one batch)",
             f"{'layer':>5}  {'block':>10}  {'attn':>10}  {'ffn':>10}"]
    for r in rows:
        bar = "#" * int(round(30 * r[GRAD_NORM] / top)) if math.isfinite(r[GRAD_NORM]) else "?"
        lines.append(f"{r['layer']:>5}  {r[GRAD_NORM]:>10.4g}  {r['attn'] or 0:>10.4g}  "
                     f"{r['ffn'] or 0:>10.4g}  {bar}")
    return "\n".join(lines)
