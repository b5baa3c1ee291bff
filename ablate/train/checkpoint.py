"""Atomic checkpoints (temp file, fsync, rename; keep the last K), loaded with weights_only=True.

A checkpoint holds everything a bit-exact resume needs: model, optimizer, step, tokens seen,
every RNG state, and how the global batch was split (world size, strategy). Batches are a pure
function of (data_seed, step), so the data position is the step itself. A file that fails to
load (truncated, corrupt, wrong checksum) is reported in one line and the previous good one is used.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import re
import sys
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ablate.errors import CheckpointError
from ablate.run.directory import pid_alive

CKPT_DIR = "checkpoints"
_NAME = re.compile(r"^step_(\d+)\.pt$")


def rng_state() -> dict:
    import torch

    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    import torch

    random.setstate(_to_python_random(state["python"]))
    np.random.set_state(_to_numpy_random(state["numpy"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _to_python_random(s):
    # weights_only loading returns lists where random.getstate() had tuples
    return (s[0], tuple(s[1]), s[2])


def _to_numpy_random(s):
    return (s[0], np.asarray(s[1], dtype=np.uint32), int(s[2]), int(s[3]), float(s[4]))


def _plain(obj: Any) -> Any:
    """Make RNG states loadable under weights_only=True (tuples of ints, numpy arrays -> lists)."""
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (tuple, list)):
        return [_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    return obj


def ckpt_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CKPT_DIR


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    d = ckpt_dir(run_dir)
    if not d.is_dir():
        return []
    found = []
    for p in d.iterdir():
        m = _NAME.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found)


def save(run_dir: Path, step: int, state: dict, keep: int = 2) -> Path:
    """Serialize to memory, append a sha256 footer, write to a temp file, fsync, rename."""
    import torch

    d = ckpt_dir(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(d)
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    digest = hashlib.sha256(payload).hexdigest().encode()
    final = d / f"step_{step:08d}.pt"
    tmp = d / f".step_{step:08d}.pt.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(payload)
        f.write(b"\nSHA256:" + digest)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    _fsync_dir(d)
    for _, old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    return final


def clear(run_dir: Path) -> int:
    """Remove a run directory's checkpoints (train.resume=never starts over there: an old,
    higher-step checkpoint would otherwise outrank the new ones). Returns how many."""
    found = list_checkpoints(run_dir)
    for _, path in found:
        path.unlink(missing_ok=True)
    return len(found)


def _remove_stale_temps(d: Path) -> None:
    """Temp files of writers that died mid-save (SIGKILL) are never renamed: delete them."""
    for p in d.glob(".step_*.pt.tmp-*"):
        pid = p.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or int(pid) == os.getpid() or not pid_alive(int(pid)):
            p.unlink(missing_ok=True)


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def verified_payload(path: Path) -> bytes:
    """The serialized state, if the file is whole (torch-free: pre-flight uses it)."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read ({e.strerror})") from None
    marker = data.rfind(b"\nSHA256:")
    if marker < 0:
        raise CheckpointError(f"{path}: no checksum footer (truncated or not an ablate checkpoint)")
    payload, digest = data[:marker], data[marker + 8:]
    if hashlib.sha256(payload).hexdigest().encode() != digest:
        raise CheckpointError(f"{path}: checksum mismatch (corrupt or truncated)")
    return payload


def check_resumable(run_dir: Path) -> None:
    """Pre-flight: if the run directory has checkpoints, at least one must be whole."""
    found = list_checkpoints(run_dir)
    problems = []
    for _, path in reversed(found):
        try:
            verified_payload(path)
            return
        except CheckpointError as e:
            problems.append(str(e))
    if found:
        raise CheckpointError(_none_usable(found, problems))


def _none_usable(found, problems) -> str:
    return (f"no usable checkpoint ({len(found)} found, newest: {problems[0]}); remove them to "
            "start over, or use train.resume=never or another hydra.run.dir")


def load_file(path: Path) -> dict:
    import torch

    payload = verified_payload(path)
    try:
        return torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
    except Exception as e:
        raise CheckpointError(f"{path}: cannot be loaded ({type(e).__name__})") from None


def warn(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def latest_valid(run_dir: Path, warn=warn) -> Optional[dict]:
    """The newest checkpoint that loads; each bad one is reported in one line and skipped.
    None when there is none; CheckpointError when there are some but none is usable (starting
    over would silently overwrite that run's record)."""
    found = list_checkpoints(run_dir)
    problems = []
    for step, path in reversed(found):
        try:
            state = load_file(path)
        except CheckpointError as e:
            problems.append(str(e))
            continue
        if not isinstance(state, dict) or state.get("step") != step:
            problems.append(f"{path}: does not hold step {step}")
            continue
        for p in problems:
            warn(f"warning: skipping checkpoint: {p}")
        return state
    if found:
        raise CheckpointError(_none_usable(found, problems))
    return None


def layout(world_size: int, strategy: str) -> dict:
    """How a run splits its global batch: batch_size is per process, so a resume with another
    number of processes would continue another run. The strategy matters only with several."""
    return {"world_size": world_size, "strategy": strategy if world_size > 1 else None}


def _processes(saved: dict) -> str:
    n = saved["world_size"]
    return f"{n} process{'es' if n > 1 else ''}" + (f" ({saved['strategy']})" if saved.get("strategy") else "")


def check_continues(state: dict, run_dir: Path, world_size: int, strategy: str, steps: int) -> None:
    """Refuse a checkpoint this run cannot continue: written with another world size or
    strategy, or past train.steps (it would end `completed` with step > steps)."""
    where = f"the checkpoint of step {state['step']} in {ckpt_dir(run_dir)}"
    now = layout(world_size, strategy)
    if state.get("world_size") is not None and layout(state["world_size"], state.get("strategy")) != now:
        raise CheckpointError(
            f"{where} was written by {_processes(state)}, this run has {_processes(now)}: resume "
            "with the same train.nproc and train.strategy, or start over with train.resume=never")
    if state["step"] > steps:
        raise CheckpointError(
            f"{where} is past train.steps={steps}: raise train.steps to at least {state['step']} to "
            "continue it, or start over with train.resume=never")


def first_mismatch(expected: dict, saved: dict) -> Optional[str]:
    """The first parameter whose name or shape differs between a model's state and a
    checkpoint's (None if all match)."""
    for name, t in expected.items():
        if name not in saved:
            return f"{name} is not in the checkpoint"
        if tuple(saved[name].shape) != tuple(t.shape):
            return f"{name}: shape {list(saved[name].shape)} in the checkpoint, {list(t.shape)} in this model"
    extra = next((name for name in saved if name not in expected), None)
    return f"{extra} is in the checkpoint, not in this model" if extra else None


def plain_rng_state() -> dict:
    return _plain(rng_state())
