"""The project's shared vocabularies, each written once: which config keys name a variant,
the metrics a run logs, and a run's statuses.

A leaf module (it imports nothing of ablate's), so the CLI, the trainer, the sinks, sweeps and
the analysis all import it without pulling anything heavy. conf/config.yaml's
`hydra.job.config.override_dirname.exclude_keys` is held to VARIANT keys by a test.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional

# ---- variant keys ------------------------------------------------------------------------------
# Keys (prefixes) that do not change what is trained: where the outputs go, what is shown, how
# often it is saved or evaluated. A run re-entered with other values of these is the same run.
# train.eval_every is one: an evaluation reads fixed windows, draws no random numbers, and one
# always runs at the last step, so neither the weights nor the final val_loss depend on it
# (train.eval_tokens does not belong here: it sets what val_loss measures). train.eval_lengths
# is another: it evaluates the final weights after the last step, into its own record.
NOT_TRAINING = ("hydra.", "hydra/", "launcher", "logger", "out_dir", "study", "plugins",
                "train.progress", "train.threads", "train.resume", "train.extend", "train.log_every",
                "train.eval_every", "train.eval_lengths", "train.ckpt_every", "train.keep_ckpts",
                "train.diagnostics_every", "data.num_proc", "data.cache_dir")
# Keys that choose how the same model and batches are computed (placement, kernels, compile,
# the loss in chunks, the passes a batch is cut into): results differ by rounding only, so they
# never name a variant, and a run re-entered with other values of them is the same experiment
# (ablate/run/lifecycle.py: a finished one returns its record, a stopped one continues).
HOW_COMPUTED = ("train.device", "train.nproc", "train.strategy", "train.fused_ce", "train.ce_chunk",
                "train.compile", "train.sdpa_backend", "train.flex_attention", "train.micro_batch",
                "train.deterministic")
SEED_KEYS = ("seed", "data_seed")
# Model keys that are variant keys though outside an axis group: they change the block, not its
# size or its training (the stability options, the presets' init, the heads' layout).
VARIANT_MODEL_KEYS = ("model.z_loss", "model.attn_softcap", "model.logit_softcap", "model.emb_scale",
                      "model.depth_scaled_init", "model.act_clamp", "model.mtp_heads",
                      "model.mtp_weight", "model.parallel_block", "model.n_kv_heads", "model.init")

# A ladder sweep's variant may train on its own tokens per parameter (not a config key): the
# sweep plans its steps from it, and compare reads a variant of it alone as the twice-the-tokens check.
LADDER_TOKENS_KEY = "ladder.tokens_per_param"


def override_key(override_or_key: str) -> str:
    """`+model.z_loss=1e-4` -> `model.z_loss`; a plain key is returned as it is."""
    return override_or_key.lstrip("+~").split("=", 1)[0]


def is_not_training(key: str) -> bool:
    """The key's value does not change what is trained (re-entering with another is the same run)."""
    return override_key(key).startswith(NOT_TRAINING)


def names_variant(key: str) -> bool:
    """The key's value can name a variant: not a seed, not an output or a way of computing."""
    key = override_key(key)
    return key not in SEED_KEYS and not key.startswith(NOT_TRAINING + HOW_COMPUTED)


def variant_overrides(overrides: list[str]) -> list[str]:
    """The overrides that name the variant, sorted, without Hydra's '+' (`~` deletions stay)."""
    return sorted(o.lstrip("+") for o in overrides if names_variant(o))


def variant_name(overrides: list[str]) -> str:
    return ",".join(variant_overrides(overrides)) or "baseline"


# ---- metrics -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Metric:
    name: str  # the metrics.jsonl / summary.json key
    wandb: str  # the W&B key
    title: str  # a plot's or a table's label
    higher_is_better: bool = False
    log_scale: bool = False  # spans decades: drawn on a log axis


# The metric names, each written once: code elsewhere uses these constants, never the string.
TRAIN_LOSS, VAL_LOSS, VAL_BPB, GRAD_NORM = "train_loss", "val_loss", "val_bpb", "grad_norm"
LR, TOKENS_PER_S, MFU, TOKENS = "lr", "tokens_per_s", "mfu", "tokens"

# The objective's auxiliary terms (ablate/model/transformer.py: LMOutput.terms), each logged as
# the weighted value it adds, averaged over micro-steps and ranks as train_loss is: metrics.jsonl
# key loss/<name>, W&B train/loss_<name>. train_loss stays the next-token loss alone. A component's
# every-row statistic: stat/<name>, W&B train/stat_<name>. Any other term or statistic a
# component declares (a plugin's) gets its row by the same rule (term_metric).
LOSS_PREFIX, STAT_PREFIX = "loss/", "stat/"
Z_TERM, MTP_TERM = "z", "mtp"  # the logit z-loss (model.z_loss), the MTP heads' loss (model.mtp_weight)
BALANCE_TERM, ROUTER_Z_TERM = "balance", "router_z"  # a router's load-balancing and z-loss


def loss_key(term: str) -> str:
    return LOSS_PREFIX + term


def stat_key(name: str) -> str:
    return STAT_PREFIX + name


def term_metric(key: str) -> Optional[Metric]:
    """The row of a loss/<name> or stat/<name> key (None for any other key)."""
    for prefix, title in ((LOSS_PREFIX, "loss term"), (STAT_PREFIX, "statistic")):
        if key.startswith(prefix) and len(key) > len(prefix):
            name = key[len(prefix):]
            return Metric(key, f"train/{prefix[:-1]}_{name}", f"{name} ({title})")
    return None


METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric(TRAIN_LOSS, "train/loss", "train loss"),
    Metric(VAL_LOSS, "val/loss", "validation loss"),
    Metric(VAL_BPB, "val/bpb", "validation bits per byte"),
    Metric(GRAD_NORM, "train/grad_norm", "grad norm (before clipping)", log_scale=True),
    Metric(LR, "train/lr", "learning rate"),
    Metric(TOKENS_PER_S, "train/tokens_per_s", "tokens/s", higher_is_better=True),
    Metric(MFU, "train/mfu", "MFU", higher_is_better=True),
    Metric(TOKENS, "tokens", "tokens"),
    Metric(loss_key(Z_TERM), "train/loss_z", "z-loss term (model.z_loss x mean log Z^2)"),
    Metric(loss_key(MTP_TERM), "train/loss_mtp", "MTP term (model.mtp_weight x mean MTP loss)"),
    Metric(loss_key(BALANCE_TERM), "train/loss_balance", "load-balancing term"),
    Metric(loss_key(ROUTER_Z_TERM), "train/loss_router_z", "router z-loss term"),
)}
BY_WANDB_NAME: dict[str, str] = {m.wandb: m.name for m in METRICS.values()}


def metric(name: str) -> Optional[Metric]:
    """The row of a metrics.jsonl key: the table's, or a term's or statistic's by its rule."""
    return METRICS.get(name) or term_metric(name)


def metric_name(name: str) -> str:
    """A metric as metrics.jsonl names it; W&B's name (`val/loss`, `train/loss_z`) is accepted too."""
    if name in BY_WANDB_NAME:
        return BY_WANDB_NAME[name]
    for prefix in (LOSS_PREFIX, STAT_PREFIX):
        head = f"train/{prefix[:-1]}_"
        if name.startswith(head) and len(name) > len(head):
            return prefix + name[len(head):]
    return name


def wandb_name(name: str) -> str:
    m = metric(name)
    return m.wandb if m else name


def higher_is_better(name: str) -> bool:
    m = METRICS.get(metric_name(name))
    return bool(m and m.higher_is_better)


# ---- run statuses ------------------------------------------------------------------------------
class Status(str, Enum):
    """summary.json's `status`. A str, so it compares equal to and serialises as its value."""

    RUNNING = "running"
    COMPLETED = "completed"
    DIVERGED = "diverged"
    FAILED = "failed"
    INTERRUPTED = "interrupted"  # SIGINT (Ctrl-C), with a checkpoint: resumable
    PREEMPTED = "preempted"  # SIGTERM/SIGUSR1/SIGUSR2, with a checkpoint: resumable (requeued)
    KILLED = "killed"  # never written: a "running" record whose process is gone (rundir.live_status)
    NOT_RUN = "not run"  # never written: a sweep job that did not start (the sweep stopped first)

    __str__ = str.__str__
    __format__ = str.__format__

    @property
    def color(self) -> str:
        """The colour every report shows this status in (rich markup)."""
        return _STATUS_COLORS[self]


_STATUS_COLORS = {Status.RUNNING: "cyan", Status.COMPLETED: "green", Status.DIVERGED: "yellow",
                  Status.FAILED: "red", Status.KILLED: "red", Status.INTERRUPTED: "magenta",
                  Status.PREEMPTED: "magenta", Status.NOT_RUN: "dim"}


FINISHED = (Status.COMPLETED, Status.DIVERGED)  # training it again would give the same result
STOPPED = (Status.PREEMPTED, Status.INTERRUPTED)  # stopped by a signal: `ablate resume` continues it
# Stopped by a signal with a checkpoint: 130 (128 + SIGINT) whatever the signal, the code `ablate
# sweep` returns too, so a script tests one value for "stopped, `ablate resume DIR` continues it".
STOPPED_EXIT = 130
