"""Build a run from its config: data, model, sinks, trainer; then train."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ablate.run.context import RunContext
from ablate.errors import ConfigError
from ablate.run.record import DataInfo, Git, Outcome, ParamsBreakdown, Provenance, RunInfo
from ablate.run.directory import METRICS
from ablate.names import Status
from ablate.tracking.sinks import Sink, Sinks


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def prepare_data(cfg: Any, progress: bool = True):
    from ablate.data.cache import prepare
    from ablate.data.tokenizers import build_tokenizer

    tok = build_tokenizer(cfg.tokenizer.name)
    data, _ = prepare(cfg.data, tok, progress=progress)
    return tok, data


def git_state(where: Path) -> Optional[Git]:
    """The commit of the git checkout holding `where` and whether it is dirty (None outside one,
    or without git)."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True,
                              timeout=5, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return Git(commit=commit, dirty=dirty)


def _cpu_name() -> str:
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(device: Any) -> Provenance:
    """Which code ran where: recorded in summary.json and the W&B config. `git`: the checkout
    of the ablate package (an editable install), else of the working directory."""
    import platform
    import socket

    import torch

    import ablate

    here = Path(ablate.__file__).resolve().parent
    name = _cpu_name()
    if getattr(device, "type", None) == "cuda":
        name = torch.cuda.get_device_name(device)
    elif getattr(device, "type", None) == "mps":
        name = "Apple MPS"
    return Provenance(git=git_state(here) or git_state(Path.cwd()), ablate=ablate.__version__,
                      torch=torch.__version__, cuda=torch.version.cuda, python=platform.python_version(),
                      device_name=name, hostname=socket.gethostname())


def run_tags(cfg: Any) -> list[str]:
    """The axes off their default (`pos=rope`), and the chosen options' settings off theirs
    (`attn.window=16`): W&B filters runs by them."""
    from ablate.config.schema import axis_values
    from ablate.config.axes import default_axes
    from ablate.model import options

    base = default_axes()
    tags = [f"{k}={v}" for k, v in axis_values(cfg).items() if v != base[k]]
    for axis in options.component_axes():
        if axis in cfg:
            declared = options.get(axis, cfg[axis].name).all_settings
            tags += [f"{axis}.{key}={cfg[axis][key]}" for key, s in declared.items()
                     if key in cfg[axis] and cfg[axis][key] != s.default]
    return tags + list(cfg.logger.tags)


def build_sinks(cfg: Any, ctx: RunContext, start_step: int, info: RunInfo, record: Optional[Sink] = None):
    """The run's sinks; a sweep's job (ctx.multirun) says its lines to its ablate.log only (the
    sweep reports each job). record: the run's own sink of its running record (ablate/run/entry.py)."""
    from ablate.tracking.sinks import About, ConsoleSink, JsonlSink, Sinks

    about = About(ctx.variant, cfg.seed, str(ctx.run_dir))
    sinks = [JsonlSink(ctx.run_dir / METRICS, append=start_step > 0),
             ConsoleSink(cfg.train.steps, enabled=cfg.train.progress, start_step=start_step,
                         quiet=ctx.multirun, about=about), *([record] if record is not None else [])]
    if cfg.logger.name == "wandb" and cfg.logger.mode != "disabled":
        from ablate.tracking.wandb_sink import WandbSink, run_name, wandb_config

        sinks.append(WandbSink(cfg.logger, ctx.run_dir, run_name(ctx.variant, cfg.seed),
                               wandb_config(cfg, ctx.variant, info), run_tags(cfg),
                               cfg.logger.group or ctx.sweep, resume_id=_wandb_id(ctx.run_dir),
                               quiet=ctx.multirun))
    return Sinks(sinks)
def _wandb_id(run_dir: Path) -> str:
    """One W&B run per run directory, kept across resumes."""
    path = Path(run_dir) / ".wandb_id"
    if path.is_file():
        return path.read_text().strip()
    import uuid

    rid = uuid.uuid4().hex[:12]
    path.write_text(rid)
    return rid


def build_trainer(cfg: Any, data, tokenizer_vocab: int, byte_lengths=None, run_dir: Path = Path("."),
                  dist=None, job_started: Optional[float] = None):
    """The configured model inside the Trainer, seeded by `cfg.seed`: the one builder behind
    `ablate run` (train) and `ablate bench`. byte_lengths: bytes per token id (val_bpb; None:
    one each). dist: the process group's DistEnv (None: one process). Returns (trainer, spec)."""
    import numpy as np

    from ablate.train.diagnostics import Diagnostics
    from ablate.model.spec import ModelSpec
    from ablate.model.transformer import build_model
    from ablate.train.optimizers.optim_settings import OptimSpec
    from ablate.train.trainer import Trainer

    spec = ModelSpec.from_config(cfg, tokenizer_vocab=tokenizer_vocab)
    seed_everything(cfg.seed)
    model = build_model(spec)
    if byte_lengths is None:
        byte_lengths = np.ones(spec.vocab_size, dtype=np.int64)
    # Diagnostics stay off unless asked for, so `bench --vs train.diagnostics_every=N` prices them.
    diagnostics = Diagnostics(model) if cfg.train.diagnostics_every > 0 else None
    trainer = Trainer(model, cfg.train, data, sinks=None, run_dir=run_dir, byte_lengths=byte_lengths,
                      data_seed=cfg.data_seed, rank=dist.rank if dist else 0,
                      world_size=dist.world_size if dist else 1, wrap=dist.wrap if dist else None,
                      on_diagnostics=diagnostics, job_started=job_started, optim=OptimSpec.from_config(cfg))
    return trainer, spec


def run_info(cfg: Any, spec, tok, data, trainer) -> RunInfo:
    """What summary.json and the W&B config record about the run's model, data and device."""
    from ablate.model.spec import active_params, count_params, flops_per_token, non_embedding_params

    params = count_params(spec)
    tokens = data.meta["tokens"]  # the cache's tokens per split
    return RunInfo(
        params=params["total"], params_breakdown=ParamsBreakdown(**params),
        non_embedding_params=non_embedding_params(spec), active_params=active_params(spec),
        flops_per_token=flops_per_token(spec, cfg.train.seq_len),
        vocab_size=spec.vocab_size, tokenizer_vocab=tok.vocab_size,
        data=DataInfo(source=data.meta["source"], tokenizer=data.meta["tokenizer"],
                      train_tokens=tokens["train"], val_tokens=tokens["val"], cache=str(data.path)),
        world_size=trainer.world, device=str(trainer.device), precision=trainer.precision,
        provenance=provenance(trainer.device), compile=bool(trainer.compiled),
        compile_optimizer=bool(cfg.train.compile_optimizer), tokens_per_step=trainer.tokens_per_step,
        micro_batch=trainer.micro_batch, grad_accum_steps=trainer.grad_accum,
        warmup_steps=trainer.state.warmup_steps,  # resolved when the run started (a resume keeps it)
        param=spec.param, base_width=spec.base_width, base_depth=spec.base_depth,
        unigram_loss=unigram_loss(data.train),
    )


UNIGRAM_TOKENS = 1 << 24  # a corpus's first 16M training tokens estimate its frequencies


def unigram_loss(tokens) -> Optional[float]:
    """The entropy (nats) of the training tokens' frequencies: the loss of a model that predicts
    every token from how often it occurs, whatever came before (from the first UNIGRAM_TOKENS)."""
    head = np.asarray(tokens[:UNIGRAM_TOKENS])
    if not head.size:
        return None
    p = np.bincount(head).astype(np.float64) / head.size
    p = p[p > 0]
    return round(float(-(p * np.log(p)).sum()), 6)


class Launch:
    """Builds a run from its config (data, model, trainer, sinks) and trains it. What it built
    stays here, so the run finishes the sinks with its record whatever happened (also when
    building or training raised)."""

    def __init__(self, cfg: Any, ctx: RunContext, record: Optional[Sink] = None):
        self.cfg, self.ctx = cfg, ctx
        self.record = record  # the run's own sink of its running record (build_sinks)
        self.info: Optional[RunInfo] = None
        self.sinks: Optional[Sinks] = None  # rank 0's

    def train(self) -> Outcome:
        """Build and train, from ctx.resume_state when the run continues one (else from the
        newest valid checkpoint, if any). ctx.stop is installed since the run's start."""
        import torch
        import torch.distributed

        from ablate.train.distributed import setup_distributed
        from ablate.train.threads import use_threads

        cfg, ctx = self.cfg, self.ctx
        # the notice once, on the run's console (not from each of a sweep's jobs), when it computes on the CPU
        on_cpu = cfg.train.device == "cpu" or (cfg.train.device == "auto" and not torch.cuda.is_available())
        use_threads(cfg.train.threads, say=None if on_cpu and not ctx.multirun else (lambda line: None))
        dist = setup_distributed(cfg)
        tok, data = prepare_data(cfg, progress=cfg.train.progress and dist.rank == 0 and not ctx.multirun)
        if data.meta["vocab_size"] != tok.vocab_size:
            raise ConfigError("the data cache and the tokenizer disagree on the vocab size")
        trainer, spec = build_trainer(cfg, data, tok.vocab_size, tok.token_byte_lengths(), ctx.run_dir,
                                      dist, ctx.job_started)
        trainer.stop = ctx.stop
        start = trainer.try_resume(ctx.resume_state) or 0
        if start and dist.rank == 0:  # rows after the checkpoint are re-logged by this run
            from ablate.run.directory import truncate_metrics

            truncate_metrics(ctx.run_dir / METRICS, start)
        self.info = run_info(cfg, spec, tok, data, trainer)
        if dist.rank == 0:
            self.sinks = build_sinks(cfg, ctx, start, self.info, self.record)
            self.sinks.start(self.info)
        trainer.sinks = self.sinks
        try:
            outcome = trainer.fit(start)
            if outcome.status == Status.COMPLETED and cfg.train.eval_lengths:  # ablate/evaluation/lengths.py
                from ablate.evaluation.lengths import evaluate_at_end
                from ablate.tracking.sinks import say

                evaluate_at_end(trainer, cfg, data.val, tok.token_byte_lengths(), ctx.run_dir,
                                lambda line: say(line, console=not ctx.multirun))
            if dist.initialized:  # until rank 0 has written its checkpoint: torchrun stops every rank
                torch.distributed.barrier()  # as soon as one exits non-zero, as a stopped run does (130)
        finally:
            dist.close()
        return outcome
