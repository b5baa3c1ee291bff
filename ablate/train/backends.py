"""Process-wide torch settings a run asks for: TF32, deterministic algorithms, the SDPA kernel,
and a clean torch.compile state per model.

They are global to the process, so every Trainer sets all of them explicitly (on and off): a
sweep's jobs run one after another in one process (basic launcher), and one job's setting
must not leak into the next.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Any, Optional

import torch

from ablate.errors import ConfigError
from ablate.run.record import BackendSettings

# cuBLAS keeps per-stream workspaces whose reuse makes results depend on scheduling; this
# setting (NVIDIA's documented one for reproducibility) makes them deterministic. It is read
# when the process creates its cuBLAS handle: set it before the first CUDA matmul.
CUBLAS_WORKSPACE = ":4096:8"
# train.sdpa_backend -> torch's switch for that kernel; `auto` restores torch's own defaults.
SDPA_SWITCHES = {"flash": "flash_sdp", "efficient": "mem_efficient_sdp", "cudnn": "cudnn_sdp",
                 "math": "math_sdp"}
SDPA_DEFAULTS = {name: getattr(torch.backends.cuda, f"{switch}_enabled")()
                 for name, switch in SDPA_SWITCHES.items()}
CUDA_ONLY_SDPA = ("efficient", "cudnn")  # PyTorch's CPU SDPA has a flash kernel and math only


def configure_backends(cfg: Any, device_type: str) -> BackendSettings:
    """Apply train.tf32, train.deterministic and train.sdpa_backend; returns what was set
    (recorded in summary.json)."""
    deterministic = bool(cfg.deterministic)
    if deterministic:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE  # before any cuBLAS handle exists
    set_deterministic(deterministic, compiles=bool(cfg.compile or cfg.compile_optimizer or cfg.flex_attention))
    settings = BackendSettings(deterministic=deterministic)
    from ablate.model import flex

    flex.enable(bool(cfg.flex_attention))
    if cfg.flex_attention:
        settings.flex_attention = True
    sdpa = str(cfg.sdpa_backend)
    set_sdpa_backend(sdpa, device_type, deterministic)
    if sdpa != "auto":
        settings.sdpa_backend = sdpa
    if device_type == "cuda":
        torch.backends.cudnn.deterministic = deterministic
        torch.backends.cudnn.benchmark = False  # autotuned conv algorithms vary run to run
        set_tf32(bool(cfg.tf32))
        settings.tf32 = bool(cfg.tf32)
    return settings  # CPU: TF32 is a CUDA tensor-core format; nothing to set


def set_deterministic(mode: bool, compiles: bool) -> None:
    """torch.use_deterministic_algorithms(mode): raises on an op that has no deterministic
    implementation instead of silently differing; it also makes SDPA's flash and memory-efficient
    backward kernels deterministic (one split over the keys, no atomic adds) and Inductor skip
    autotuning that changes numerics. It sets Inductor's flag by importing Inductor's config,
    which imports torch._dynamo (~2 CPU-s, most of a tiny eager run's start-up): off, in a
    process where neither flag was ever set and nothing compiles, there is nothing to switch off."""
    inductor = sys.modules.get("torch._inductor.config")
    already_off = not torch.are_deterministic_algorithms_enabled() and (
        inductor.deterministic is False if inductor is not None else not compiles)
    if mode or not already_off:
        torch.use_deterministic_algorithms(mode)


def set_sdpa_backend(name: str, device_type: str, deterministic: bool = False) -> None:
    """Every SDPA switch set explicitly (they are process-wide, like the settings above). One
    kernel name keeps only that kernel: no silent fallback to math, so `bench --vs
    train.sdpa_backend=cudnn` times cuDNN or fails. cuDNN attention's backward is not
    deterministic: off under train.deterministic (config.validate refuses asking for both)."""
    if name in CUDA_ONLY_SDPA and device_type != "cuda":
        raise ConfigError(f"train.sdpa_backend={name} is a CUDA kernel; on {device_type} use auto, "
                          "flash or math")
    for kernel, switch in SDPA_SWITCHES.items():
        on = SDPA_DEFAULTS[kernel] if name == "auto" else kernel == name
        getattr(torch.backends.cuda, f"enable_{switch}")(on and not (kernel == "cudnn" and deterministic))


def check_sdpa_backend(name: str, n_heads: int, head_dim: int, device: torch.device,
                       dtype: torch.dtype) -> None:
    """Fail at start-up, in one line, when the chosen SDPA kernel cannot run this model's
    attention (flash and cuDNN take no fp32; head sizes are limited), not at the first step."""
    if name == "auto":
        return
    q = torch.randn(1, n_heads, 16, head_dim, device=device, dtype=dtype, requires_grad=True)
    try:
        with warnings.catch_warnings():  # torch warns once per reason, then raises
            warnings.simplefilter("ignore")
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    except RuntimeError as e:
        dt = str(dtype).removeprefix("torch.")
        raise ConfigError(f"train.sdpa_backend={name} cannot run this model's attention on "
                          f"{device.type} ({dt}, head_dim {head_dim}): {str(e).splitlines()[0][:160]}; "
                          "use train.sdpa_backend=auto") from None


def set_tf32(enabled: bool) -> None:
    """fp32 matmuls and cuDNN convolutions on TF32 tensor cores (Ampere and later): ~8x the
    fp32 rate on an A100/H100 with a 10-bit mantissa in the products, fp32 accumulation.
    Through the legacy flags: torch reads them back through either API, whereas setting the
    new API makes a later read of the legacy flag (Inductor still reads some) raise."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def compile_model(model: torch.nn.Module, backend: str, mode: str = "default") -> torch.nn.Module:
    """torch.compile from a clean dynamo state. Dynamo caches compiled code per code object
    (Transformer.forward is one object for every variant) with a guard per model, up to
    torch._dynamo.config.recompile_limit (8) entries; past that it runs the function eagerly,
    so the 9th model of a process (sweep job, bench variant) silently lost compile."""
    reset_compile_state()
    return torch.compile(model, backend=backend, mode=None if mode == "default" else mode)


def reset_compile_state() -> None:
    if "torch._dynamo" in sys.modules:  # else nothing was compiled yet (and its import costs ~1 s)
        torch._dynamo.reset()


def graphs_compiled() -> int:
    """FX graphs dynamo has compiled in this process (not cleared by reset). A compiled model
    whose first step adds none runs eagerly: dynamo skips code it gave up on earlier, silently."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


class RecompileWatch(logging.Handler):
    """Notices dynamo giving up on a function (its recompile limit hit) while installed.
    Dynamo says so only in a logging warning ("torch._dynamo hit config.recompile_limit (8)");
    counters of it are cleared by torch._dynamo.reset()."""

    LOGGER = "torch._dynamo.convert_frame"

    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.hits: list[str] = []

    def check_compiled(self, graphs_before: int) -> None:
        """After a compiled model's first call: it must have compiled a graph."""
        if graphs_compiled() == graphs_before:
            self.hits.append("no graph compiled for this model: dynamo skips its code "
                             "(a recompile limit was hit earlier in this process)")

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("torch._dynamo hit config."):
            lines = [ln.strip() for ln in message.splitlines()]
            where = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("function:")), "")
            self.hits.append(f"{lines[0].removeprefix('torch._dynamo ')}" + (f" for {where}" if where else ""))

    def __enter__(self) -> "RecompileWatch":
        logging.getLogger(self.LOGGER).addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger(self.LOGGER).removeHandler(self)

    @property
    def reason(self) -> Optional[str]:
        return self.hits[0] if self.hits else None
