"""train.micro_batch: how many sequences one forward pass takes.

The global batch per rank is `batch_size x grad_accum` sequences; the micro-batch only decides
how it is cut into forward/backward passes. Batches hands out the same windows for any cut
(ablate/data/batches.py), so changing it changes nothing but the order of a gradient sum and the
speed: a GPU is fastest with the largest micro-batch that fits. `auto` finds that one on CUDA by
trying a forward and backward pass; CPU memory is not what limits a CPU, so there it keeps
`batch_size`.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from ablate.errors import ConfigError

# Share of the memory that the probe may use: the optimizer's state is added to what it
# measured, and this leaves room for the allocator's fragmentation and compiled kernels.
HEADROOM = 0.9


def divisors_desc(n: int) -> list[int]:
    return [m for m in range(n, 0, -1) if n % m == 0]


def largest_fitting(global_batch: int, fits: Callable[[int], bool]) -> Optional[int]:
    """The largest divisor of global_batch for which fits(m) holds (memory grows with m: the
    first one that fits, from the top), or None."""
    return next((m for m in divisors_desc(global_batch) if fits(m)), None)


def resolve_micro_batch(cfg: Any, model: torch.nn.Module, device: torch.device, autocast,
                        optimizer_bytes: Optional[int] = None) -> int:
    """The micro-batch this run trains with (see the module docstring); `cfg` is the train group,
    optimizer_bytes the state its optimizers will hold (ablate/train/optimizer.py: state_bytes;
    None: AdamW's two moments per parameter)."""
    global_batch = cfg.batch_size * cfg.grad_accum
    setting = cfg.micro_batch
    if setting is None:
        return cfg.batch_size
    if setting != "auto":
        return int(setting)  # config.validate: a divisor of batch_size x grad_accum
    if device.type != "cuda":
        return cfg.batch_size
    m = largest_fitting(global_batch, lambda m: cuda_fits(model, m, cfg.seq_len, device, autocast, optimizer_bytes))
    if m is None:
        raise ConfigError(f"train.micro_batch=auto: not even one sequence of train.seq_len={cfg.seq_len} "
                          f"fits in the memory of {device}; lower train.seq_len or the model size")
    return m


def cuda_fits(model: torch.nn.Module, m: int, seq_len: int, device: torch.device, autocast,
              optimizer_bytes: Optional[int] = None) -> bool:
    """One eager forward and backward pass of m sequences, plus the optimizers' state (not
    allocated yet: `optimizer_bytes`, else AdamW's two fp32 moments per parameter), within
    HEADROOM of the memory this process can have: what is
    free on the device now (other jobs on the GPU hold the rest) plus what it holds already.
    Eager uses more memory than the compiled step, so the choice errs small. RNG state is
    restored: the probe consumes no randomness of the run (dropout masks stay paired)."""
    params = list(model.parameters())
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    budget = HEADROOM * (free + torch.cuda.memory_reserved(device))
    optimizer_state = (2 * sum(p.numel() for p in params if p.requires_grad) * 4
                       if optimizer_bytes is None else optimizer_bytes)
    torch.cuda.reset_peak_memory_stats(device)
    vocab = model.spec.vocab_size
    try:
        with torch.random.fork_rng(devices=[device]):
            x = torch.randint(0, vocab, (m, seq_len + 1), device=device)
            with autocast():
                out = model(x[:, :-1], x[:, 1:])
            out.loss.backward()
            del out, x
        peak = torch.cuda.max_memory_allocated(device)
        return peak + optimizer_state <= budget
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        for p in params:
            p.grad = None
        torch.cuda.empty_cache()
