"""The run's optimizers (axis `optim`), built behind one container, and how their step runs.

optim=adamw: one AdamW over every parameter (the groups of ablate/model/roles.py: weight decay by
role; param=mup / completep's LR and decay multipliers per group, completep's epsilon), as before
the axis existed. optim=muon: Muon (ablate/train/optimizers/muon.py) on each logical hidden matrix
(ablate/train/optimizers/matrices.py), AdamW on embeddings, head, gains, biases and scalars; both
inside one Optimizers container (ablate/train/optimizers/container.py). The rules per optimizer:
- weight decay: the role table (matrices decay, gains/biases/scalars never), decoupled in both
  (p *= 1 - lr * weight_decay with the group's unadjusted LR, as torch.optim.Muon);
- learning rate: each group's `lr_mult` times the scheduled train.lr. match_rms_adamw: Muon's
  update is scaled to AdamW's RMS, so one train.lr serves both, and mup's per-group multipliers
  (MuAdam's) apply to both. original: train.lr is Muon's, optim.adam_lr the AdamW part's
  (its groups carry adam_lr / train.lr, so the schedule and --lr-grid move both at that ratio);
- epsilon (completep) and train.beta1 / beta2: the AdamW part's (Muon has neither).

How the AdamW part runs: one fused kernel (default), or a step torch.compile generates
(train.compile_optimizer), a lever of issue 17 to be priced with `ablate bench --vs`.

torch.compile does not trace the fused kernel (it is compiler-disabled), so the compiled step
is the foreach implementation (per-tensor on CPU), which Inductor fuses into a few generated
kernels. The learning rate is a tensor filled in place: a float that changes every step is a
guard that fails every step, and dynamo gives up after 8 recompiles.

On the 2-core CPU the compiled step is slower than the fused kernel (4.3 ms vs 1.8 ms for
24 x 256 x 256 parameters, after ~20 s of compiling), so it is off by default; its GPU figure
is measured by scripts/gpu-measure.sh. Muon has no fused or foreach form (nor has
torch.optim.Muon): its step is a loop over matrices, compiled with the rest when asked.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from ablate.model.parametrization import ADAM_EPS
from ablate.model.roles import param_groups, role_of
from ablate.train.optimizers.container import Optimizers
from ablate.train.optimizers.matrices import muon_matrices
from ablate.train.optimizers.muon import Muon, lr_ratio
from ablate.train.optimizers.optim_settings import OptimSpec


def implementation(cfg: Any, device: torch.device) -> dict:
    """AdamW's keyword arguments for how it runs (not what it computes)."""
    if cfg.compile_optimizer:
        # capturable: the step counts stay on the GPU (no host sync inside the graph; CUDA graphs
        # can replay it). Eager AdamW refuses capturable on CPU, where a dynamo fallback would
        # run it, and there is no sync to avoid: the per-tensor loop there, which dynamo fuses.
        cuda = device.type == "cuda"
        return {"foreach": cuda, "fused": None, "capturable": cuda}
    # One kernel over all parameters, on CPU too (torch >= 2.4): 7x faster than the
    # per-tensor loop at 124M params, measured with `ablate bench`.
    return {"foreach": None, "fused": True if device.type in ("cuda", "cpu") else None, "capturable": False}


def _multipliers(model: torch.nn.Module) -> Optional[dict]:
    rules = getattr(model, "param_rules", None)
    return rules and {n: (r.lr_mult, r.wd_mult) for n, r in rules.items()}


def adamw_groups(model: torch.nn.Module, cfg: Any, optim: OptimSpec, exclude: set[int]) -> list[dict]:
    """AdamW's groups (roles.param_groups: decay by role, the parametrization's multipliers)
    without the parameters in `exclude` (Muon's); under optim.adjust=original each carries
    optim.adam_lr / train.lr in its lr_mult."""
    groups = param_groups(model, cfg.weight_decay, _multipliers(model))
    if not exclude:
        return groups
    ratio, out = optim.adam_lr_mult(cfg.lr), []
    for group in groups:
        rest = [p for p in group["params"] if id(p) not in exclude]
        if rest:
            out.append({**group, "params": rest, **({"lr_mult": group.get("lr_mult", 1.0) * ratio}
                                                     if ratio != 1.0 else {})})
    return out


def muon_groups(model: torch.nn.Module, cfg: Any) -> tuple[list[dict], dict]:
    """Muon's groups, one per (role, LR multiplier, decay multiplier), named `muon.<role>`
    (`muon.<role>.lr_x<mult>` under mup), and id(parameter) -> its logical matrices."""
    mults = _multipliers(model) or {}
    groups: dict[tuple, dict] = {}
    matrices = {}
    for name, p, ms in muon_matrices(model):
        lr_mult, wd_mult = mults.get(name, (1.0, 1.0))
        role = role_of(p).value
        key = (role, lr_mult, wd_mult)
        if key not in groups:
            suffix = f".lr_x{lr_mult:.6g}" if (lr_mult, wd_mult) != (1.0, 1.0) else ""
            groups[key] = {"params": [], "weight_decay": cfg.weight_decay * wd_mult, "name": f"muon.{role}{suffix}",
                           **({"lr_mult": lr_mult} if lr_mult != 1.0 else {})}
        groups[key]["params"].append(p)
        matrices[id(p)] = ms
    return list(groups.values()), matrices


def build_optimizer(model: torch.nn.Module, cfg: Any, device: torch.device,
                    optim: Optional[OptimSpec] = None) -> Optimizers:
    """The run's optimizers (cfg: the `train` group; optim: the `optim` axis, AdamW when None).
    Each group's LR is train.lr times its `lr_mult` (kept by set_lr); a tensor filled in place
    under compile_optimizer."""
    optim = optim or OptimSpec()
    impl = implementation(cfg, device)
    eps = ADAM_EPS * getattr(getattr(model, "parametrization", None), "eps_mult", 1.0)
    parts: dict[str, tuple[list[dict], Callable]] = {}
    exclude: set[int] = set()
    if optim.muon:
        groups, matrices = muon_groups(model, cfg)
        exclude = set(matrices)
        parts["muon"] = (groups, lambda g: Muon(g, lr=cfg.lr, momentum=optim.momentum, nesterov=optim.nesterov,
                                                ns_steps=optim.ns_steps, adjust=optim.adjust, matrices=matrices))
    parts["adamw"] = (adamw_groups(model, cfg, optim, exclude),
                      lambda g: torch.optim.AdamW(g, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=eps, **impl))
    for groups, _ in parts.values():
        for group in groups:  # each group's own tensor under compile_optimizer, filled by set_lr
            mult = group.get("lr_mult", 1.0)
            group["lr"] = torch.tensor(float(cfg.lr) * mult) if cfg.compile_optimizer else cfg.lr * mult
    return Optimizers({name: make(groups) for name, (groups, make) in parts.items() if groups})


def set_lr(optimizer: Any, lr: float) -> None:
    """The schedule's LR into every group, times the group's own multiplier (param=mup; the AdamW
    part's adam_lr / train.lr under optim.adjust=original)."""
    for group in optimizer.param_groups:
        value = lr * group.get("lr_mult", 1.0)
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(value)  # in place: the compiled step reads it, no recompile
        else:
            group["lr"] = value


def restore_implementation(optimizer: Optimizers, cfg: Any, device: torch.device) -> None:
    """After load_state_dict, which takes foreach/fused/capturable and the lr's type from the
    checkpoint: this run's implementation again, whichever one saved the state."""
    impl = implementation(cfg, device)
    for name, part in optimizer.parts.items():
        for group in part.param_groups:
            if name == "adamw":
                group.update(impl)
            lr = float(group["lr"])
            group["lr"] = torch.tensor(lr) if cfg.compile_optimizer else lr
            if name != "adamw":
                continue
            for p in group["params"]:
                state = part.state.get(p)
                if state and "step" in state:  # capturable and fused keep it on the parameter's device
                    on_device = impl["capturable"] or impl["fused"]
                    state["step"] = state["step"].to(dtype=torch.float32,
                                                     device=p.device if on_device else "cpu")


def optimizer_step(optimizer: Optimizers, cfg: Any) -> Callable[[], None]:
    """The update to call each step. Compiled after the Trainer reset dynamo's state."""
    if not cfg.compile_optimizer:
        return optimizer.step
    # Optimizer.step's profiler label is dropped from the graph, which dynamo warns about once
    # per process: noise on every run's console, not a problem of the run.
    logging.getLogger("torch._dynamo.variables.ctx_manager").setLevel(logging.ERROR)
    return torch.compile(optimizer.step, backend=cfg.compile_backend)


def state_bytes(model: torch.nn.Module, optim: Optional[OptimSpec] = None) -> int:
    """The bytes of optimizer state the run's optimizers will allocate: per parameter, AdamW's
    two moments, or the state_per_param its optim option declares (Muon: one momentum buffer);
    the micro-batch probe adds them to what it measured (before any is allocated)."""
    optim = optim or OptimSpec()
    hidden = {id(p) for _, p, _ in muon_matrices(model)} if optim.muon else set()
    adamw = OptimSpec().option.state_per_param
    seen, total = set(), 0
    for p in model.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            slots = optim.option.state_per_param if id(p) in hidden else adamw
            total += slots * p.numel() * p.element_size()
    return total


@dataclass(frozen=True)
class MatrixRow:
    """One logical matrix as the run's optimizer updates it (`ablate inspect optim=muon`)."""

    parameter: str  # its parameter's name, the layer index as `*` when every layer has it
    # which rows ("rows 0:128"), a bank's experts ("each of 8 experts", each its own matrix), or a
    # component's own label; "" for the whole parameter
    matrix: str
    optimizer: str  # muon | adamw
    shape: tuple[int, ...]  # what Newton-Schulz orthogonalizes (rows x cols); the parameter's under AdamW
    lr: float  # its LR at train.lr (Muon's adjusted LR; `effective_lr` in JSON)
    layers: int  # how many layers have it

    def as_dict(self) -> dict:
        return {"parameter": self.parameter, "matrix": self.matrix, "optimizer": self.optimizer,
                "shape": list(self.shape), "effective_lr": self.lr, "layers": self.layers}


def matrix_rows(model: torch.nn.Module, cfg: Any, optim: OptimSpec) -> list[MatrixRow]:
    """Every parameter's matrices with their optimizer, orthogonalized shape and LR at train.lr
    (the model may be built on the meta device); layers with the same rows are one row, and so
    are a bank's experts (the same rows of each: "each of 8 experts")."""
    import re

    mults = _multipliers(model) or {}
    rows: dict[tuple, MatrixRow] = {}
    names: dict[tuple, set] = {}  # the parameters each row stands for
    hidden = {id(p): (name, ms) for name, p, ms in muon_matrices(model)} if optim.muon else {}
    adam_ratio = optim.adam_lr_mult(cfg.lr)
    seen = set()
    for name, p in model.named_parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        lr_mult = mults.get(name, (1.0, 1.0))[0]
        pattern = re.sub(r"(?<=^blocks\.)\d+(?=\.)", "*", name)
        entries = ([(_row_label(m.label, p), "muon", m.shape, cfg.lr * lr_mult * lr_ratio(optim.adjust, m.shape))
                    for m in hidden[id(p)][1]] if id(p) in hidden else
                   [("", "adamw", tuple(p.shape), cfg.lr * lr_mult * adam_ratio)])
        for label, opt, shape, lr in entries:
            key = (pattern, label, opt, shape, lr)
            names.setdefault(key, set()).add(name)
            rows[key] = MatrixRow(pattern, label, opt, tuple(shape), lr, len(names[key]))
    return list(rows.values())


def _row_label(label: str, p: torch.Tensor) -> str:
    """A matrix's label in inspect's table: an expert's as every expert of its bank."""
    import re

    return re.sub(r"^expert \d+( ?)", lambda m: f"each of {p.shape[0]} experts" + (", " if m.group(1) else ""),
                  label) if p.ndim == 3 else label
