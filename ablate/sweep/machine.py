"""What this machine offers a sweep's jobs: its visible GPUs and the cores this process may use."""

from __future__ import annotations


def visible_gpus() -> int:
    """CUDA devices this process sees (CUDA_VISIBLE_DEVICES applies); 0 without CUDA."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def usable_cores() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1
