"""Device peak FLOP/s, the denominator of MFU (model FLOPs utilisation) in `ablate bench` and in
every metrics row: a spec-sheet table for GPUs; none on CPU (CPU_NO_PEAK says why)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

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


# No CPU peak: a CPU's attainable FLOP/s is not a property of the machine one can measure once.
# On the shared 2-core machine the best of 20 timed 1024x1024 fp32 matmuls read 58 GFLOP/s while
# other work ran and 155-177 GFLOP/s idle (2026-11-23), and the tiny model's own steps exceeded
# the loaded figure: an MFU against it read above 100%. So a CPU run reports tokens/s, no MFU.
CPU_NO_PEAK = ("CPU: no MFU (a CPU's peak FLOP/s cannot be measured repeatably while other work "
               "shares it; compare tokens/s)")


def tf32_matmuls() -> bool:
    """Whether fp32 matmuls on CUDA may use TF32. Read through the new API where torch has it:
    reading the legacy flag after the new one was set raises."""
    precision = getattr(torch.backends.cuda.matmul, "fp32_precision", None)
    return precision == "tf32" if precision is not None else bool(torch.backends.cuda.matmul.allow_tf32)


def device_peak(device: torch.device, precision: str) -> Peak:
    """precision: the trainer's (bf16 | fp32); fp32 on a CUDA device whose matmuls may use
    TF32 (train.tf32) is priced at the TF32 peak. Elsewhere no peak (CPU_NO_PEAK)."""
    if device.type == "cuda":
        if precision == "fp32" and tf32_matmuls():
            precision = "tf32"
        return gpu_peak(torch.cuda.get_device_name(device), precision)
    return Peak(None, CPU_NO_PEAK if device.type == "cpu" else f"{device.type}: no MFU (no known peak)")


def mfu(tokens_per_s: Optional[float], flops_per_token: Optional[float], peak: Peak,
        devices: int = 1) -> Optional[float]:
    """Model FLOPs utilisation: model FLOPs/token x tokens/s over the peak of all devices. None
    when a figure is missing, or when it would exceed 1: then the peak is not this machine's
    ceiling, and a number above 100% would be no measurement."""
    if not tokens_per_s or not flops_per_token or not peak.flops:
        return None
    value = tokens_per_s * flops_per_token / (peak.flops * devices)
    return value if value <= 1.0 else None
