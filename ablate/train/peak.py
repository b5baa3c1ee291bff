"""Device peak FLOP/s, the denominator of MFU (model FLOPs utilisation) in `ablate bench` and in
every metrics row: a spec-sheet table for GPUs, a timed fp32 matmul on CPU."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

# Dense (no sparsity) peaks in FLOP/s: (name fragment, bf16 tensor core, fp32 non-tensor-core).
# Matched in order against torch.cuda.get_device_name(), so specific names come first.
GPU_PEAKS: list[tuple[str, float, float]] = [
    ("H100 PCIe", 756e12, 51e12),
    ("H100 NVL", 835e12, 60e12),
    ("H100", 989e12, 67e12),  # SXM ("NVIDIA H100 80GB HBM3")
    ("H200", 989e12, 67e12),
    ("H20", 148e12, 44e12),
    ("GH200", 989e12, 67e12),
    ("B200", 2250e12, 80e12),
    ("A100", 312e12, 19.5e12),
    ("A800", 312e12, 19.5e12),
    ("A6000", 155e12, 38.7e12),
    ("L40S", 362e12, 91.6e12),
    ("L40", 181e12, 90.5e12),
    ("L4", 121e12, 30.3e12),
    ("A10G", 70e12, 31.2e12),
    ("A10", 125e12, 31.2e12),
    ("RTX 4090", 165e12, 82.6e12),
    ("RTX 3090", 71e12, 35.6e12),
    ("V100", 125e12, 15.7e12),  # fp16 tensor cores (no bf16)
    ("T4", 65e12, 8.1e12),  # fp16 tensor cores (no bf16)
]


@dataclass
class Peak:
    flops: Optional[float]  # FLOP/s; None when unknown
    source: str  # how it was obtained, printed beside the MFU


# Pre-Ampere GPUs have no TF32: their fp32 matmuls run at the fp32 peak whatever train.tf32 says.
NO_TF32 = ("V100", "T4")


def gpu_peak(device_name: str, precision: str) -> Peak:
    """precision: bf16, fp32 (no tensor cores) or tf32 (fp32 matmuls on TF32 tensor cores:
    half the dense bf16 rate on Ampere and later)."""
    for fragment, bf16, fp32 in GPU_PEAKS:
        if fragment.lower() in device_name.lower():
            if precision == "tf32" and fragment in NO_TF32:
                precision = "fp32"
            value = {"bf16": bf16, "tf32": bf16 / 2}.get(precision, fp32)
            return Peak(value, f"{fragment} {precision} spec sheet ({value / 1e12:.0f} TFLOP/s)")
    return Peak(None, f"unknown GPU '{device_name}': no MFU")


_cpu_peaks: dict[tuple, Peak] = {}


def measure_cpu_peak(n: int = 512, reps: int = 3, clock: Callable[[], float] = time.perf_counter) -> Peak:
    """The best of `reps` timed (n x n) @ (n x n) fp32 matmuls on this machine, with the
    threads torch uses for training: the practical ceiling of a dense fp32 model here.
    Measured once per process, setting and clock, so every metrics row's MFU divides by the
    same peak. The trainer uses the cheap default (~0.1 s on 2 cores; a smaller matmul
    reaches a lower rate, so its MFU reads higher); `ablate bench` times 1024 x 1024, 8 times."""
    key = (n, reps, torch.get_num_threads(), clock)
    if key not in _cpu_peaks:
        _cpu_peaks[key] = _time_matmul(n, reps, clock)
    return _cpu_peaks[key]


def _time_matmul(n: int, reps: int, clock: Callable[[], float]) -> Peak:
    g = torch.Generator().manual_seed(0)  # its own generator: training's RNG stream is untouched
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    a @ b  # warm-up: thread pool, caches
    best = math.inf
    for _ in range(reps):
        t0 = clock()
        a @ b
        best = min(best, clock() - t0)
    flops = 2 * n ** 3 / best
    return Peak(flops, f"measured: {n}x{n} fp32 matmul on this CPU, {torch.get_num_threads()} "
                       f"threads ({flops / 1e9:.1f} GFLOP/s)")


def tf32_matmuls() -> bool:
    """Whether fp32 matmuls on CUDA may use TF32. Read through the new API where torch has it:
    reading the legacy flag after the new one was set raises."""
    precision = getattr(torch.backends.cuda.matmul, "fp32_precision", None)
    return precision == "tf32" if precision is not None else bool(torch.backends.cuda.matmul.allow_tf32)


def device_peak(device: torch.device, precision: str,
                clock: Callable[[], float] = time.perf_counter, **cpu: int) -> Peak:
    """precision: the trainer's (bf16 | fp32); fp32 on a CUDA device whose matmuls may use
    TF32 (train.tf32) is priced at the TF32 peak."""
    if device.type == "cuda":
        if precision == "fp32" and tf32_matmuls():
            precision = "tf32"
        return gpu_peak(torch.cuda.get_device_name(device), precision)
    return measure_cpu_peak(clock=clock, **cpu)  # the same clock as the steps, so MFU is consistent
