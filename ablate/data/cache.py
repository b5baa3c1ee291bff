"""Tokenize once into flat token files (train.bin, val.bin) plus meta.json, in a cache
directory keyed by a hash of (source, tokenizer, settings).

Writes go to a temporary directory that is renamed into place under a file lock, so two
processes preparing the same data never corrupt or duplicate it, and a crash leaves nothing
half-written that a later run could mistake for a cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ablate.data.sources import iter_documents
from ablate.data.tokenizers import Tokenizer
from ablate.errors import DataError

FORMAT_VERSION = 1
_BATCH_DOCS = 256


def default_cache_root() -> Path:
    return Path(os.environ.get("ABLATE_CACHE", Path.home() / ".cache" / "ablate")) / "data"


def cache_key(data_cfg: Any, tokenizer_name: str) -> dict:
    """Everything that changes the tokens; its hash names the cache directory."""
    return {
        "format": FORMAT_VERSION, "source": data_cfg.name, "tokenizer": tokenizer_name,
        "paths": [str(Path(os.path.expanduser(str(p))).resolve()) for p in (data_cfg.paths or [])],
        "hf_path": data_cfg.hf_path, "hf_name": data_cfg.hf_name, "hf_split": data_cfg.hf_split,
        "text_field": data_cfg.text_field, "max_tokens": data_cfg.max_tokens,
        "val_fraction": data_cfg.val_fraction,
    }


def cache_dir_for(data_cfg: Any, tokenizer_name: str) -> Path:
    key = cache_key(data_cfg, tokenizer_name)
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    root = Path(os.path.expanduser(data_cfg.cache_dir)) if data_cfg.cache_dir else default_cache_root()
    return root / f"{data_cfg.name}-{tokenizer_name}-{digest}"


@dataclass
class TokenData:
    train: np.ndarray  # flat token ids (memmap)
    val: np.ndarray
    meta: dict
    path: Path


def load(path: Path) -> TokenData:
    meta = json.loads((path / "meta.json").read_text())
    dtype = np.dtype(meta["dtype"])
    return TokenData(
        train=np.memmap(path / "train.bin", dtype=dtype, mode="r"),
        val=np.memmap(path / "val.bin", dtype=dtype, mode="r"),
        meta=meta, path=path)


def is_complete(path: Path) -> bool:
    return (path / "meta.json").is_file()


def _batched(it: Iterator[str], n: int) -> Iterator[list[str]]:
    batch = []
    for x in it:
        batch.append(x)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def _tokenize_to(tmp: Path, data_cfg: Any, tok: Tokenizer, progress: bool) -> dict:
    dtype = np.uint16 if tok.vocab_size <= 2**16 else np.uint32
    threads = data_cfg.num_proc or os.cpu_count() or 1
    max_tokens = data_cfg.max_tokens
    chunks: list[np.ndarray] = []
    n_tokens, n_docs, n_bytes = 0, 0, 0
    bar = _progress(progress, f"tokenizing {data_cfg.name} with {tok.name}")
    for docs in _batched(iter_documents(data_cfg), _BATCH_DOCS):
        docs = [d for d in docs if d]
        for ids in tok.encode_batch(docs, num_threads=threads):
            arr = np.asarray(ids + [tok.eot_id], dtype=dtype)  # end-of-text after each document
            chunks.append(arr)
            n_tokens += arr.size
        n_docs += len(docs)
        n_bytes += sum(len(d.encode("utf-8")) for d in docs)
        if bar is not None:
            bar.update(sum(len(d) for d in docs))
        if max_tokens and n_tokens >= max_tokens:
            break
    if bar is not None:
        bar.close()
    if n_tokens == 0:
        raise DataError(f"data={data_cfg.name}: the corpus is empty (no text found)")
    tokens = np.concatenate(chunks)
    if max_tokens:
        tokens = tokens[:max_tokens]
    # Contiguous tail split: training windows never overlap validation text.
    n_val = max(2, int(len(tokens) * data_cfg.val_fraction))
    train, val = tokens[:-n_val], tokens[-n_val:]
    train.tofile(tmp / "train.bin")
    val.tofile(tmp / "val.bin")
    lengths = tok.token_byte_lengths()
    return {
        "source": data_cfg.name, "tokenizer": tok.name, "vocab_size": tok.vocab_size,
        "eot_id": tok.eot_id, "dtype": np.dtype(dtype).name, "documents": n_docs,
        "tokens": {"train": int(train.size), "val": int(val.size)},
        "bytes": {"train": int(lengths[train].sum()), "val": int(lengths[val].sum())},
        "source_bytes": n_bytes, "key": cache_key(data_cfg, tok.name),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def _progress(enabled: bool, desc: str):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(desc=desc, unit="char", unit_scale=True, leave=False, mininterval=0.5)


def prepare(data_cfg: Any, tok: Tokenizer, progress: bool = True) -> tuple[TokenData, bool]:
    """Return the cached token data, tokenizing first if needed. Second value: built now?"""
    from filelock import FileLock

    path = cache_dir_for(data_cfg, tok.name)
    if is_complete(path):
        return load(path), False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create the data cache directory {path.parent}: {e.strerror}") from None
    with FileLock(str(path) + ".lock"):
        if is_complete(path):  # another process built it while we waited
            return load(path), False
        tmp = Path(tempfile.mkdtemp(prefix=path.name + ".tmp-", dir=path.parent))
        try:
            meta = _tokenize_to(tmp, data_cfg, tok, progress)
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
            if path.exists():  # an incomplete leftover without meta.json
                shutil.rmtree(path)
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return load(path), True
