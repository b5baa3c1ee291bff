"""Read a W&B run file (`run-<id>.wandb`) back without the network.

wandb 0.31 dropped its Python reader (`wandb.sdk.internal.datastore`), so this is a small one.
The file is a LevelDB-style log: a 7-byte header (b":W&B", magic 0xBEE1 as u16 little-endian,
version 0), then 32 KiB blocks of records, each `<crc32 u32, length u16, type u8>` + payload,
where a payload longer than the block's space is split into FIRST/MIDDLE.../LAST pieces and a
block tail shorter than a record header is zero padding. The crc covers the type byte and the
payload. Joined payloads are `wandb.proto.wandb_internal_pb2.Record` messages.

Used by the tests and by anyone who wants an offline run's contents (`read_run`).
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from ablate.errors import AblateError

FILE_HEADER = struct.Struct("<4sHB")
IDENT, MAGIC, VERSION = b":W&B", 0xBEE1, 0
RECORD_HEADER = struct.Struct("<IHB")
BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


class WandbFileError(AblateError):
    """A file that is not a readable W&B run file."""


def iter_payloads(path: Path) -> Iterator[bytes]:
    """The raw record payloads, in order. A torn tail (the writer was killed) ends the iteration;
    a bad checksum before it is an error."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise WandbFileError(f"cannot read {path}: {e.strerror}") from None
    if len(data) < FILE_HEADER.size:
        raise WandbFileError(f"{path}: too short for a W&B run file")
    ident, magic, version = FILE_HEADER.unpack_from(data, 0)
    if ident != IDENT or magic != MAGIC or version != VERSION:
        raise WandbFileError(f"{path}: not a W&B run file (header {data[:7]!r})")
    pos, pieces = FILE_HEADER.size, []
    while pos < len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < RECORD_HEADER.size:  # zero padding up to the next block
            pos += left_in_block
            continue
        if pos + RECORD_HEADER.size > len(data):
            return
        crc, length, kind = RECORD_HEADER.unpack_from(data, pos)
        if crc == 0 and length == 0 and kind == 0:  # preallocated / padded tail
            pos += left_in_block
            continue
        start = pos + RECORD_HEADER.size
        payload = data[start:start + length]
        if len(payload) < length:
            return  # torn last record
        if zlib.crc32(bytes([kind]) + payload) != crc:
            raise WandbFileError(f"{path}: bad checksum in the record at byte {pos}")
        pos = start + length
        if kind == FULL:
            yield payload
        elif kind == FIRST:
            pieces = [payload]
        elif kind == MIDDLE:
            pieces.append(payload)
        elif kind == LAST:
            pieces.append(payload)
            yield b"".join(pieces)
            pieces = []
        else:
            raise WandbFileError(f"{path}: unknown record type {kind} at byte {pos}")


def iter_records(path: Path) -> Iterator[Any]:
    """`wandb_internal_pb2.Record` messages, in the order the run wrote them."""
    from wandb.proto import wandb_internal_pb2 as pb

    for payload in iter_payloads(path):
        record = pb.Record()
        record.ParseFromString(payload)
        yield record


def _items(items) -> dict:
    """W&B history/summary/config items: `key` or `nested_key` with a JSON value."""
    out = {}
    for it in items:
        key = it.key or "/".join(it.nested_key)
        try:
            out[key] = json.loads(it.value_json)
        except ValueError:
            out[key] = it.value_json
    return out


@dataclass
class WandbRun:
    """What a run file says: the run record's fields, its history rows and its summary."""

    id: str = ""
    name: str = ""
    project: str = ""
    entity: str = ""
    group: str = ""
    job_type: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)  # define_metric: name -> {step_metric, summary}
    exit_code: Optional[int] = None
    artifacts: list[dict] = field(default_factory=list)  # {name, type, aliases, files, metadata}


def read_run(path: Path) -> WandbRun:
    """Parse a `.wandb` file (or a run directory holding `wandb/*/run-*.wandb`: the latest)."""
    path = Path(path)
    if path.is_dir():
        path = find_run_file(path)
    run = WandbRun()
    for rec in iter_records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            r = rec.run
            run.id, run.name, run.project, run.entity = r.run_id, r.display_name, r.project, r.entity
            run.group, run.job_type, run.tags = r.run_group, r.job_type, list(r.tags)
            run.config.update({k: v.get("value", v) if isinstance(v, dict) else v
                               for k, v in _items(r.config.update).items()})
        elif kind == "config":
            run.config.update({k: v.get("value", v) if isinstance(v, dict) else v
                               for k, v in _items(rec.config.update).items()})
        elif kind == "history":
            run.history.append(_items(rec.history.item))
        elif kind == "summary":
            run.summary.update(_items(rec.summary.update))
        elif kind == "metric":
            m = rec.metric
            name = m.name or m.glob_name
            entry = run.metrics.setdefault(name, {})
            if m.step_metric:
                entry["step_metric"] = m.step_metric
            if m.HasField("summary"):
                entry["summary"] = [k for k in ("min", "max", "mean", "best", "last", "copy", "none", "first")
                                    if getattr(m.summary, k, False)]
        elif kind == "artifact":
            a = rec.artifact
            try:
                metadata = json.loads(a.metadata) if a.metadata else {}
            except ValueError:
                metadata = {}
            run.artifacts.append({"name": a.name, "type": a.type, "aliases": list(a.aliases),
                                  "files": [e.path for e in a.manifest.contents], "metadata": metadata})
        elif kind == "exit":
            run.exit_code = rec.exit.exit_code
    return run


def find_run_file(run_dir: Path) -> Path:
    """The newest `run-*.wandb` under a run directory's `wandb/` folder."""
    files = sorted(Path(run_dir).glob("wandb/*run-*/run-*.wandb"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise WandbFileError(f"no W&B run file under {Path(run_dir) / 'wandb'}")
    return files[-1]
