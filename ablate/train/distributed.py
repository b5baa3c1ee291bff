"""torch.distributed: one process per device, rank 0 writes files and logs.

Where ranks come from
- `ablate run ... train.nproc=N`: the run entry re-executes the same run under
  `torchrun --standalone --nproc_per_node=N` (launch_ranks), with hydra.run.dir pinned to the
  parent's run directory so every rank shares one output dir; torchrun sets RANK/WORLD_SIZE.
- SLURM through submitit with tasks_per_node > 1: submitit starts every task itself;
  export_submitit_env() turns its environment into RANK/WORLD_SIZE/MASTER_ADDR (submitit's
  TorchDistributedEnvironment).
DDP by default; FSDP2 (`fully_shard` per block, then the root) with train.strategy=fsdp.
Backend: NCCL on CUDA, gloo on CPU.

Global batch per optimizer step = batch_size * grad_accum * world_size sequences: each rank
takes a disjoint slice of the same global batch (ablate.data.batches), so a run on N
processes sees exactly the batches of a one-process run with batch_size * N.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ablate.errors import ConfigError


@dataclass
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    wrap: Optional[Callable] = None
    initialized: bool = False

    def close(self) -> None:
        if self.initialized:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


# ---- where ranks come from ---------------------------------------------------------------
def under_submitit() -> bool:
    return bool(os.environ.get("SUBMITIT_EXECUTOR"))


def export_submitit_env() -> None:
    """Under submitit with several tasks, export torch.distributed's env:// variables (once)."""
    if not under_submitit() or "WORLD_SIZE" in os.environ:
        return
    import submitit

    if submitit.JobEnvironment().num_tasks <= 1:
        return
    # Every task keeps seeing all GPUs of its node; setup_distributed picks cuda:LOCAL_RANK.
    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)


def in_distributed_env() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def available_devices(cfg: Any) -> tuple[int, str]:
    """How many processes this machine can give one device each: GPUs, or CPU cores."""
    device = str(cfg.train.device)
    if device.startswith("cuda") or device == "auto":
        import torch

        if torch.cuda.is_available():
            return torch.cuda.device_count(), "CUDA devices"
        if device.startswith("cuda"):
            return 0, "CUDA devices"
    return os.cpu_count() or 1, "CPU cores"


def check_nproc(cfg: Any) -> None:
    """train.nproc must fit this machine (checked before anything is launched)."""
    n = int(cfg.train.nproc)
    if n <= 1 or in_distributed_env():
        return
    have, what = available_devices(cfg)
    if n > have:
        raise ConfigError(
            f"train.nproc={n} needs {n} devices but this machine has {have} {what}; lower "
            "train.nproc (or run multi-node through launcher=slurm with hydra.launcher.tasks_per_node)")


def needs_launch(cfg: Any) -> bool:
    """A run asked for N processes and is not one of them yet: torchrun must start them."""
    return int(cfg.train.nproc) > 1 and not in_distributed_env()


def launch_ranks(cfg: Any, run_dir: Path, overrides: list[str], sweep_name: Optional[str]) -> int:
    """Run this same run under torchrun --standalone with train.nproc processes; returns
    torchrun's exit code. The ranks share run_dir (hydra.run.dir pinned); they run in Hydra's
    run mode, so a sweep job's sweep name (its W&B group) is passed on in ABLATE_SWEEP."""
    from ablate.sweep import quote

    pinned = f"hydra.run.dir={quote(str(Path(run_dir).resolve()))}"  # names hold '=' and ','
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={int(cfg.train.nproc)}", "-m", "ablate.train.distributed",
           *overrides, pinned]
    env = dict(os.environ)
    if sweep_name:
        env["ABLATE_SWEEP"] = sweep_name
    # The repo root must stay importable for the ranks (conf/, ablate/, hydra_plugins/).
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", str(max(1, int(cfg.train.threads) or 1)))
    return subprocess.run(cmd, env=env).returncode


# ---- process group and model wrapping -----------------------------------------------------
def setup_distributed(cfg: Any) -> DistEnv:
    export_submitit_env()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistEnv()
    import torch
    import torch.distributed as dist

    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() and cfg.train.device in ("auto", "cuda")
    if use_cuda:
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    env = DistEnv(rank=rank, world_size=world, local_rank=local_rank, initialized=True)

    def wrap(model):
        if cfg.train.strategy == "fsdp":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            from ablate.model.roles import role_of, tag

            # fully_shard swaps every parameter for a sharded one: carry the role tags over
            roles = {name: role_of(p) for name, p in model.named_parameters()}
            mesh = init_device_mesh("cuda" if use_cuda else "cpu", (world,))
            for block in model.blocks:
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
            for name, p in model.named_parameters():
                tag(p, roles[name])
            return model
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[local_rank] if use_cuda else None)

    env.wrap = wrap
    return env


def is_sharded(model) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def model_and_optimizer_state(model, optimizer) -> dict:
    """Full (unsharded) state dicts for a checkpoint. Under FSDP they are gathered onto rank 0
    (collective: every rank must call this; the others get empty dicts)."""
    if not is_sharded(model):
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    msd, osd = get_state_dict(model, optimizer,
                              options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"model": msd, "optimizer": osd}


def load_model_and_optimizer_state(model, optimizer, state: dict) -> None:
    """The inverse: every rank loads the full state; under FSDP each keeps its own shard."""
    if not is_sharded(model):
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"], options=StateDictOptions(full_state_dict=True))


def all_ranks_mean(value, world_size: int):
    """Mean of a scalar tensor over all ranks (gloo has no AVG): every rank logs and judges the
    global batch's loss, as a one-process run would."""
    if world_size <= 1:
        return value
    import torch.distributed as dist

    out = value.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out / world_size


def any_rank(flag: bool, world_size: int, device) -> bool:
    """True on every rank if it is true on one (a stop signal reaches ranks at different
    steps; they must stop at the same one)."""
    if world_size <= 1:
        return flag
    import torch
    import torch.distributed as dist

    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return bool(t.item() > 0)


# ---- preemption: ask submitit to requeue --------------------------------------------------
def request_requeue() -> bool:
    """After a preempted run saved its checkpoint: under submitit, hand over to submitit's own
    preemption handler (checkpoint protocol: hydra-submitit-launcher resubmits the same job,
    which resumes from the checkpoint in its directory), which requeues and exits the process.
    Returns False (and does nothing) outside submitit."""
    if not under_submitit():
        return False
    import signal

    import submitit

    handler = signal.getsignal(submitit.JobEnvironment._usr_sig())
    if not callable(handler):
        return False
    handler(submitit.JobEnvironment._usr_sig(), None)  # requeues, then sys.exit()
    return True


def _main() -> None:
    """A rank started by launch_ranks: the same Hydra entry point, in run mode."""
    from ablate.run import hydra_entry

    sys.argv = ["ablate"] + sys.argv[1:]
    hydra_entry()


if __name__ == "__main__":
    _main()
