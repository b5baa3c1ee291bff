"""Typed config schema, registered in Hydra's ConfigStore so overrides are checked at compose time.

`conf/config.yaml` composes one option per axis group (each declared in ablate/model/options.py)
on top of `ablate_schema`; a wrong type (`train.steps=abc`) is a ValidationError before anything
runs. Cross-key invariants that a type cannot express live in `validate()`, which runs before any
directory is made or any tensor built.
"""

from __future__ import annotations

import copyreg
import dataclasses
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, Optional, get_type_hints

from ablate.model import options

# The architectural axes, in the order they are listed and used in run names (ablate/model/options.py).
AXES = tuple(options.AXES)
LOGGER_MODES = ("auto", "online", "offline", "disabled")
COMPILE_BACKENDS = ("inductor", "eager", "aot_eager", "cudagraphs")  # torch._dynamo.list_backends()
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
SDPA_BACKENDS = ("auto", "flash", "efficient", "cudnn", "math")  # ablate/train/backends.py

# Each axis's config node: the option's name, the axis's keys and settings, typed by their
# declarations (setting(None, float) for dropout.attn: an optional float, null by default); an
# option with settings of its own composes a subclass of it (ablate/model/axis.py: Option.schema).
AXIS_SCHEMAS = {name: options.AXES[name].schema for name in AXES}


@dataclass
class ModelConfig:
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: Optional[int] = None  # null: set by the attn axis
    d_ff: Optional[int] = None  # null: ffn_ratio * d_model (2/3 of that for gated activations)
    ffn_ratio: float = 4.0
    ffn_multiple_of: int = 16
    vocab_size: Optional[int] = None  # null: the tokenizer's, padded up to a multiple of 64
    max_seq_len: int = 256
    # normal: N(0, init_std) matrices and embeddings (GPT-2); xavier: Glorot-uniform matrices (q, k
    # and v each d x d), N(0, d^-1/2) embeddings (Vaswani et al. 2017's tensor2tensor code)
    init: str = "normal"
    init_std: float = 0.02  # init=normal only
    depth_scaled_init: bool = True  # residual output projections' init / sqrt(2 * n_layers)
    emb_scale: bool = False  # multiply token embeddings by sqrt(d_model)
    parallel_block: bool = False  # GPT-J / PaLM: attention and FFN read the same input
    z_loss: float = 0.0  # PaLM z-loss weight on log(Z)^2
    attn_softcap: Optional[float] = None  # Gemma 2 tanh capping of attention logits
    logit_softcap: Optional[float] = None  # Gemma 2 tanh capping of output logits
    act_clamp: Optional[float] = None  # clamp the gated FFN's activations to [-c, c]
    mtp_heads: int = 0  # extra heads predicting tokens t+2 .. t+k+1
    mtp_weight: float = 0.3  # total auxiliary weight: lambda x the mean over the heads (DeepSeek-V3)
    # The reference shape of param=mup / completep (docs/parametrization.md): hidden LRs, init and
    # multipliers are relative to the same model at this width / depth. null: the run's own shape
    # (where every param option trains as sp).
    base_width: Optional[int] = None
    base_depth: Optional[int] = None


@dataclass
class TrainConfig:
    steps: int = 1200
    batch_size: int = 16
    grad_accum: int = 1
    # Sequences per forward pass; the global batch stays batch_size x grad_accum (per rank), cut
    # into passes of this size (ablate/train/microbatch.py). null: batch_size. auto: on CUDA the
    # largest that fits in memory (a probe pass at start), on CPU batch_size.
    micro_batch: Optional[Any] = None
    seq_len: int = 128
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    # null: warmup_fraction of the steps, rounded down, at most warmup_max_steps (schedule.py:
    # auto_warmup), so a short run still decays; a count set by hand is kept. Fixed when the run
    # starts: a resumed or extended run keeps the warmup it started with (its checkpoints hold it).
    warmup_steps: Optional[int] = None
    warmup_fraction: float = 0.1
    warmup_max_steps: int = 100
    schedule: str = "cosine"  # cosine | linear | constant
    grad_clip: float = 1.0
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    precision: str = "auto"  # auto | fp32 | bf16
    # torch.compile. Off by default, on CUDA too, until the cuda test tier has passed on a GPU
    # (docs/gpu.md); on CPU `ablate bench --vs train.compile=true` gives +2% tokens/s on the tiny
    # model after ~60 s of compiling on 2 cores.
    compile: bool = False
    # torch.compile backend: inductor (generated kernels), or eager / aot_eager (dynamo only;
    # tests and debugging). Every Trainer compiles from a clean dynamo state (ablate/train/backends.py).
    compile_backend: str = "inductor"
    # torch.compile mode: reduce-overhead replays the step as CUDA graphs (no per-kernel launch
    # cost: what small models on a GPU are bound by); max-autotune also benchmarks matmul kernels.
    compile_mode: str = "default"
    # The AdamW update compiled too (foreach, generated kernels) instead of the fused kernel;
    # ablate/train/optimizer.py. A speed setting: measure it with `ablate bench --vs`.
    compile_optimizer: bool = False
    # SDPA kernel: auto lets PyTorch choose (flash, then memory-efficient, then math); one name
    # keeps only that kernel (cudnn: cuDNN's fused attention on Hopper), so a bench can price it.
    sdpa_backend: str = "auto"
    # FlexAttention (one fused kernel) for ALiBi and soft-capped attention on CUDA, instead of
    # the explicit path. Opt-in until the cuda test tier has passed on a GPU (docs/gpu.md).
    flex_attention: bool = False
    # torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG, deterministic attention
    # kernels: two runs on the same CUDA device give bit-identical results (CPU already does).
    deterministic: bool = False
    tf32: bool = True  # CUDA: fp32 matmuls and cuDNN convolutions on TF32 tensor cores
    # Unembedding + cross-entropy chunk by chunk (ablate/model/loss.py): the batch x vocab logits
    # are never built in full. Same loss and gradients; how, not what, is trained.
    fused_ce: bool = False
    ce_chunk: int = 1024  # rows (tokens) per chunk with fused_ce
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    eval_every: int = 200
    eval_tokens: int = 32768
    # Context lengths evaluated on the final weights after training (ablate/evaluation/lengths.py), into
    # length_eval.json: the loss beyond (or below) train.seq_len. [] : none (`ablate eval` later).
    eval_lengths: list[int] = field(default_factory=list)
    log_every: int = 10
    # Checkpoint every N steps (0: only the final one and on a stop signal); null: at every
    # evaluation, so a run killed without warning loses at most one eval interval.
    ckpt_every: Optional[int] = None
    keep_ckpts: int = 2
    resume: str = "auto"  # auto | never
    # Train a completed run further to a larger train.steps (ablate/run/lifecycle.py): only when asked
    # for by name, since the result is neither the old experiment nor the longer one.
    extend: bool = False
    diverge_threshold: float = 3.0  # loss above threshold * running mean: diverged (0 = off)
    skip_spikes: bool = False  # skip the update on a spike instead of stopping
    diagnostics_every: int = 0  # 0: off
    nproc: int = 1  # >1: torchrun --standalone with that many processes
    strategy: str = "ddp"  # ddp | fsdp
    threads: int = 0  # torch intra-op threads on CPU (0: the cores free at start; ablate/train/threads.py)
    progress: bool = True


@dataclass
class DataConfig:
    name: str = "shakespeare"
    paths: list[str] = field(default_factory=list)
    hf_path: Optional[str] = None
    hf_name: Optional[str] = None
    hf_split: str = "train"
    text_field: str = "text"
    max_tokens: Optional[int] = None
    val_fraction: float = 0.05
    cache_dir: Optional[str] = None  # null: $ABLATE_CACHE or ~/.cache/ablate
    num_proc: int = 0  # tokenization threads (0: all cores)


@dataclass
class TokenizerConfig:
    name: str = "byte"


@dataclass
class LoggerConfig:
    name: str = "wandb"
    mode: str = "auto"  # auto | online | offline | disabled
    project: str = "ablate"
    entity: Optional[str] = None
    group: Optional[str] = None
    job_type: str = "train"
    tags: list[str] = field(default_factory=list)
    init_timeout: float = 15.0
    log_checkpoint: bool = False  # upload the latest checkpoint as a W&B `model` artifact


@dataclass
class RunConfig:
    """Everything but the axes."""

    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    seed: int = 0  # model init
    data_seed: int = 0  # batch order
    out_dir: str = "runs"
    # Modules that register options of their own (ablate/plugins.py), imported before composing.
    plugins: list[str] = field(default_factory=list)


# The whole schema: one node per axis (first, in axis order), then the rest.
AblateConfig = make_dataclass("AblateConfig", [
    *((name, schema, field(default_factory=schema)) for name, schema in AXIS_SCHEMAS.items()),
    *((f.name, get_type_hints(RunConfig)[f.name], field(default=f.default, default_factory=f.default_factory))
      for f in fields(RunConfig))])

# dataclasses.MISSING pickles by name, so it stays the one sentinel. The classes above are built by
# make_dataclass, not importable by name, so cloudpickle copies them by value: Hydra's submitit
# launcher ships them to each job (in the ConfigStore) and the job's result brings them back. Read
# back in the sweep process, the copy's state is re-applied to the live class (cloudpickle#439), and
# its Fields held a new MISSING (cloudpickle#424): `norm` then "defaulted" to that object and
# OmegaConf.structured(AblateConfig) failed. The sweep process and each job import this module.
copyreg.pickle(type(dataclasses.MISSING), lambda missing: "MISSING")


def register_configs() -> None:
    """The schema, and every axis option as an option of its config group (with the defaults
    list `axes` that conf/config.yaml includes), in Hydra's ConfigStore."""
    from ablate.model.axis import store_once

    store_once("", "ablate_schema", AblateConfig, lambda: AblateConfig, provider=None)
    options.store_in_hydra()


def setting_keys(cfg: Any) -> list[str]:
    """The dotted keys of the chosen options' own settings (`norm.alpha0` with norm=dyt): keys
    of the composed config beyond the schema's."""
    return [f"{axis}.{key}" for axis in AXES if axis in cfg and cfg[axis].name in options.names(axis)
            for key in options.get(axis, cfg[axis].name).settings]


def setting_owners(key: str) -> list[str]:
    """The options whose own setting `key` is: "norm.alpha0" -> ["norm=dyt"]."""
    axis, _, leaf = key.partition(".")
    return [f"{axis}={o.name}" for o in options.declared(axis) if leaf in o.settings] if axis in AXES else []


def axis_values(cfg: Any) -> dict[str, str]:
    """The variant's value on every axis, e.g. {"norm": "rmsnorm", ...}; an axis a config saved
    before it existed lacks is at its default (what that run trained)."""
    return {axis: str(cfg[axis]["name"]) if axis in cfg else options.AXES[axis].default for axis in AXES}


def validate(cfg: Any) -> None:
    """Cross-key invariants; raises ConfigError naming the keys involved. Needs no torch."""
    _check_train(cfg.train)
    _check_model(cfg)
    _check_run(cfg)
    _check_optim(cfg)
    from ablate.model.spec import ModelSpec

    spec = ModelSpec.from_config(cfg)  # resolves and checks the model's own invariants
    _check_plugin_roles(spec)  # param=mup: a plugin's parameter without a role, before any directory
    from ablate.data.cache import preflight

    preflight(cfg.data)  # missing data paths fail here, before a run directory exists



def _check_plugin_roles(spec: Any) -> None:
    """Under mup / completep with a plugin's option chosen on any component axis: its parameters'
    rules, read off a model built on the meta device, so a parameter without a role is refused
    (ConfigError) before a run starts. Built-in options tag every parameter (tests hold it): no
    torch then."""
    from ablate.model import options

    chosen = [options.get(axis, getattr(spec, axis)) for axis in options.component_axes()]
    if not options.get("param", spec.param).width or not any(o.plugin for o in chosen):
        return
    import torch

    from ablate.model.transformer import Transformer

    with torch.device("meta"):
        Transformer(spec)

def _check_optim(cfg: Any) -> None:
    """The optim axis's keys (ablate/train/optimizers/optim_settings.py: what is refused and why)."""
    from ablate.train.optimizers.optim_settings import OptimSpec

    OptimSpec.from_config(cfg).check(cfg.train.lr, str(cfg.param.name))


def _one_of(key: str, value: Any, choices: tuple) -> None:
    from ablate.errors import ConfigError

    if value not in choices:
        raise ConfigError(f"{key} must be {', '.join(choices[:-1])} or {choices[-1]}, got '{value}'")


def _check_train(t: Any) -> None:
    from ablate.errors import ConfigError

    for key in ("batch_size", "seq_len", "grad_accum", "log_every", "nproc", "ce_chunk"):
        if t[key] <= 0:
            raise ConfigError(f"train.{key} must be a positive integer, got {t[key]}")
    _check_steps(t)
    if t.lr <= 0:
        raise ConfigError(f"train.lr must be positive, got {t.lr}")
    if t.eval_every < 0 or (t.ckpt_every or 0) < 0:
        raise ConfigError("train.eval_every and train.ckpt_every must be >= 0")
    if t.eval_lengths:
        from ablate.evaluation.lengths import check_lengths

        check_lengths(list(t.eval_lengths), "train.eval_lengths")
    for key, choices in (("schedule", ("cosine", "linear", "constant")), ("precision", ("auto", "fp32", "bf16")),
                         ("strategy", ("ddp", "fsdp")), ("compile_backend", COMPILE_BACKENDS),
                         ("compile_mode", COMPILE_MODES), ("sdpa_backend", SDPA_BACKENDS),
                         ("resume", ("auto", "never"))):
        _one_of(f"train.{key}", t[key], choices)
    micro = t.micro_batch
    if micro is not None and micro != "auto" and (
            isinstance(micro, bool) or not isinstance(micro, int) or micro < 1
            or (t.batch_size * t.grad_accum) % micro):
        raise ConfigError(f"train.micro_batch must be auto, null or a divisor of train.batch_size x "
                          f"train.grad_accum = {t.batch_size * t.grad_accum}, got {micro}")
    if t.compile_mode != "default" and t.compile_backend != "inductor":
        raise ConfigError(f"train.compile_mode={t.compile_mode} is an Inductor mode; it needs "
                          f"train.compile_backend=inductor (got {t.compile_backend})")
    if t.sdpa_backend == "cudnn" and t.deterministic:
        raise ConfigError("train.sdpa_backend=cudnn has no deterministic backward; with "
                          "train.deterministic=true use auto, flash, efficient or math")
    if t.diagnostics_every < 0:
        raise ConfigError(f"train.diagnostics_every must be >= 0 (0 = off), got {t.diagnostics_every}")
    if t.threads < 0:
        raise ConfigError(f"train.threads must be >= 0 (0: chosen from the cores free at start), got {t.threads}")


def _check_steps(t: Any) -> None:
    """train.steps and the warmup inside them."""
    from ablate.errors import ConfigError
    from ablate.train.schedule import resolved_warmup

    # 0 steps trains nothing: allowed only for the gradient profile at initialization (diagnostics.md)
    if t.steps < 1 and not (t.steps == 0 and t.diagnostics_every > 0):
        raise ConfigError(f"train.steps must be a positive integer, got {t.steps}")
    for key in ("warmup_steps", "warmup_max_steps"):
        if t[key] is not None and t[key] < 0:
            raise ConfigError(f"train.{key} must be >= 0, got {t[key]}")
    if not 0.0 <= t.warmup_fraction < 1.0:
        raise ConfigError(f"train.warmup_fraction must be in [0, 1), got {t.warmup_fraction}")
    if t.steps > 0 and resolved_warmup(t) >= t.steps:
        raise ConfigError(
            f"train.warmup_steps={t.warmup_steps} is not below train.steps={t.steps}: the run would end "
            f"before its learning rate decays; lower it, or leave it null ({warmup_rule(t)})")


def warmup_rule(t: Any) -> str:
    """The automatic warmup in words, for messages."""
    return f"{t.warmup_fraction:.0%} of the steps, at most {t.warmup_max_steps}"


def warmup_warning(t: Any, warmup: int) -> Optional[str]:
    """One line when the warmup takes half the steps or more (the run decays over the rest only)."""
    if t.steps < 1 or 2 * warmup < t.steps:
        return None
    fix = ("lower train.warmup_fraction" if t.warmup_steps is None else
           f"lower train.warmup_steps, or leave it null ({warmup_rule(t)})")
    return (f"warning: the warmup ({warmup} steps) covers {warmup / t.steps:.0%} of train.steps={t.steps}: "
            f"the learning rate decays over the last {t.steps - warmup} steps only; {fix}")


def _check_model(cfg: Any) -> None:
    """The model's sizes and the axes' own keys."""
    from ablate.errors import ConfigError

    m, t = cfg.model, cfg.train
    for key in ("d_model", "n_layers", "n_heads", "max_seq_len"):
        if m[key] <= 0:
            raise ConfigError(f"model.{key} must be a positive integer, got {m[key]}")
    if t.seq_len > m.max_seq_len and cfg.pos.name in ("learned", "sinusoidal"):
        raise ConfigError(
            f"train.seq_len={t.seq_len} exceeds model.max_seq_len={m.max_seq_len} with "
            f"pos={cfg.pos.name}; raise model.max_seq_len or lower train.seq_len")
    if not 0.0 <= cfg.dropout.rate < 1.0:
        raise ConfigError(f"dropout.rate must be in [0, 1), got {cfg.dropout.rate}")
    if cfg.dropout.name == "off" and cfg.dropout.rate != 0:  # it would be ignored
        raise ConfigError(f"dropout.rate={cfg.dropout.rate} has no effect with dropout=off; "
                          "add dropout=on")
    attn_rate = cfg.dropout.get("attn")
    if cfg.dropout.name == "off" and attn_rate:
        raise ConfigError(f"dropout.attn={attn_rate} has no effect with dropout=off; add dropout=on")
    if cfg.attn.kv_group < 2:  # 1 would be mha; 0 divides by zero
        raise ConfigError(f"attn.kv_group must be >= 2 (query heads per KV head), got {cfg.attn.kv_group}")
    if m.ffn_multiple_of < 1:
        raise ConfigError(f"model.ffn_multiple_of must be a positive integer, got {m.ffn_multiple_of}")
    if not m.ffn_ratio > 0:
        raise ConfigError(f"model.ffn_ratio must be positive, got {m.ffn_ratio}")
    if m.mtp_heads < 0:
        raise ConfigError(f"model.mtp_heads must be >= 0, got {m.mtp_heads}")
    if m.mtp_heads >= t.seq_len:  # head k needs targets k positions ahead inside the window
        raise ConfigError(f"model.mtp_heads={m.mtp_heads} must be below train.seq_len={t.seq_len}")


def _check_run(cfg: Any) -> None:
    """Seeds, the logger, plugins and the data split."""
    from ablate.errors import ConfigError

    for key in ("seed", "data_seed"):  # numpy's and torch's seeds are unsigned 32-bit
        if not 0 <= cfg[key] < 2**32:
            raise ConfigError(f"{key} must be in [0, 2**32), got {cfg[key]}")
    _one_of("logger.mode", cfg.logger.mode, LOGGER_MODES)
    plugins = [str(name) for name in cfg.get("plugins") or []]
    for name in plugins:
        if not all(part.isidentifier() for part in name.split(".")):
            raise ConfigError(f"plugins: '{name}' is not a module name; write plugins=[my_pkg.my_module]")
    if plugins:  # they import (once): a job a launcher starts in a fresh process builds their options
        from ablate.plugins import load

        load(plugins)
    if not 0.0 < cfg.data.val_fraction < 1.0:
        raise ConfigError(f"data.val_fraction must be in (0, 1), got {cfg.data.val_fraction}")
