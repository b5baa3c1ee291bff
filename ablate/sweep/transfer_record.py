"""transfer.json: the record of an --lr-grid or a --ladder sweep, typed, and written and read here
only (ablate/sweep/transfer_plan.py makes it before the first job; `ablate compare` and the end of
the sweep read it to choose the transfer report, ablate/analysis/transfer_report.py).

Its JSON is what the sweep has always written, key for key and in that order:

  lr_grid  {"kind", "grid", "seeds", "shared_lr"}, then "tied_lrs" where a variant has any
  ladder   {"kind", "ladder", "rungs", "seeds"}, then "tied_lrs" where a variant has any and,
           with an LR grid, "grid" last

`ladder` is the ladder as the sweep ran it (the file and the `ladder.KEY=VALUE` settings; its
`base_depth` and `steps` left out while unset, as a record from before they existed has them);
`rungs` is what each rung trains (the baseline's non-embedding params, steps, tokens, LR). A
record from an older version reads with those fields None. `tied_lrs` is {variant: {key: its
value / train.lr}}: the LRs that moved with train.lr in each of that variant's jobs (optim.adam_lr
under optim=muon optim.adjust=original, ablate/sweep/transfer_plan.py); a sweep without any writes
no such key, so its file is what it was before the optim axis.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any, Mapping, Optional

from ablate.errors import AblateError
from ablate.run.directory import TRANSFER, read_json, write_json

LADDER_KEYS = ("model.d_model", "model.n_layers", "model.n_heads")
BASE_KEYS = ("model.base_width", "model.base_depth")  # the reference shape of param=mup, completep


class TransferKind(str, Enum):
    LR_GRID = "lr_grid"  # every variant at each grid LR, then its seeds at its own best LR
    LADDER = "ladder"  # every variant on every rung of a model ladder (with an LR grid, or not)

    __str__ = str.__str__


class LrRule(str, Enum):
    """How a ladder's LR changes from rung to rung."""

    WIDTH = "width"  # base_lr * base_width / d_model: wider models take smaller steps
    FIXED = "fixed"  # base_lr on every rung
    MUP = "mup"  # base_lr on every rung, param=mup / completep scaling each layer's LR from the base shape

    __str__ = str.__str__


class TransferRecordError(AblateError):
    """A transfer.json that is not an --lr-grid or --ladder record."""


@dataclass(frozen=True)
class Rung:
    name: str
    d_model: int
    n_layers: int
    n_heads: int

    def overrides(self) -> list[str]:
        return [f"{k}={v}" for k, v in zip(LADDER_KEYS, (self.d_model, self.n_layers, self.n_heads))]


@dataclass(frozen=True)
class Ladder:
    """A named model ladder. tokens_per_param: training tokens per non-embedding parameter of
    the baseline at each rung (every variant trains on the same tokens); or steps: the same
    steps on every rung (a width ladder measuring LR transfer, as muP's figures fix the steps).
    base_lr is the LR at the base shape, base_width x base_depth (None: the smallest rung's);
    lr_rule says how the LR follows the rungs (LrRule)."""

    name: str
    rungs: tuple[Rung, ...]
    tokens_per_param: Optional[float]
    base_lr: float
    base_width: Optional[int] = None
    lr_rule: LrRule = LrRule.WIDTH
    warmup_fraction: float = 0.1  # of each rung's steps
    base_depth: Optional[int] = None
    steps: Optional[int] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "lr_rule", LrRule(self.lr_rule))

    @classmethod
    def from_dict(cls, name: str, doc: dict) -> "Ladder":
        """A ladder file's keys (conf/ladder/NAME.yaml) or the record's `ladder` object; KeyError,
        TypeError or ValueError for one that is not a ladder."""
        rungs = tuple(Rung(str(r["name"]), int(r["d_model"]), int(r["n_layers"]), int(r["n_heads"]))
                      for r in doc["rungs"])
        return cls(name, rungs, _maybe(float, doc.get("tokens_per_param")), float(doc["base_lr"]),
                   _maybe(int, doc.get("base_width")), LrRule(doc.get("lr_rule", "width")),
                   float(doc.get("warmup_fraction", 0.1)), _maybe(int, doc.get("base_depth")),
                   _maybe(int, doc.get("steps")))

    @property
    def base(self) -> tuple[int, int]:
        """(width, depth) of the base shape: the file's, else the smallest rung's."""
        return self.base_width or self.rungs[0].d_model, self.base_depth or self.rungs[0].n_layers

    def warmup(self, steps: int) -> int:
        return math.ceil(self.warmup_fraction * steps)

    def lr(self, rung: Rung) -> float:
        lr = self.base_lr * self.base[0] / rung.d_model if self.lr_rule is LrRule.WIDTH else self.base_lr
        return float(f"{lr:.3g}")

    def rung_steps(self, params: int, tokens_per_step: int, tokens_per_param: Optional[float] = None) -> int:
        """A rung's steps: a variant's own tokens per parameter, else the ladder's steps or its
        tokens per parameter of the baseline's `params`."""
        if tokens_per_param is None and self.steps is not None:
            return self.steps
        return max(1, math.ceil((tokens_per_param or self.tokens_per_param) * params / tokens_per_step))

    def base_overrides(self) -> list[str]:
        """What each job of a variant with a base shape (param=mup, completep) trains with."""
        return [f"{k}={v}" for k, v in zip(BASE_KEYS, self.base)]


@dataclass(frozen=True)
class RungPlan:
    """What one rung of the sweep trains: its shape, the baseline's non-embedding parameters
    there, and the steps, tokens and LR that follow from the ladder's rules."""

    name: str
    d_model: int
    n_layers: int
    n_heads: int
    params: int
    steps: int
    tokens: int
    lr: float


@dataclass(frozen=True)
class TransferRecord:
    """transfer.json. seeds: an LR grid's (and a ladder-with-grid's) seeds at each best LR, at
    least 1; a plain ladder's --seeds as given (0: not given, one run per variant and rung)."""

    kind: TransferKind
    seeds: int
    grid: tuple[float, ...] = ()  # the LR grid; empty for a ladder without one
    shared_lr: Optional[float] = None  # an LR grid's: the config's train.lr, where "shared Δ" compares
    ladder: Optional[Ladder] = None  # a ladder's
    rungs: tuple[RungPlan, ...] = ()  # a ladder's, smallest first
    # variant -> {key: its value / train.lr}: the LRs each of its jobs moved with train.lr
    tied_lrs: Mapping[str, Mapping[str, float]] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", TransferKind(self.kind))
        object.__setattr__(self, "tied_lrs", {str(v): {str(k): float(r) for k, r in tied.items()}
                                              for v, tied in (self.tied_lrs or {}).items()})

    @classmethod
    def lr_grid(cls, grid: Any, seeds: int, shared_lr: float,
                tied_lrs: Optional[Mapping[str, Mapping[str, float]]] = None) -> "TransferRecord":
        return cls(TransferKind.LR_GRID, seeds, tuple(grid), shared_lr, tied_lrs=tied_lrs or {})

    @classmethod
    def of_ladder(cls, ladder: Ladder, rungs: Any, seeds: int, grid: Any = (),
                  tied_lrs: Optional[Mapping[str, Mapping[str, float]]] = None) -> "TransferRecord":
        return cls(TransferKind.LADDER, seeds, tuple(grid), ladder=ladder, rungs=tuple(rungs),
                   tied_lrs=tied_lrs or {})

    def with_grid(self, grid: Any, seeds: int) -> "TransferRecord":
        return replace(self, grid=tuple(grid), seeds=seeds)

    @property
    def one_scan(self) -> bool:
        """A ladder under lr_rule mup with a grid: one LR scan, at the smallest rung."""
        return bool(self.grid) and self.ladder is not None and self.ladder.lr_rule is LrRule.MUP

    # ---- the one JSON mapping --------------------------------------------------------------------
    def to_json(self) -> dict:
        tied = {"tied_lrs": {v: dict(t) for v, t in self.tied_lrs.items()}} if self.tied_lrs else {}
        if self.kind is TransferKind.LR_GRID:
            return {"kind": self.kind.value, "grid": list(self.grid), "seeds": self.seeds, "shared_lr": self.shared_lr,
                    **tied}
        out = {"kind": self.kind.value, "ladder": _ladder_json(self.ladder),
               "rungs": [asdict(r) for r in self.rungs], "seeds": self.seeds, **tied}
        return {**out, "grid": list(self.grid)} if self.grid else out

    @classmethod
    def from_json(cls, data: Any) -> "TransferRecord":
        """ValueError (TypeError, KeyError) for something that is not a transfer record."""
        if not isinstance(data, dict):
            raise TypeError(f"expected an object, got {type(data).__name__}")
        kind = TransferKind(data["kind"])
        grid = tuple(float(x) for x in data.get("grid") or ())
        tied = data.get("tied_lrs") or {}
        if not isinstance(tied, dict) or not all(isinstance(t, dict) for t in tied.values()):
            raise TypeError("tied_lrs must map each variant to {key: ratio to train.lr}")
        if kind is TransferKind.LR_GRID:
            shared = data.get("shared_lr")
            return cls.lr_grid(grid, int(data["seeds"]), None if shared is None else float(shared), tied)
        ladder = Ladder.from_dict(str(data["ladder"]["name"]), data["ladder"])
        return cls.of_ladder(ladder, (RungPlan(**r) for r in data["rungs"]), int(data["seeds"]), grid, tied)

    def write(self, sweep_dir: Path) -> None:
        write_json(Path(sweep_dir) / TRANSFER, self.to_json())


def _maybe(kind: Any, value: Any) -> Any:
    return None if value is None else kind(value)


def _ladder_json(ladder: Optional[Ladder]) -> dict:
    out = {"name": ladder.name, "rungs": [asdict(r) for r in ladder.rungs],
           "tokens_per_param": ladder.tokens_per_param, "base_lr": ladder.base_lr,
           "base_width": ladder.base_width, "lr_rule": ladder.lr_rule.value,
           "warmup_fraction": ladder.warmup_fraction}
    # unset: left out, as the record of a ladder that had no such key
    return {**out, **{k: v for k, v in (("base_depth", ladder.base_depth), ("steps", ladder.steps)) if v is not None}}


def read_transfer(sweep_dir: Path) -> Optional[TransferRecord]:
    """A sweep directory's transfer.json; None when it has none (an ordinary sweep).
    TransferRecordError for one that is not a record (a corrupt or foreign file)."""
    path = Path(sweep_dir) / TRANSFER
    if not path.is_file():
        return None
    try:
        return TransferRecord.from_json(read_json(path))
    except (OSError, ValueError, TypeError, KeyError) as e:
        why = f"no key {e}" if isinstance(e, KeyError) else str(e) or type(e).__name__
        raise TransferRecordError(f"{path} is not an --lr-grid or --ladder sweep's record ({why}); "
                                  "restore it, or delete it to compare the runs as an ordinary sweep") from None
