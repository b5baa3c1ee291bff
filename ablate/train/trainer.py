"""The shared trainer. It knows the model only through its constructor and forward; metrics
leave through sinks; the run's outcome is returned as a status the caller writes down."""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from ablate.data.batches import Batches, val_windows
from ablate.data.cache import TokenData
from ablate.model.moe import ExpertLoads
from ablate.model.roles import unique_parameters
from ablate.model.spec import flops_per_token
from ablate.run.record import Outcome, TrainResult
from ablate.tracking.sinks import Sink
from ablate.train import checkpoint
from ablate.train.allocator import keep_freed_memory
from ablate.train.backends import (RecompileWatch, check_sdpa_backend, compile_model, configure_backends,
                                   graphs_compiled, reset_compile_state)
from ablate.train.distributed import (all_ranks_mean, all_ranks_min, all_ranks_sum, any_rank,
                                      load_model_and_optimizer_state, model_and_optimizer_state)
from ablate.train.evaluate import evaluate
from ablate.train.microbatch import resolve_micro_batch
from ablate.train.optimizer import build_optimizer, optimizer_step, restore_implementation, set_lr, state_bytes
from ablate.train.optimizers.optim_settings import OptimSpec
from ablate.train.peak import Peak, device_peak, mfu
from ablate.train.policy import Action, Cadence, Guard, Verdict
from ablate.train.schedule import lr_at, resolved_warmup
from ablate.train.signals import Phase, StopRequest
from ablate.train.state import RunState
from ablate.train.throughput import Throughput
from ablate.names import GRAD_NORM, LR, MFU, TOKENS, TOKENS_PER_S, TRAIN_LOSS, VAL_BPB, VAL_LOSS, Status, stat_key


def process_age_s() -> Optional[float]:
    """Seconds since this process started (Linux /proc; None elsewhere)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start, ticks after boot
        return float(Path("/proc/uptime").read_text().split()[0]) - started
    except (OSError, ValueError, IndexError):
        return None


def first_line(e: Exception) -> str:
    """An exception's first informative line (torch's load_state_dict starts with a header)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return next((ln for ln in lines if not ln.endswith(":")), lines[0] if lines else type(e).__name__)


def blocks_grad_norm(model: torch.nn.Module) -> Optional[float]:
    """The L2 norm of the transformer blocks' raw gradients (embeddings, final norm and head
    aside): 0 when no gradient reaches any block. None for a model without `blocks`."""
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        return None
    grads = [p.grad for p in blocks.parameters() if p.grad is not None]
    return float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_precision(name: str, device: torch.device) -> str:
    if name == "auto":
        return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    return name


@dataclass(frozen=True)
class Ending:
    """How the run ends at a step: its status and why."""

    status: Status
    reason: str


@dataclass
class Measured:
    """One step's loss and grad norm on the device, read on the host (a sync) once, when asked;
    and the objective's terms and the components' statistics (loss/<name>, stat/<name>), read
    where a row logs them."""

    loss: torch.Tensor
    grad_norm: torch.Tensor
    lr: float
    terms: dict = field(default_factory=dict)
    _read: Optional[tuple[float, float]] = None

    def read(self) -> tuple[float, float]:
        if self._read is None:
            self._read = (float(self.loss), float(self.grad_norm))
        return self._read


@dataclass
class Segment:
    """One fit call's bookkeeping."""

    resumed_from: Optional[int]
    speed: Throughput
    started: float  # time.perf_counter() at its start
    first_step_s: Optional[float] = None  # seconds from the job's start to its first finished step
    loss: Optional[float] = None  # the train loss of the last judged step


class Trainer:
    """The training loop (`fit`, one `step()` at a time) over its components: the cadence of
    logs, evaluations and checkpoints and the divergence guard (policy.py), the run's state
    (state.py) and its speed (throughput.py)."""

    def __init__(self, model: torch.nn.Module, cfg: Any, data: TokenData, sinks: Optional[Sink],
                 run_dir: Path, byte_lengths, *, data_seed: int = 0, rank: int = 0, world_size: int = 1,
                 wrap: Optional[Callable[[torch.nn.Module], torch.nn.Module]] = None,
                 on_diagnostics: Optional[Callable] = None, job_started: Optional[float] = None,
                 optim: Optional[OptimSpec] = None):
        self.cfg = cfg  # the `train` config group
        self.optim = optim or OptimSpec()  # the `optim` axis: which optimizers (AdamW when None)
        self.job_started = job_started  # time.time() the job began; None: when the process did
        self.run_dir = Path(run_dir)
        self.rank, self.world = rank, world_size
        self.is_main = rank == 0
        self.sinks, self.data, self.byte_lengths = sinks, data, byte_lengths
        self.device = resolve_device(cfg.device)
        if self.device.type == "cpu":
            keep_freed_memory()  # no page faults for each step's activations (ablate/train/allocator.py)
        # train.deterministic, train.tf32: before the model reaches the device (cuBLAS workspace)
        self.backend_settings = configure_backends(cfg, self.device.type)
        self.precision = resolve_precision(cfg.precision, self.device)
        self.model = self._place(model)  # unwrapped: checkpoints, eval
        # train.micro_batch: the same global batch in fewer, larger passes where memory allows;
        # probed on the unwrapped model (no collectives), one choice for all ranks
        self.micro_batch = all_ranks_min(resolve_micro_batch(cfg, self.model, self.device, self.autocast,
                                                             state_bytes(self.model, self.optim)),
                                         world_size, self.device)
        self.grad_accum = cfg.batch_size * cfg.grad_accum // self.micro_batch
        self.train_model = self._compiled(wrap(self.model) if wrap else self.model)
        spec = getattr(model, "spec", None)
        self.flops_per_token = flops_per_token(spec, cfg.seq_len) if spec is not None else None
        self._peak: Optional[Peak] = None
        self.batches = Batches(data.train, cfg.seq_len, self.micro_batch, data_seed=data_seed,
                               rank=rank, world_size=world_size, grad_accum=self.grad_accum)
        self.val_windows = val_windows(data.val, cfg.seq_len, cfg.eval_tokens)
        self.pin = self.device.type == "cuda"
        # on_diagnostics(trainer, step) runs after backward, before clipping and the update, every
        # train.diagnostics_every steps; it may return finish(updated: bool), run after the update.
        self.on_diagnostics = on_diagnostics
        self._diag_pending: Optional[Callable[[bool], None]] = None
        self.optimizer = build_optimizer(self.model, cfg, self.device, self.optim)  # after any wrap (FSDP)
        self._optimizer_step = optimizer_step(self.optimizer, cfg)  # after the reset above
        self.params = [p for p in unique_parameters(self.model) if p.requires_grad]
        self.tokens_per_step = cfg.batch_size * cfg.seq_len * cfg.grad_accum * world_size
        self.state = RunState(self.tokens_per_step, schedule_steps=cfg.steps, warmup_steps=resolved_warmup(cfg))
        self.cadence = Cadence.from_config(cfg)
        self.guard = Guard(cfg.diverge_threshold, cfg.skip_spikes)
        self.stop = StopRequest()  # the run passes its own, installed since the run's start
        self._resume_rng: Optional[dict] = None  # applied right before the first resumed step
        # the last train_step's objective terms and statistics, averaged as its loss is
        self.step_terms: dict[str, torch.Tensor] = {}
        # an MoE's tokens per expert (layers, experts): what this step's micro-steps routed (all
        # ranks), then, once its update is applied, the last applied step's (a skipped step's are
        # dropped); forward passes outside train_step are never added (ablate/model/moe.py)
        self.loads = ExpertLoads(self.model.blocks) if hasattr(self.model, "blocks") else None
        self.step_loads: Optional[torch.Tensor] = None
        self.expert_loads: Optional[torch.Tensor] = None
        self.segment: Optional[Segment] = None  # the current fit call's
        self.block_grad_norm: Optional[float] = None  # the blocks' raw gradient norm at the last step

    def _place(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model on its device, with the loss's implementation (not part of its spec) set
        before the micro-batch probe, which measures the memory of this loss."""
        cfg, spec = self.cfg, getattr(model, "spec", None)
        if spec is not None:
            check_sdpa_backend(cfg.sdpa_backend, spec.n_heads, spec.head_dim, self.device,
                               torch.bfloat16 if self.precision == "bf16" else torch.float32)
        model = model.to(self.device)
        if hasattr(model, "fused_ce"):
            model.fused_ce, model.ce_chunk = bool(cfg.fused_ce), int(cfg.ce_chunk)
        return model

    def _compiled(self, train_model: torch.nn.Module) -> torch.nn.Module:
        cfg = self.cfg
        self.compiled = bool(cfg.compile)
        if self.compiled:  # from a clean dynamo state: every job and bench variant compiles afresh
            train_model = compile_model(train_model, cfg.compile_backend, cfg.compile_mode)
        else:  # compiled helpers (FlexAttention on CUDA) start clean too
            reset_compile_state()
        # CUDA graphs (reduce-overhead, max-autotune) reuse their output buffers: each micro-step
        # is a new graph step, whose outputs this loop reads before the next one.
        self._graph_steps = (self.compiled and self.device.type == "cuda"
                             and cfg.compile_mode in ("reduce-overhead", "max-autotune"))
        self._graphs_at_build: Optional[int] = graphs_compiled() if self.compiled else None
        self.recompiles = RecompileWatch()  # installed during fit: did dynamo give up on a function?
        self._announced = False  # the compile fallback was reported
        return train_model

    @property
    def loss_spikes(self) -> int:
        return self.guard.loss_spikes

    def autocast(self):
        if self.precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    # ---- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            **self.state.state_dict(), **self.guard.state_dict(),
            **model_and_optimizer_state(self.model, self.optimizer),
            "rng": checkpoint.plain_rng_state(),
            # how the global batch was split: a resume must split it the same way
            **checkpoint.layout(self.world, self.cfg.strategy),
        }

    def save_checkpoint(self) -> None:
        state = self.state_dict()  # on every rank: gathering a sharded (FSDP) model is collective
        if self.is_main:
            checkpoint.save(self.run_dir, self.state.step, state, keep=self.cfg.keep_ckpts)

    def try_resume(self, state: Optional[dict] = None) -> Optional[int]:
        """Load `state` (the run already loaded and checked it), else the newest valid checkpoint."""
        if self.cfg.resume == "never":
            if self.is_main and checkpoint.clear(self.run_dir):
                checkpoint.warn(f"warning: train.resume=never: removed the old checkpoints in {self.run_dir}")
            return None
        if state is None:  # raises if every checkpoint is unusable; rank 0 reports skipped ones
            warn = checkpoint.warn if self.is_main else (lambda message: None)
            state = checkpoint.latest_valid(self.run_dir, warn=warn)
        if state is None:
            return None
        try:
            load_model_and_optimizer_state(self.model, self.optimizer, state)
            restore_implementation(self.optimizer, self.cfg, self.device)
        except (RuntimeError, ValueError, KeyError) as e:
            detail = checkpoint.first_mismatch(self.model.state_dict(), state["model"]) or first_line(e)
            raise checkpoint.CheckpointError(
                f"the checkpoint of step {state.get('step')} in {checkpoint.ckpt_dir(self.run_dir)} does "
                f"not fit this model ({detail[:160]}); use the config it was made with, "
                "another hydra.run.dir, or train.resume=never") from None
        self._resume_rng = state["rng"]
        self.guard.load_state_dict(state)
        self.state.load_state_dict(state)
        return self.state.step

    # ---- the loop ----------------------------------------------------------------------------
    def evaluate(self) -> dict:
        return evaluate(self.model, self.data.val, self.val_windows, self.byte_lengths,
                        self.device, self.micro_batch, self.autocast)

    def train_step(self, step: int) -> tuple[torch.Tensor, torch.Tensor, float]:
        """Forward, backward and clipping for step `step` (0-based); apply_update steps the
        optimizer. Returns (next-token loss, grad norm) tensors and the learning rate."""
        cfg = self.cfg
        lr = lr_at(step, cfg.lr, self.state.warmup_steps, self.state.schedule_steps, cfg.schedule, cfg.min_lr_ratio)
        set_lr(self.optimizer, lr)
        lm_loss = torch.zeros((), device=self.device)
        terms: dict[str, torch.Tensor] = {}  # loss/<name>, stat/<name>: the mean over micro-steps
        for micro in range(self.grad_accum):
            # One copy per micro-step; on CUDA from pinned memory, so it does not block the host.
            w = self.batches.window(step, micro, pin=self.pin).to(self.device, non_blocking=True)
            x, y = w[:, :-1], w[:, 1:]  # (B, T) each
            sync = micro == self.grad_accum - 1
            ctx = nullcontext() if sync or not hasattr(self.train_model, "no_sync") else self.train_model.no_sync()
            if self._graph_steps:
                torch.compiler.cudagraph_mark_step_begin()
            with ctx:
                with self.autocast():
                    out = self.train_model(x, y)
                (out.loss / self.grad_accum).backward()
            lm_loss += out.lm_loss.detach() / self.grad_accum
            if self.loads:
                self.loads.add()
            for key, value in out.metrics().items():
                terms[key] = terms.get(key, 0.0) + value.float() / self.grad_accum
        if step == cfg.steps - 1:  # the last step's: summary.json's block_grad_norm (ablate/run/collapse.py)
            self.block_grad_norm = blocks_grad_norm(self.model)
        if self._diagnostics_due(step):  # raw gradients; row step as for the train row (0: init profile)
            self._diag_pending = self.on_diagnostics(self, min(step + 1, cfg.steps))
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm, foreach=True)
        lm_loss = all_ranks_mean(lm_loss, self.world)  # the global batch's loss on every rank
        self.step_terms = dict(zip(terms, all_ranks_mean(torch.stack(list(terms.values())), self.world))) \
            if terms else {}  # one collective for all of them
        if self.loads:  # the step's loads, summed over micro-steps and ranks, and their summary
            self.step_loads = all_ranks_sum(self.loads.take(), self.world)
            self.step_terms.update({stat_key(k): v for k, v in self.loads.stats(self.step_loads).items()})
        return lm_loss, grad_norm, lr

    def _diagnostics_due(self, step: int) -> bool:
        every = self.cfg.diagnostics_every
        return bool(self.on_diagnostics and every) and ((step + 1) % every == 0 or self.cfg.steps == 0)

    def finish_diagnostics(self, updated: bool) -> None:
        """The diagnostics that follow the update (update ratios), or its skip."""
        pending, self._diag_pending = self._diag_pending, None
        if callable(pending):
            pending(updated)

    def apply_update(self) -> None:
        """The optimizer step that follows train_step (fit judges the loss in between);
        `ablate bench` times train_step + apply_update, the same code path as fit."""
        self._optimizer_step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.loads is not None:  # the components' updates that follow the step (an MoE's choice bias)
            self.loads.after_update(self.step_loads)

    def fit(self, start_step: int = 0) -> Outcome:
        """Train from `start_step` to train.steps, one `step()` at a time; the outcome says how
        the run ended (completed, diverged, interrupted or preempted, with a checkpoint)."""
        self.segment = self._begin(start_step)
        old_handlers = self.stop.install()
        self.stop.phase = Phase.TRAINING
        self.recompiles.__enter__()
        try:
            self._start(start_step)
            while self.state.step < self.cfg.steps:
                ending = self.step()
                if ending is not None:
                    return self._outcome(ending)
            self.save_checkpoint()
            return self._outcome(Ending(Status.COMPLETED, ""))
        except KeyboardInterrupt:
            self.save_checkpoint()
            return self._outcome(Ending(Status.INTERRUPTED, "KeyboardInterrupt"))
        finally:
            self.recompiles.__exit__()
            self.stop.phase = Phase.WAIT  # the outcome is known: a late signal must not interrupt its record
            StopRequest.restore(old_handlers)

    def step(self) -> Optional[Ending]:
        """One optimizer step and what follows it, in order; how the run ends here, or None.
        An evaluation's checkpoint is written before its row, so a logged evaluation has one."""
        n = self.state.step  # optimizer steps done before this one
        measured = self._train(n)  # forward, backward, clipping
        verdict = self._judge(n, measured)  # the guard, where this step reads its loss
        if verdict.action is Action.DIVERGE:
            return self._diverged(n, measured, verdict.reason)
        self._update(verdict)  # applied, or skipped (train.skip_spikes); the step is done
        self._log_train(measured)  # by the cadence
        self.finish_diagnostics(updated=verdict.action is Action.UPDATE)
        metrics = self._evaluate() if self.cadence.evaluates(n + 1) else None
        if metrics is not None and not math.isfinite(metrics[VAL_LOSS]):
            self._log_eval(metrics)
            return Ending(Status.DIVERGED, "non-finite validation loss")
        if self.cadence.saves(n + 1):
            self.save_checkpoint()
        if metrics is not None:
            self._log_eval(metrics)
        if self._stop_requested():
            self.save_checkpoint()
            return Ending(self.stop.status, self.stop.reason)
        return None

    def _train(self, n: int) -> Measured:
        self.segment.speed.step_started()
        self.segment.loss = None
        loss, grad_norm, lr = self.train_step(n)
        self._check_compiled()
        return Measured(loss, grad_norm, lr, self.step_terms)

    def _judge(self, n: int, measured: Measured) -> Verdict:
        """The guard's verdict on step n + 1 where it reads its loss on the host (_syncs), else
        the update is applied unjudged."""
        if not self._syncs(n):
            return Verdict()
        self.segment.loss, grad_norm = measured.read()
        return self.guard.judge(n + 1, self.segment.loss, grad_norm)

    def _diverged(self, n: int, measured: Measured, reason: str) -> Ending:
        """The failing step's row and diagnostics profile; its update is not applied."""
        loss, grad_norm = measured.read()
        self._log_row(n + 1, loss, grad_norm, measured.lr, None, measured.terms)
        self.finish_diagnostics(updated=False)
        return Ending(Status.DIVERGED, reason)

    def _update(self, verdict: Verdict) -> None:
        if verdict.action is Action.SKIP:  # OLMo-core SkipStep: drop this update, keep going, count it
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.apply_update()
            self.expert_loads = self.step_loads  # a skipped step's routing counts for nothing
        self.step_loads = None
        self.guard.updated(verdict)
        self.state.step += 1
        self._step_finished()

    def _log_train(self, measured: Measured) -> None:
        step = self.state.step
        if not self.cadence.logs(step):
            return
        self.segment.loss, grad_norm = measured.read()
        tps = self.segment.speed.log(step)
        self.state.last.update({TRAIN_LOSS: self.segment.loss, TOKENS_PER_S: tps})
        self._log_row(step, self.segment.loss, grad_norm, measured.lr, tps, measured.terms)

    def _stop_requested(self) -> bool:
        """A stop signal reached some rank: every rank stops at this same step."""
        if not any_rank(self.stop.signum is not None, self.world, self.device):
            return False
        self.stop.signum = self.stop.signum or signal.SIGTERM
        return True

    def _begin(self, start_step: int) -> Segment:
        self.state.step = start_step
        self.train_model.train()
        if self._resume_rng is not None:  # restored last, so nothing since can have consumed it
            checkpoint.set_rng_state(self._resume_rng)
            self._resume_rng = None
        self.recompiles.hits.clear()
        self._announced = False
        return Segment(start_step or None, Throughput(self.tokens_per_step, self._sync), time.perf_counter())

    def _start(self, start_step: int) -> None:
        """What comes before the first step: the evaluation at init and the device's peak."""
        cfg = self.cfg
        if start_step == 0 and cfg.eval_every and cfg.steps > 0:
            self._log_eval(self._evaluate())  # the loss at initialization: the curve's starting point
        if self.is_main:
            self.peak()  # looked up once: not inside a timed window
        self.segment.speed.start()
        if start_step == 0 and cfg.steps == 0 and self._diagnostics_due(0):
            self.train_step(0)  # train.steps=0: the gradient profile at initialization, no update
            self.finish_diagnostics(updated=False)
            self.optimizer.zero_grad(set_to_none=True)

    def _syncs(self, step: int) -> bool:
        """Whether step `step` reads its loss on the host (a sync): every step on CPU or when
        spikes are skipped, else at each log row, so the GPU runs ahead in between."""
        every = 1 if (self.device.type == "cpu" or self.cfg.skip_spikes) else self.cfg.log_every
        return (step + 1) % every == 0 or step + 1 == self.cfg.steps

    def _check_compiled(self) -> None:
        if self._graphs_at_build is not None:  # the first compiled forward this trainer ran
            self.recompiles.check_compiled(self._graphs_at_build)  # (before a compiled update)
            self._graphs_at_build = None

    def _step_finished(self) -> None:
        seg = self.segment
        seg.speed.step_done(self.state.step)
        if seg.first_step_s is None:  # what a user waits: imports, data, build, compile, eval
            seg.first_step_s = (time.time() - self.job_started if self.job_started is not None
                                else process_age_s() or (time.perf_counter() - seg.started))
        self._announce_fallback()

    def _evaluate(self) -> dict:
        """Validation metrics at this step, kept as the run's last; their time is not training's."""
        t_eval = time.perf_counter()
        metrics = self.evaluate()
        self.state.last.update(metrics)
        if self.segment is not None:
            self.segment.speed.exclude(time.perf_counter() - t_eval)
        return metrics

    def _log_eval(self, metrics: dict) -> None:
        if self.is_main:
            step = self.state.step
            self.sinks.log({"step": step, TOKENS: self.state.tokens_at(step), **metrics})

    def _log_row(self, step, loss, gnorm, lr, tps, terms: Optional[dict] = None):
        if not self.is_main:
            return
        row = {"step": step, TOKENS: self.state.tokens_at(step), TRAIN_LOSS: loss, GRAD_NORM: gnorm, LR: lr}
        if terms:  # loss/<name>, stat/<name> (ablate/names.py): one read for all of them
            row.update(zip(terms, torch.stack(list(terms.values())).tolist()))
        if tps is not None:
            row[TOKENS_PER_S] = tps
            row[MFU] = self.mfu(tps)
        self.sinks.log(row)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def peak(self) -> Peak:
        """The device's peak FLOP/s (ablate/train/peak.py), looked up or measured once."""
        if self._peak is None:
            self._peak = device_peak(self.device, self.precision)
        return self._peak

    def mfu(self, tokens_per_s: Optional[float]) -> Optional[float]:
        """Model FLOPs utilisation: model FLOPs/token x tokens/s over the peak of all devices."""
        return mfu(tokens_per_s, self.flops_per_token, self.peak(), self.world)

    def _announce_fallback(self) -> None:
        """Once per fit: dynamo stopped compiling something, so this run is (partly) eager."""
        if self.recompiles.hits and not self._announced:
            self._announced = True
            if self.is_main:
                print(f"warning: torch.compile fell back to eager at step {self.state.step}: "
                      f"{self.recompiles.reason}; tokens/s is not the compiled speed",
                      file=sys.stderr, flush=True)

    def _outcome(self, ending: Ending) -> Outcome:
        seg, last, speed = self.segment, self.state.last, self.segment.speed
        tps = speed.tokens_per_s if speed.tokens_per_s is not None else last[TOKENS_PER_S]
        compile_s = None
        if (self.compiled or self.cfg.compile_optimizer) and speed.warm_s is not None and speed.step_s is not None:
            # the warm-up steps' extra time: compiling, mostly (an uncompiled run's is ~0.01 s)
            compile_s = max(0.0, speed.warm_s - speed.WARM_STEPS * speed.step_s)
        peak = self.peak() if self.is_main else None
        step = self.state.step
        result = TrainResult(
            tokens=self.state.tokens_at(step), train_loss=seg.loss if seg.loss is not None else last[TRAIN_LOSS],
            val_loss=last[VAL_LOSS], val_bpb=last[VAL_BPB], tokens_per_s=tps, skipped_steps=self.guard.skipped,
            resumed_from=seg.resumed_from, time_to_first_step_s=seg.first_step_s, compile_s=compile_s,
            mfu=self.mfu(tps) if self.is_main else None, peak_flops=peak.flops if peak else None,
            peak_flops_source=peak.source if peak else None, compile_fallback=bool(self.recompiles.hits),
            backend=self.backend_settings, block_grad_norm=self.block_grad_norm,
            compile_fallback_reason=self.recompiles.reason if self.recompiles.hits else None)
        return Outcome(ending.status, ending.reason, step, self.cfg.steps, result)
