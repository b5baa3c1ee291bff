"""Device peak FLOP/s, the denominator of MFU (model FLOPs utilisation) in `ablate bench` and in
every metrics row: a spec-sheet table for GPUs, a timed fp32 matmul on CPU, cached per machine."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from ablate.rundir import write_atomic

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


# The CPU peak: the best of PEAK_REPS timed PEAK_N x PEAK_N fp32 matmuls, the practical ceiling
# of a dense fp32 model here. The best of many is what repeats (interference only slows a
# timing down); docs/performance.md shows the spread. Measured once per machine, thread count
# and torch build, and cached on disk, so every run and bench on a machine divides by the same
# peak: MFU then differs between runs only as their measured speed does.
PEAK_N, PEAK_REPS = 1024, 20
PEAK_FILE = "cpu-peak.json"
_cpu_peaks: dict[str, Peak] = {}


def cpu_name() -> str:
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _peak_cache() -> Path:
    return Path(os.environ.get("ABLATE_CACHE", Path.home() / ".cache" / "ablate")) / PEAK_FILE


def cpu_peak() -> Peak:
    """This machine's cached CPU peak (measured on first use), with the threads torch uses."""
    key = f"{cpu_name()} | {torch.get_num_threads()} threads | torch {torch.__version__}"
    if key in _cpu_peaks:
        return _cpu_peaks[key]
    path = _peak_cache()
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if isinstance(cached.get(key), (int, float)) and cached[key] > 0:
        flops = float(cached[key])
    else:
        flops = _time_matmul(PEAK_N, PEAK_REPS, time.perf_counter)
        try:  # another process may write the same key meanwhile: last write wins, both measured
            path.parent.mkdir(parents=True, exist_ok=True)
            cached = cached if isinstance(cached, dict) else {}
            write_atomic(path, json.dumps({**cached, key: flops}, indent=2) + "\n")
        except OSError:
            pass  # an unwritable cache: measured in every process instead
    _cpu_peaks[key] = Peak(flops, f"measured: best of {PEAK_REPS} {PEAK_N}x{PEAK_N} fp32 matmuls on this "
                                  f"CPU, {torch.get_num_threads()} threads ({flops / 1e9:.1f} GFLOP/s; cached in {path})")
    return _cpu_peaks[key]


def _time_matmul(n: int, reps: int, clock: Callable[[], float]) -> float:
    """FLOP/s of the fastest of `reps` (n x n) @ (n x n) fp32 matmuls timed with `clock`."""
    g = torch.Generator().manual_seed(0)  # its own generator: training's RNG stream is untouched
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    a @ b  # warm-up: thread pool, caches
    best = math.inf
    for _ in range(reps):
        t0 = clock()
        a @ b
        best = min(best, clock() - t0)
    return 2 * n ** 3 / best


def tf32_matmuls() -> bool:
    """Whether fp32 matmuls on CUDA may use TF32. Read through the new API where torch has it:
    reading the legacy flag after the new one was set raises."""
    precision = getattr(torch.backends.cuda.matmul, "fp32_precision", None)
    return precision == "tf32" if precision is not None else bool(torch.backends.cuda.matmul.allow_tf32)


def device_peak(device: torch.device, precision: str,
                clock: Callable[[], float] = time.perf_counter) -> Peak:
    """precision: the trainer's (bf16 | fp32); fp32 on a CUDA device whose matmuls may use
    TF32 (train.tf32) is priced at the TF32 peak. On CPU the cached peak, unless the steps are
    timed with another clock (`ablate bench --clock cpu`): then the peak is timed with it too."""
    if device.type == "cuda":
        if precision == "fp32" and tf32_matmuls():
            precision = "tf32"
        return gpu_peak(torch.cuda.get_device_name(device), precision)
    if clock is time.perf_counter:
        return cpu_peak()
    flops = _time_matmul(PEAK_N, PEAK_REPS, clock)
    return Peak(flops, f"measured with --clock cpu: best of {PEAK_REPS} {PEAK_N}x{PEAK_N} fp32 matmuls "
                       f"({flops / 1e9:.1f} GFLOP/s)")


def mfu(tokens_per_s: Optional[float], flops_per_token: Optional[float], peak: Peak,
        devices: int = 1) -> Optional[float]:
    """Model FLOPs utilisation: model FLOPs/token x tokens/s over the peak of all devices. None
    when a figure is missing, or when it would exceed 1: then the peak is not this machine's
    ceiling, and a number above 100% would be no measurement."""
    if not tokens_per_s or not flops_per_token or not peak.flops:
        return None
    value = tokens_per_s * flops_per_token / (peak.flops * devices)
    return value if value <= 1.0 else None
