"""A run's record: what summary.json says about a run, typed, and written and read here only.

Each part has one owner, which fills it in:
- the run lifecycle (ablate/run/entry.py) opens the record: the run's identity, the process that runs
  it, its times, what it continues (`previous_status`, `extended_from`), and at the end its
  status, `error` or `finished`;
- the launch (ablate/train/launch.py) adds what it built: RunInfo (params, FLOPs, data, device,
  provenance; a sink adds where its records went: `wandb`);
- the trainer (ablate/train/trainer.py) adds how training ended: an Outcome (status, reason,
  step, steps) and its TrainResult (final losses, speed, compile and backend facts).

summary.json's keys are public (docs/running.md) and its JSON is flat, as it always was: the
groups that only organise the record here (RunInfo, TrainResult, ...) are flattened into it
(`flat(...)`), and a group none of whose fields is known yet (a run that failed before it was
built) leaves its keys out. A field made with `optional()` is left out, not null, while it is
None. Nested objects (`params_breakdown`, `data`, `provenance`, `wandb`) stay nested. A record
written by an older version (fewer keys) reads with those fields None; keys this version does
not know are dropped on reading.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Optional

from ablate.run.directory import SUMMARY, owner_alive, read_json, write_json
from ablate.names import METRICS, Status


def flat(group: type) -> Any:
    """A group of fields written into the enclosing JSON object; left out while none is known."""
    return field(default_factory=group, metadata={"flat": True})


def optional() -> Any:
    """A field left out of the JSON while None (it exists only in some outcomes)."""
    return field(default=None, metadata={"optional": True})


# ---- nested objects ------------------------------------------------------------------------------
@dataclass
class Git:
    commit: Optional[str] = None
    dirty: Optional[bool] = None


@dataclass
class Provenance:
    """Which code ran where (also in the W&B config)."""

    git: Optional[Git] = None  # the checkout of the ablate package, else of the working directory
    ablate: Optional[str] = None
    torch: Optional[str] = None
    cuda: Optional[str] = None
    python: Optional[str] = None
    device_name: Optional[str] = None
    hostname: Optional[str] = None


@dataclass
class ParamsBreakdown:
    """Analytic parameter count by component (ablate.model.spec.count_params)."""

    embedding: Optional[int] = None
    attention: Optional[int] = None
    ffn: Optional[int] = None
    norm: Optional[int] = None
    head: Optional[int] = None
    total: Optional[int] = None


@dataclass
class DataInfo:
    source: Optional[str] = None
    tokenizer: Optional[str] = None
    train_tokens: Optional[int] = None
    val_tokens: Optional[int] = None
    cache: Optional[str] = None  # the token cache's directory


@dataclass
class WandbInfo:
    """Where the W&B sink's records went (ablate/tracking/wandb_sink.py)."""

    mode: Optional[str] = None  # online | offline
    id: Optional[str] = None
    project: Optional[str] = None
    group: Optional[str] = None
    init_s: Optional[float] = None
    dir: Optional[str] = optional()  # offline: the folder `wandb sync` uploads
    url: Optional[str] = optional()  # online


def active_note(info: "RunInfo") -> str:
    """"; N active" where a token uses fewer parameters than the model has (an MoE), else ""."""
    active = info.active_params
    return "" if active is None or active == info.params else f"; {active:,} active"


# ---- groups flattened into summary.json ----------------------------------------------------------
@dataclass
class RunInfo:
    """What the launch built: the model's size and cost, the data, the device (the banner's)."""

    params: Optional[int] = None
    params_breakdown: Optional[ParamsBreakdown] = None
    non_embedding_params: Optional[int] = None
    active_params: Optional[int] = None  # the parameters one token uses (MoE: its k experts); = params when dense
    flops_per_token: Optional[int] = None
    vocab_size: Optional[int] = None
    tokenizer_vocab: Optional[int] = None
    data: Optional[DataInfo] = None
    world_size: Optional[int] = None
    device: Optional[str] = None
    precision: Optional[str] = None
    provenance: Optional[Provenance] = None
    compile: Optional[bool] = None
    compile_optimizer: Optional[bool] = None
    tokens_per_step: Optional[int] = None
    micro_batch: Optional[int] = None
    grad_accum_steps: Optional[int] = None
    warmup_steps: Optional[int] = None  # resolved when the run started (a resume keeps it)
    # The parametrization (axis `param`) and the base shape its rules are relative to (resolved:
    # the run's own width and depth when model.base_width / base_depth are null)
    param: Optional[str] = None
    base_width: Optional[int] = None
    base_depth: Optional[int] = None
    # the loss of predicting each token from its frequency in the training split alone (nats):
    # a run that ends there learned nothing else (ablate/run/collapse.py)
    unigram_loss: Optional[float] = None
    wandb: Optional[WandbInfo] = optional()


@dataclass
class BackendSettings:
    """What the trainer set on the backends (ablate.train.backends.configure_backends)."""

    deterministic: Optional[bool] = None
    flex_attention: Optional[bool] = optional()  # only when on
    sdpa_backend: Optional[str] = optional()  # only when not auto
    tf32: Optional[bool] = optional()  # CUDA only


@dataclass
class TrainResult:
    """What training measured by its end (final values; tokens/s is the steady state)."""

    tokens: Optional[int] = None
    train_loss: Optional[float] = None
    val_loss: Optional[float] = None
    val_bpb: Optional[float] = None
    tokens_per_s: Optional[float] = None
    skipped_steps: Optional[int] = None
    resumed_from: Optional[int] = None
    time_to_first_step_s: Optional[float] = None  # from the job's start to its first finished step
    compile_s: Optional[float] = None
    mfu: Optional[float] = None
    peak_flops: Optional[float] = None
    peak_flops_source: Optional[str] = None
    compile_fallback: Optional[bool] = None
    block_grad_norm: Optional[float] = None  # the blocks' raw gradient norm at the last step (0: none reached them)
    backend: BackendSettings = flat(BackendSettings)
    compile_fallback_reason: Optional[str] = optional()


@dataclass
class Outcome:
    """How training ended: the trainer's part of the record (Trainer.fit returns it)."""

    status: Status  # completed | diverged | interrupted | preempted
    reason: str  # why it ended there ("" when completed)
    step: int  # optimizer steps done
    steps: int  # train.steps
    result: TrainResult


@dataclass
class Process:
    """The process that runs the record's run: a reader tells a killed run by it (live_status).
    Left out once the run has ended."""

    pid: Optional[int] = None
    job: Optional[str] = None  # SLURM_JOB_ID: a requeued job replaces its own process


# ---- the record ----------------------------------------------------------------------------------
@dataclass
class RunRecord:
    """summary.json. Fields in the order they are written."""

    status: Status
    variant: Optional[str] = None
    axes: Optional[dict[str, str]] = None  # every axis's option
    seed: Optional[int] = None
    data_seed: Optional[int] = None
    overrides: Optional[list[str]] = None  # the overrides that name the variant
    sweep: Optional[str] = None
    process: Process = flat(Process)
    host: Optional[str] = None
    started: Optional[str] = None
    wall_time_s: Optional[float] = None  # every segment of a resumed run, summed
    previous_status: Optional[Status] = optional()  # the record this run re-entered
    extended_from: Optional[int] = optional()  # the steps an extended run had finished
    info: RunInfo = flat(RunInfo)
    reason: Optional[str] = optional()
    step: Optional[int] = optional()
    steps: Optional[int] = optional()
    result: TrainResult = flat(TrainResult)
    error: Optional[str] = optional()
    finished: Optional[str] = optional()

    def __post_init__(self) -> None:
        self.status = Status(self.status)

    def ended(self, outcome: Outcome) -> None:
        """Record how training ended."""
        self.status, self.reason, self.step, self.steps = (outcome.status, outcome.reason,
                                                           outcome.step, outcome.steps)
        self.result = outcome.result

    def metric(self, name: str) -> Optional[float]:
        """A metric's final value (ablate.names METRICS: val_loss, tokens_per_s, ...); None
        when the run has none."""
        if name not in METRICS:
            return None
        value = getattr(self.result, name, None)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def live_status(self) -> Status:
        """The status, except that a running record whose process is gone (SIGKILL, an OOM
        kill, a node failure) is KILLED."""
        if self.status != Status.RUNNING:
            return self.status
        who = {"pid": self.process.pid, "host": self.host, "job": self.process.job}
        return Status.KILLED if owner_alive(who) is False else self.status

    def to_json(self) -> dict:
        return to_plain(self)

    @classmethod
    def from_json(cls, data: Any) -> "RunRecord":
        """Raises RecordError for something that is not a run's record."""
        if not isinstance(data, dict) or "status" not in data:
            raise RecordError("not a run's record (no status)")
        try:
            record = _from_json(cls, data)
        except (TypeError, ValueError) as e:
            raise RecordError(str(e)) from None
        if record.axes is not None:  # an axis added after the run was recorded: it trained the default
            from ablate.config.axes import default_axes

            record.axes = {**default_axes(), **record.axes}
        return record

    def write(self, run_dir: Path) -> None:
        """summary.json, replaced whole (atomically): a reader never sees half of it."""
        write_json(Path(run_dir) / SUMMARY, self.to_json())


class RecordError(ValueError):
    """A summary.json that is not a run's record (no status, an unknown status, a wrong shape)."""


def read_record(run_dir: Path) -> Optional[RunRecord]:
    """The run directory's record; None when it has no readable one."""
    try:
        return RunRecord.from_json(read_json(Path(run_dir) / SUMMARY))
    except (OSError, ValueError):
        return None


def read_record_or_why(run_dir: Path) -> tuple[Optional[RunRecord], Optional[str]]:
    """(the record, None); (None, None) without summary.json; (None, why it cannot be read)."""
    path = Path(run_dir) / SUMMARY
    if not path.exists():
        return None, None
    try:
        return RunRecord.from_json(read_json(path)), None
    except (OSError, ValueError) as e:  # JSONDecodeError and RecordError are ValueErrors
        return None, (e.strerror if isinstance(e, OSError) and e.strerror else str(e)) or type(e).__name__


def live_status(run_dir: Path) -> Optional[Status]:
    """The record's live status (RunRecord.live_status); None without a readable record."""
    record = read_record(run_dir)
    return record.live_status() if record is not None else None


# ---- the one JSON mapping ------------------------------------------------------------------------
def to_plain(obj: Any) -> dict:
    """A record's dataclass as its JSON object (plain values: a status as its string)."""
    out: dict = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.metadata.get("flat"):
            out.update(to_plain(value) if known(value) else {})
        elif value is None and f.metadata.get("optional"):
            continue
        elif dataclasses.is_dataclass(value):
            out[f.name] = to_plain(value)
        else:
            out[f.name] = value.value if isinstance(value, Enum) else value
    return out


def known(group: Any) -> bool:
    """Whether any field of a group (its flattened groups' included) is known."""
    return any(known(v) if dataclasses.is_dataclass(v) else v is not None
               for v in (getattr(group, f.name) for f in dataclasses.fields(group)))


@functools.lru_cache(maxsize=None)
def _types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _dataclass_of(tp: Any) -> Optional[type]:
    """The dataclass inside Optional[...] (None for a plain value's type)."""
    args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
    return args[0] if len(args) == 1 and dataclasses.is_dataclass(args[0]) else None


def _from_json(cls: type, data: dict) -> Any:
    kwargs = {}
    for f in dataclasses.fields(cls):
        tp = _types(cls)[f.name]
        sub = _dataclass_of(tp)
        if f.metadata.get("flat"):
            kwargs[f.name] = _from_json(sub, data)  # its keys are the enclosing object's
        elif data.get(f.name) is not None:
            kwargs[f.name] = _value(tp, sub, data[f.name], f.name)
    return cls(**kwargs)


def _value(tp: Any, sub: Optional[type], value: Any, name: str) -> Any:
    if sub is not None:
        if not isinstance(value, dict):
            raise TypeError(f"{name}: expected an object, got {type(value).__name__}")
        return _from_json(sub, value)
    if Status in (tp, *typing.get_args(tp)):
        return Status(value)  # ValueError for a status this version does not know
    return value
