"""torch.distributed set-up: one process per device, rank 0 writes files and logs.

Ranks come from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK). DDP by default; FSDP2
(`fully_shard`) with train.strategy=fsdp. Backend: NCCL on CUDA, gloo on CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional


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


def setup_distributed(cfg: Any) -> DistEnv:
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

            mesh = init_device_mesh("cuda" if use_cuda else "cpu", (world,))
            for block in model.blocks:
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
            return model
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[local_rank] if use_cuda else None)

    env.wrap = wrap
    return env
