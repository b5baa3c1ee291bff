"""What a command's tensors will need, estimated before they are allocated, against the memory
this process may still take: `ablate eval` at a long length, `ablate sample`'s KV cache for many
tokens or many samples. A request that does not fit is refused in one line with the figure,
instead of a traceback (or the OOM killer) minutes later.

The estimate runs the same code on the meta device (shapes, no data, no time): the model is
built there, and a dispatch mode adds up the bytes of every tensor alive at once (a storage is
counted from the op that makes it until the last tensor on it is gone); its peak is what the
real pass allocates on top of the weights. Kernels' private scratch is not seen, so the
refusal keeps a margin (HEADROOM).
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any, Callable, Optional

from ablate.errors import ConfigError
from ablate.terminal import human_bytes

HEADROOM = 1.25  # measured peak / estimate: ALiBi at 8,192 tokens, 3.7 GB of RSS for 3.0 GiB estimated


def peak_bytes(fn: Callable[[], Any]) -> Optional[int]:
    """The most bytes that tensors made inside fn() hold at once (on the meta device: free);
    None when fn cannot run on the meta device (an op that reads values, as MoE routing may)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    import torch

    class Tracker(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.live = self.peak = 0
            self.refs: dict[int, int] = {}  # storage -> tensors on it

        def _release(self, key: int, nbytes: int) -> None:
            self.refs[key] -= 1
            if not self.refs[key]:
                del self.refs[key]
                self.live -= nbytes

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    storage = t.untyped_storage()
                    key, nbytes = storage._cdata, storage.nbytes()
                    if key not in self.refs:
                        self.refs[key] = 0
                        self.live += nbytes
                        self.peak = max(self.peak, self.live)
                    self.refs[key] += 1
                    weakref.finalize(t, self._release, key, nbytes)
            return out

    try:
        with torch.no_grad(), Tracker() as tracker:
            fn()
    except Exception:  # noqa: BLE001 - an estimate only: without one, nothing is refused
        return None
    return tracker.peak


def meta_model(spec: Any) -> Any:
    """The run's model on the meta device, in eval mode (its shapes only)."""
    import torch

    from ablate.model.transformer import Transformer

    with torch.device("meta"):
        return Transformer(spec).eval()


_estimated: dict = {}  # (the spec, batch, length) -> bytes: a sweep's runs share their specs


def forward_bytes(spec: Any, batch: int, length: int) -> Optional[int]:
    """Peak bytes of evaluation's pass over `batch` windows of `length` tokens: the forward
    (no gradient) and the fp32 cross-entropy over its logits (ablate/train/evaluate.py)."""
    key = (repr(spec), batch, length)
    if key not in _estimated:
        _estimated[key] = _forward_bytes(spec, batch, length)
    return _estimated[key]


def _forward_bytes(spec: Any, batch: int, length: int) -> Optional[int]:
    import torch
    import torch.nn.functional as F

    model = meta_model(spec)

    def one_pass():
        x = torch.zeros(batch, length, dtype=torch.long, device="meta")
        logits = model(x).logits
        F.cross_entropy(logits.float().flatten(0, 1), x.flatten(), reduction="sum")

    return peak_bytes(one_pass)


def decode_bytes(spec: Any, batch: int, prompt: int, capacity: int) -> Optional[int]:
    """Peak bytes of sampling: the KV cache of `capacity` positions for `batch` sequences (fp32,
    as the run's model loads) with the prefill of `prompt` tokens through it."""
    import torch

    from ablate.model.kv_cache import KVCache

    model = meta_model(spec)

    def prefill():
        cache = KVCache.for_model(model, batch=batch, capacity=capacity)
        model.decode(torch.zeros(batch, prompt, dtype=torch.long, device="meta"), cache, last=True)
        return cache

    return peak_bytes(prefill)


def _meminfo_available() -> Optional[int]:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room() -> Optional[int]:
    """A cgroup v2 memory limit's room (memory.max - memory.current), if this process has one."""
    try:
        rel = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                   if line.startswith("0::"))
        base = Path("/sys/fs/cgroup") / rel.strip().lstrip("/")
        limit = (base / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return int(limit) - int((base / "memory.current").read_text())
    except (OSError, ValueError, StopIteration):
        return None


def _address_space_room() -> Optional[int]:
    """`ulimit -v`'s room: the limit on this process's address space minus what it maps now."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        vm = next(int(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text().splitlines()
                  if line.startswith("VmSize:"))
    except (OSError, ValueError, StopIteration):
        return None
    return soft - vm


def free_bytes(device: Any = "cpu") -> Optional[int]:
    """The memory this process may still allocate on `device` (CPU: the least of the machine's
    available memory, a cgroup's limit and `ulimit -v`); None when unknown."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    rooms = [r for r in (_meminfo_available(), _cgroup_room(), _address_space_room()) if r is not None]
    return max(0, min(rooms)) if rooms else None


def check_fits(need: int, what: str, fix: str, device: Any = "cpu", free: Optional[int] = None) -> None:
    """ConfigError (one line) when `need` bytes (with HEADROOM) exceed the memory free: `what`
    needs about X, Y is free; `fix` says what to ask for instead."""
    free = free_bytes(device) if free is None else free
    if free is None or need * HEADROOM <= free:
        return
    where = "" if str(device) == "cpu" else f" on {device}"
    raise ConfigError(f"{what} needs about {human_bytes(need)}, more than the {human_bytes(free)} free{where}; {fix}")


def is_out_of_memory(e: BaseException) -> bool:
    """An allocation that failed anyway (the estimate missed it): torch's CPU or CUDA message."""
    text = str(e)
    return isinstance(e, MemoryError) or "out of memory" in text or "can't allocate memory" in text

