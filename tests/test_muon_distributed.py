"""optim=muon with torch.distributed on CPU (gloo): under DDP every rank steps its replica; under
FSDP2 each rank holds a row shard of each matrix, gathers the update for Newton-Schulz and keeps
its own rows. Two ranks on halves of a batch train exactly as one process on the whole batch
(to float rounding: the gradients' all-reduce sums in another order), and the container's state
gathers into a checkpoint that a sharded run loads back."""

from __future__ import annotations

import os
import socket

import pytest
import torch

STEPS = 3


def _spec():
    from ablate.model.spec import ModelSpec

    # GQA and a gated FFN: qkv (32 + 16 + 16 rows) and gate_up (48 + 48) are fused; 64 and 96 rows
    # split across 2 ranks cut through q/k and gate/up, so a shard holds parts of two matrices.
    return ModelSpec(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48,
                     max_seq_len=16, act="swiglu")


def _batches():
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, 64, (4, 9), generator=gen) for _ in range(STEPS)]


def _train(model, optimizer, rank: int, world: int):
    from ablate.train.optimizer import set_lr

    for i, batch in enumerate(_batches()):
        part = batch.chunk(world)[rank]
        set_lr(optimizer, 0.01 * (i + 1))
        model(part[:, :-1], part[:, 1:]).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _build():
    from omegaconf import OmegaConf

    from ablate.model.transformer import Transformer
    from ablate.train.optimizer import build_optimizer
    from ablate.train.optimizers.optim_settings import OptimSpec

    torch.manual_seed(0)
    model = Transformer(_spec())
    cfg = OmegaConf.create(dict(lr=0.01, weight_decay=0.1, beta1=0.9, beta2=0.95, compile_optimizer=False))
    return model, lambda m: build_optimizer(m, cfg, torch.device("cpu"), OptimSpec(name="muon"))


def _rank(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = {strategy: _strategy(strategy, rank, world, out) for strategy in ("ddp", "fsdp")}
        if rank == 0:
            torch.save(results, out)
    finally:
        dist.destroy_process_group()


def _shard(model, mesh):
    """FSDP2 as ablate.train.distributed's wrap does it, carrying the parameters' marks over."""
    from torch.distributed.fsdp import fully_shard

    marks = {n: dict(vars(p)) for n, p in model.named_parameters()}
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for n, p in model.named_parameters():
        p.__dict__.update(marks[n])
    return model


def _strategy(strategy: str, rank: int, world: int, out: str) -> dict:
    from ablate.train.distributed import load_model_and_optimizer_state, model_and_optimizer_state

    model, make = _build()
    if strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (world,))
        train_model = _shard(model, mesh)
    else:
        from torch.nn.parallel import DistributedDataParallel

        train_model = DistributedDataParallel(model)
    optimizer = make(model)
    _train(train_model, optimizer, rank, world)
    state = model_and_optimizer_state(model, optimizer)  # collective under FSDP
    if strategy == "fsdp":  # the gathered checkpoint (rank 0's) loads into a sharded model again
        import torch.distributed as dist

        if rank == 0:
            torch.save(state, out + ".ckpt")
        dist.barrier()
        state = torch.load(out + ".ckpt", weights_only=True)
        fresh = _shard(_build()[0], mesh)
        again = make(fresh)
        load_model_and_optimizer_state(fresh, again, torch.load(out + ".ckpt", weights_only=True))
        state["reloaded"] = model_and_optimizer_state(fresh, again)
    return state


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def one_process():
    model, make = _build()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = make(model)
    _train(model, optimizer, 0, 1)
    return model, optimizer, start


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("ranks") / "state.pt"
    mp.start_processes(_rank, args=(2, _free_port(), str(out)), nprocs=2, start_method="fork")
    return torch.load(out, weights_only=False)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_train_as_one_process_and_checkpoint_the_full_state(two_ranks, one_process, strategy):
    """Newton-Schulz runs in bf16, so a gradient that differs in its last float bit (the
    all-reduce's order) can move a weight by a bf16 step of its update: the weights must agree
    to 5% of how far training moved them. A shard that orthogonalized only its own rows, or
    split q/k or gate/up at the shard boundary, moves them by as much as the update itself."""
    state = two_ranks[strategy]
    model, optimizer, start = one_process
    weights = model.state_dict()
    assert set(state["model"]) == set(weights)
    for name, w in weights.items():
        moved = (w - start[name]).abs().max().item()
        assert (state["model"][name] - w).abs().max().item() <= 0.05 * moved + 1e-7, name
    muon = state["optimizer"]["optimizers"]["muon"]["state"]
    reference = optimizer.state_dict()["optimizers"]["muon"]["state"]
    if strategy == "fsdp":  # keyed by parameter name: every Muon matrix with its full momentum buffer
        name = {id(p): n for n, p in model.named_parameters()}
        order = [name[id(p)] for g in optimizer.parts["muon"].param_groups for p in g["params"]]
        reference = {order[i]: s for i, s in reference.items()}
        reloaded = state["reloaded"]
        for name, w in state["model"].items():
            assert torch.equal(reloaded["model"][name], w), name
        for key, s in muon.items():
            assert torch.equal(reloaded["optimizer"]["optimizers"]["muon"]["state"][key]["momentum_buffer"],
                               s["momentum_buffer"]), key
    assert set(muon) == set(reference) and len(muon) == 8  # 2 layers x qkv, proj, gate_up, down
    for key, s in reference.items():  # the momentum is an average of gradients: float rounding only
        torch.testing.assert_close(muon[key]["momentum_buffer"], s["momentum_buffer"], rtol=1e-3, atol=1e-6)
