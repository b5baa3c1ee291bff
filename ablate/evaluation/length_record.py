"""A run's loss at other context lengths: `length_eval.json` in the run directory, written by
`ablate eval` and by train.eval_lengths at the end of training, read by `ablate compare`.

An additive record beside summary.json (a run's training results never change). Each result is
keyed by (length, stride, RoPE scaling): evaluating the same key again returns the stored result,
another key adds an entry. A result belongs to one step's weights: a run trained further is
evaluated again, and that result replaces the older one. A length the model cannot reach (a
learned position table past its rows) is a result too: status n/a with its reason.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Optional

from ablate.run.directory import read_json, write_json

LENGTH_EVAL = "length_eval.json"
VERSION = 1


class EvalStatus(str, Enum):
    OK = "ok"
    NOT_AVAILABLE = "n/a"  # the model cannot be evaluated at this length (reason says why)

    __str__ = str.__str__
    __format__ = str.__format__


@dataclass(frozen=True, order=True)
class EvalKey:
    length: int  # tokens of context per window
    stride: Optional[int] = None  # None: non-overlapping windows; S: sliding, the last S tokens scored
    rope_scaling: Optional[str] = None  # "pi:2.0" or "ntk:4.0" (RoPE only), None: as trained

    @property
    def protocol(self) -> str:
        """How the windows are read, for a table's title: `windows`, `stride 128`, `+ pi:2.0`."""
        text = "windows" if self.stride is None else f"stride {self.stride}"
        return text + (f", rope {self.rope_scaling}" if self.rope_scaling else "")


@dataclass
class LengthResult:
    key: EvalKey
    status: EvalStatus
    loss: Optional[float] = None  # mean next-token cross-entropy (nats) over the scored tokens
    bpb: Optional[float] = None  # bits per byte of the same tokens
    scored_tokens: int = 0  # the same validation tokens at every length and protocol
    step: Optional[int] = None  # the checkpoint's step (the run's final weights)
    reason: Optional[str] = None  # why n/a, one line

    def to_json(self) -> dict:
        out = asdict(self.key) | {k: v for k, v in asdict(self).items() if k != "key"}
        out["status"] = self.status.value
        return out

    @classmethod
    def from_json(cls, d: dict) -> "LengthResult":
        key = EvalKey(int(d["length"]), d.get("stride"), d.get("rope_scaling"))
        return cls(key, EvalStatus(d["status"]), d.get("loss"), d.get("bpb"), int(d.get("scored_tokens", 0)),
                   d.get("step"), d.get("reason"))


@dataclass
class LengthRecord:
    train_seq_len: int  # the length the run trained at: the report marks every length beyond it
    results: list[LengthResult] = field(default_factory=list)

    def get(self, key: EvalKey) -> Optional[LengthResult]:
        return next((r for r in self.results if r.key == key), None)

    def add(self, result: LengthResult) -> None:
        """A new key's result; a stored key keeps its stored result (results never change)."""
        if self.get(result.key) is None:
            self.results.append(result)
            self.results.sort(key=lambda r: (r.key.stride or 0, r.key.rope_scaling or "", r.key.length))

    def put(self, result: LengthResult) -> None:
        """The result of the run's current weights: it replaces a stored result of the same key
        only when that one came from other weights (a step before the run was trained further)."""
        stored = self.get(result.key)
        if stored is not None and stored.step != result.step:
            self.results.remove(stored)
        self.add(result)

    def to_json(self) -> dict:
        return {"version": VERSION, "train_seq_len": self.train_seq_len,
                "results": [r.to_json() for r in self.results]}

    @classmethod
    def from_json(cls, d: dict) -> "LengthRecord":
        return cls(int(d["train_seq_len"]), [LengthResult.from_json(r) for r in d.get("results", [])])


def read_lengths(run_dir: Path) -> Optional[LengthRecord]:
    """The run's record; None without one. ValueError, KeyError or TypeError for a damaged one
    (read_lengths_checked says it in one line)."""
    path = Path(run_dir) / LENGTH_EVAL
    return LengthRecord.from_json(read_json(path)) if path.exists() else None


def read_lengths_checked(run_dir: Path) -> Optional[LengthRecord]:
    """read_lengths, with a damaged record refused in one line (RunDirError) that says how to go on."""
    from ablate.errors import RunDirError

    try:
        return read_lengths(run_dir)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        path = Path(run_dir) / LENGTH_EVAL
        why = f"no {e}" if isinstance(e, KeyError) else (str(e) or type(e).__name__)
        raise RunDirError(f"{path}: unreadable ({why}); move it aside and evaluate again, which writes a new one: "
                          f"`mv {path} {path}.bad`") from None


def write_lengths(run_dir: Path, record: LengthRecord) -> None:
    """Atomic: a reader sees the old record or the new one, never half of one."""
    write_json(Path(run_dir) / LENGTH_EVAL, record.to_json())
