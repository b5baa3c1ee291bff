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

Signals with torchrun: the parent (the process the user or submitit started) keeps the console
and the signals. torchrun runs in a session of its own with stop signals ignored (it would turn
them into a traceback and SIGKILL the ranks 30 s later, mid-checkpoint); the parent passes each
stop signal on to every rank once that rank handles it, waits for the ranks to checkpoint and
record their outcome, and only then exits or asks submitit to requeue.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ablate.run.context import ProcessEnv
from ablate.errors import ConfigError
from ablate.train.signals import STOP_SIGNALS, StopRequest


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
def export_submitit_env() -> None:
    """Under submitit with several tasks, export torch.distributed's env:// variables (once)."""
    penv = ProcessEnv.read()
    if not penv.submitit or penv.distributed:  # not submitit's, or exported already
        return
    import submitit

    if submitit.JobEnvironment().num_tasks <= 1:
        return
    # Every task keeps seeing all GPUs of its node; setup_distributed picks cuda:LOCAL_RANK.
    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)


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
    if n <= 1 or ProcessEnv.read().distributed:
        return
    have, what = available_devices(cfg)
    if n > have:
        raise ConfigError(
            f"train.nproc={n} needs {n} devices but this machine has {have} {what}; lower "
            "train.nproc (or run multi-node through launcher=slurm with hydra.launcher.tasks_per_node)")


def needs_launch(cfg: Any) -> bool:
    """A run asked for N processes and is not one of them yet: torchrun must start them."""
    return int(cfg.train.nproc) > 1 and not ProcessEnv.read().distributed


TORCHRUN_LOG = "torchrun.log"  # torchrun's own output (its logs, a failed rank's traceback)
# The ranks run in Hydra's run mode in the parent's run dir; the parent already wrote Hydra's
# files (.hydra/, ablate.log) there, so the ranks write none of them.
RANK_HYDRA_OVERRIDES = ["hydra.output_subdir=null", "hydra/job_logging=none", "hydra/hydra_logging=none"]


def launch_ranks(cfg: Any, run_dir: Path, overrides: list[str], identity: dict[str, str],
                 stop: StopRequest, entry_module: str) -> int:
    """Run this same run under torchrun --standalone with train.nproc processes and wait for it,
    passing on the stop signals `stop` records; returns the exit code of the first rank that
    failed (128 + N for a rank killed by signal N), else 0. The ranks share run_dir
    (hydra.run.dir pinned); they run in Hydra's run mode, so the run's identity (its variant
    and sweep: ProcessEnv.for_ranks) is passed on in their environment. Each rank runs
    `python -m entry_module` (the caller's Hydra entry point) with the same overrides."""
    from ablate.config.overrides import quote

    run_dir = Path(run_dir).resolve()
    pinned = f"hydra.run.dir={quote(str(run_dir))}"  # names hold '=' and ','
    nproc = int(cfg.train.nproc)
    cmd = [sys.executable, "-m", "ablate.train.distributed", "--agent", str(run_dir / TORCHRUN_LOG),
           "--standalone", f"--nproc_per_node={nproc}", "--signals-to-handle=SIGHUP,SIGQUIT",
           "-m", entry_module, *overrides, pinned, *RANK_HYDRA_OVERRIDES]
    env = {**os.environ, **identity}
    # The repo root must stay importable for the ranks (conf/, ablate/, hydra_plugins/).
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", str(max(1, int(cfg.train.threads) or 1)))
    # A session of its own: a Ctrl-C in the terminal reaches this process only, which passes it on.
    agent = subprocess.Popen(cmd, env=env, start_new_session=True)
    sent: dict[int, int] = {}  # rank pid -> how many of stop.received it has been sent
    try:
        while agent.poll() is None:
            if stop.received and (len(sent) < nproc or min(sent.values()) < len(stop.received)):
                _forward(agent.pid, stop.received, sent)
            time.sleep(0.05)
    finally:
        if agent.poll() is None:  # this process is going down: the ranks stop with a checkpoint
            for pid in _children(agent.pid):
                _kill(pid, signal.SIGTERM)
    return agent.returncode


def _forward(agent_pid: int, received: list[int], sent: dict[int, int]) -> None:
    for pid in _children(agent_pid):
        for signum in received[sent.get(pid, 0):]:
            # A rank that does not handle the signal yet (still starting Python) gets it later:
            # torchrun started it with the signal ignored, so sending it now would lose it.
            if not _handles(pid, signum) or not _kill(pid, signum):
                break
            sent[pid] = sent.get(pid, 0) + 1


def _children(pid: int) -> list[int]:
    """The processes `pid` started (Linux /proc; torchrun puts each rank in a session of its own,
    so only a signal sent to its pid reaches it)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _handles(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (SigCgt in /proc/PID/status)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _kill(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
        return True
    except ProcessLookupError:
        return False


def _agent_main(log_path: str, argv: list[str]) -> None:
    """torchrun itself, started by launch_ranks. Its output (logs, the ChildFailedError
    traceback) goes to log_path; the ranks keep the console, as they inherit the file
    descriptors, not sys.stderr. Stop signals are ignored here (launch_ranks passes
    --signals-to-handle so torchrun installs no handler for them) and so in the ranks until they
    install their own: the parent passes each one on to the ranks."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    sys.stdout = sys.stderr = open(log_path, "w", buffering=1)  # before torch sets up its logging
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main

    try:
        main(argv)
    except ChildFailedError as e:
        traceback.print_exc()
        code = e.get_first_failure()[1].exitcode  # the ranks' own code: 2 for a refused input, ...
        sys.exit(code if code > 0 else 128 - code)  # -N: killed by signal N
    except Exception:
        traceback.print_exc()
        sys.exit(1)


# ---- process group and model wrapping -----------------------------------------------------
def setup_distributed(cfg: Any) -> DistEnv:
    export_submitit_env()
    penv = ProcessEnv.read()
    world, rank, local_rank = penv.world, penv.rank, penv.local_rank
    if world <= 1:
        return DistEnv()
    import torch
    import torch.distributed as dist

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

            # fully_shard swaps every parameter for a sharded one: carry what modules recorded on
            # them over (the role tag, a fused weight's parts: init, decay and Muon's matrices read them)
            marks = {name: dict(vars(p)) for name, p in model.named_parameters()}
            mesh = init_device_mesh("cuda" if use_cuda else "cpu", (world,))
            for block in model.blocks:
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
            for name, p in model.named_parameters():
                for key, value in marks[name].items():
                    setattr(p, key, value)
            return model
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[local_rank] if use_cuda else None)

    env.wrap = wrap
    return env


def is_sharded(model) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def model_and_optimizer_state(model, optimizer) -> dict:
    """Full (unsharded) state dicts for a checkpoint; `optimizer` is the run's Optimizers
    container (ablate/train/optimizers/container.py), each part's state under its name. Under FSDP
    they are gathered onto rank 0 (collective: every rank must call this; the others get empty dicts)."""
    if not is_sharded(model):
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    from ablate.train.optimizers.container import PARTS

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return {"model": get_model_state_dict(model, options=options),
            "optimizer": {PARTS: {name: get_optimizer_state_dict(model, part, options=options)
                                  for name, part in optimizer.parts.items()}}}


def load_model_and_optimizer_state(model, optimizer, state: dict) -> None:
    """The inverse: every rank loads the full state; under FSDP each keeps its own shard. A
    checkpoint from before the container (one AdamW's state) loads into an AdamW-only container,
    and is refused in one line otherwise (Optimizers.split)."""
    if not is_sharded(model):
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        return
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)

    options = StateDictOptions(full_state_dict=True)
    parts = optimizer.split(state["optimizer"])
    set_model_state_dict(model, state["model"], options=options)
    for name, part in optimizer.parts.items():
        set_optimizer_state_dict(model, part, parts[name], options=options)


def all_ranks_mean(value, world_size: int):
    """Mean of a scalar tensor over all ranks (gloo has no AVG): every rank logs and judges the
    global batch's loss, as a one-process run would."""
    if world_size <= 1:
        return value
    import torch.distributed as dist

    out = value.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out / world_size


def all_ranks_sum(value, world_size: int):
    """Sum of a tensor over all ranks (every rank gets it): counts that the global batch adds up."""
    if world_size <= 1:
        return value
    import torch.distributed as dist

    out = value.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def all_ranks_min(value: int, world_size: int, device) -> int:
    """The smallest of an integer over all ranks (a choice every rank must share)."""
    if world_size <= 1:
        return value
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


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


# ---- asking submitit to requeue ---------------------------------------------------------
def request_requeue() -> bool:
    """After a preempted run saved its checkpoint: under submitit, hand over to submitit's own
    preemption handler (checkpoint protocol: hydra-submitit-launcher resubmits the same job,
    which resumes from the checkpoint in its directory), which requeues and exits the process.
    Returns False (and does nothing) outside submitit."""
    if not ProcessEnv.read().submitit:
        return False
    import submitit

    handler = signal.getsignal(submitit.JobEnvironment._usr_sig())
    if not callable(handler):
        return False
    handler(submitit.JobEnvironment._usr_sig(), None)  # requeues, then sys.exit()
    return True


def _main() -> None:
    """torchrun itself (`--agent LOG ...`), started by launch_ranks."""
    if sys.argv[1:2] != ["--agent"]:
        sys.exit("usage: python -m ablate.train.distributed --agent LOG TORCHRUN_ARGS...")
    _agent_main(sys.argv[2], sys.argv[3:])


if __name__ == "__main__":
    _main()
