"""AdamW and how its step runs: one fused kernel (default), or a step torch.compile generates
(train.compile_optimizer), a lever of issue 17 to be priced with `ablate bench --vs`.

torch.compile does not trace the fused kernel (it is compiler-disabled), so the compiled step
is the foreach implementation (per-tensor on CPU), which Inductor fuses into a few generated
kernels. The learning rate is a tensor filled in place: a float that changes every step is a
guard that fails every step, and dynamo gives up after 8 recompiles.

On the 2-core CPU the compiled step is slower than the fused kernel (4.3 ms vs 1.8 ms for
24 x 256 x 256 parameters, after ~20 s of compiling), so it is off by default; its GPU figure
is measured by scripts/gpu-measure.sh.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch

from ablate.model.parametrization import ADAM_EPS
from ablate.model.roles import param_groups


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


def build_optimizer(model: torch.nn.Module, cfg: Any, device: torch.device) -> torch.optim.AdamW:
    """AdamW over the model's parameter groups; under param=mup / completep each group carries
    its LR multiplier (`lr_mult`, kept by set_lr) and weight decay, and completep scales epsilon
    (ablate/model/parametrization.py)."""
    impl = implementation(cfg, device)
    rules = getattr(model, "param_rules", None)
    eps = ADAM_EPS * getattr(getattr(model, "parametrization", None), "eps_mult", 1.0)
    groups = param_groups(model, cfg.weight_decay, rules and {n: (r.lr_mult, r.wd_mult) for n, r in rules.items()})
    for group in groups:  # each group's own tensor under compile_optimizer, filled by set_lr
        mult = group.get("lr_mult", 1.0)
        group["lr"] = torch.tensor(float(cfg.lr) * mult) if cfg.compile_optimizer else cfg.lr * mult
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=eps, **impl)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The schedule's LR into every group, times the group's own multiplier (param=mup)."""
    for group in optimizer.param_groups:
        value = lr * group.get("lr_mult", 1.0)
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(value)  # in place: the compiled step reads it, no recompile
        else:
            group["lr"] = value


def restore_implementation(optimizer: torch.optim.Optimizer, cfg: Any, device: torch.device) -> None:
    """After load_state_dict, which takes foreach/fused/capturable and the lr's type from the
    checkpoint: this run's implementation again, whichever one saved the state."""
    impl = implementation(cfg, device)
    for group in optimizer.param_groups:
        group.update(impl)
        lr = float(group["lr"])
        group["lr"] = torch.tensor(lr) if cfg.compile_optimizer else lr
        for p in group["params"]:
            state = optimizer.state.get(p)
            if state and "step" in state:  # capturable and fused keep it on the parameter's device
                on_device = impl["capturable"] or impl["fused"]
                state["step"] = state["step"].to(dtype=torch.float32,
                                                 device=p.device if on_device else "cpu")


def optimizer_step(optimizer: torch.optim.Optimizer, cfg: Any) -> Callable[[], None]:
    """The update to call each step. Compiled after the Trainer reset dynamo's state."""
    if not cfg.compile_optimizer:
        return optimizer.step
    # Optimizer.step's profiler label is dropped from the graph, which dynamo warns about once
    # per process: noise on every run's console, not a problem of the run.
    logging.getLogger("torch._dynamo.variables.ctx_manager").setLevel(logging.ERROR)
    return torch.compile(optimizer.step, backend=cfg.compile_backend)
