"""Reading run directories for the analysis: summary.json, config.yaml and metrics.jsonl are
the source of truth (nothing here touches the trainer or W&B). A `Run` is one directory; its
`variant_key` is its config minus seeds and keys that never name a variant (ablate.names)."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ablate.errors import AblateError
from ablate.run.record import RunRecord
from ablate.run.directory import CONFIG, METRICS, SUMMARY
from ablate.names import Status, names_variant


class CompareError(AblateError):
    """Nothing to compare, or a request the runs cannot answer."""


def print_warning(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def number(v: Any) -> Optional[float]:
    """A metric value as a float; JSON NaN/inf are written as strings ("nan", "inf")."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def read_metrics(path: Path, warn: Callable[[str], None] = print_warning) -> list[dict]:
    """metrics.jsonl rows. A torn last line (the run was killed mid-write) is skipped with one
    warning; unreadable lines elsewhere are skipped and counted in one warning too."""
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    rows, bad = [], []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            bad.append(i)
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad.append(i)
    if bad == [len(lines) - 1]:
        warn(f"{path}: skipped a truncated last line (the run was stopped while writing it)")
    elif bad:
        warn(f"{path}: skipped {len(bad)} unreadable line(s) (first at line {bad[0] + 1})")
    return rows


def flatten(d: Any, prefix: str = "") -> dict:
    if not isinstance(d, dict):
        return {prefix.rstrip("."): d}
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@dataclass
class Run:
    dir: Path
    record: RunRecord  # summary.json
    config: dict  # flattened config.yaml; {} when missing
    rows: list[dict]
    status: Status  # the record's live status (a running record whose process is gone: killed)

    @cached_property
    def summary(self) -> dict:
        """summary.json's keys and values, for a key the user names (--metric, --where)."""
        return self.record.to_json()

    @property
    def seed(self) -> tuple:
        return (self.record.seed, self.record.data_seed)

    def variant_key(self) -> tuple:
        if self.config:
            return tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in self.config.items()
                                if names_variant(k)))
        return (("variant", self.record.variant or str(self.dir)),)

    def value(self, metric: str) -> Optional[float]:
        """The run's final value of `metric`: summary.json's, else the last logged one."""
        v = number(self.summary.get(metric))
        if v is not None:
            return v
        for row in reversed(self.rows):
            if metric in row:
                return number(row[metric])
        return None

    def metric_names(self) -> set[str]:
        names = {k for k, v in self.summary.items() if number(v) is not None}
        for row in self.rows:
            names.update(row)
        return names - {"step", "steps", "seed", "data_seed", "pid", "vocab_size", "tokenizer_vocab",
                        "world_size", "skipped_steps"}


def find_runs(paths: Sequence[Path | str], warn: Callable[[str], None] = print_warning) -> list[Run]:
    """Every run directory (a directory holding summary.json) under the given paths."""
    import yaml

    if not paths:
        raise CompareError("give at least one run or sweep directory")
    dirs: dict[Path, None] = {}
    for p in map(Path, paths):
        if not p.exists():
            raise CompareError(f"{p}: no such file or directory")
        if p.is_file():
            p = p.parent if p.name in (SUMMARY, METRICS, CONFIG) else p
            if p.is_file():
                raise CompareError(f"{p}: not a directory (give a run or sweep directory)")
        found = [s.parent for s in p.rglob(SUMMARY)] if not (p / SUMMARY).is_file() else [p]
        if not found:
            raise CompareError(f"{p}: no runs found (a run directory holds {SUMMARY})")
        for d in sorted(found, key=natural):
            dirs.setdefault(d.resolve(), None)
    runs = []
    for d in dirs:
        try:
            record = RunRecord.from_json(json.loads((d / SUMMARY).read_text(encoding="utf-8")))
        except (OSError, ValueError) as e:
            warn(f"{d / SUMMARY}: unreadable ({e}); run skipped")
            continue
        config = {}
        if (d / CONFIG).is_file():
            try:
                config = flatten(yaml.safe_load((d / CONFIG).read_text(encoding="utf-8")) or {})
            except (OSError, yaml.YAMLError):
                warn(f"{d / CONFIG}: unreadable; the run is grouped by its variant name")
        runs.append(Run(d, record, config, read_metrics(d / METRICS, warn), record.live_status()))
    if not runs:
        raise CompareError(f"no readable runs under {', '.join(map(str, paths))}")
    return runs


def natural(p: Path) -> list:
    """Sort 2_x before 10_x (sweep job numbers)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(p))]
