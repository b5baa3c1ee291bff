"""Tokenize once into flat token files (train.bin, val.bin) plus meta.json, in a cache
directory keyed by a hash of (source, tokenizer, settings, source fingerprint).

Writes go to a temporary directory that is renamed into place under a file lock, so two
processes preparing the same data never corrupt or duplicate it (the second waits, then reuses
the first one's cache), and a crash leaves nothing half-written that a later run could mistake
for a cache: a directory is a cache only once its meta.json exists, and meta.json is written
before the rename. The cache also keeps each token id's byte length (token_bytes.npy, for
val_bpb), so training from it needs no tokenizer files; only tokenizing does.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

from ablate.data.sources import get_source
from ablate.data.tokenizers import Tokenizer
from ablate.errors import ConfigError, DataError

FORMAT_VERSION = 2
_BATCH_DOCS = 1024  # documents handed to the tokenizer's threads at once ...
_BATCH_BYTES = 2 << 20  # ... or this much text, whichever comes first
_COPY_CHUNK = 1 << 24  # tokens per read when the validation tail is copied out
META = "meta.json"
BYTE_LENGTHS = "token_bytes.npy"  # UTF-8 bytes per token id (older caches lack it)


def default_cache_root() -> Path:
    return Path(os.environ.get("ABLATE_CACHE", Path.home() / ".cache" / "ablate")) / "data"


def cache_root(data_cfg: Any) -> Path:
    return Path(os.path.expanduser(data_cfg.cache_dir)) if data_cfg.cache_dir else default_cache_root()


def cache_key(data_cfg: Any, tokenizer_name: str) -> dict:
    """Everything that changes the tokens; its hash names the cache directory."""
    return {
        "format": FORMAT_VERSION, "source": data_cfg.name, "tokenizer": tokenizer_name,
        "hf_path": data_cfg.hf_path, "hf_name": data_cfg.hf_name, "hf_split": data_cfg.hf_split,
        "text_field": data_cfg.text_field, "max_tokens": data_cfg.max_tokens,
        "val_fraction": data_cfg.val_fraction,
        **get_source(data_cfg).fingerprint(data_cfg),  # file sizes/mtimes, package version, ...
    }


def cache_dir_for(data_cfg: Any, tokenizer_name: str) -> Path:
    key = cache_key(data_cfg, tokenizer_name)
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root(data_cfg) / f"{data_cfg.name}-{tokenizer_name}-{digest}"


@dataclass
class TokenData:
    train: np.ndarray  # flat token ids (read-only memmap)
    val: np.ndarray
    meta: dict
    path: Path
    byte_lengths: Optional[np.ndarray] = None  # UTF-8 bytes per token id (None: an older cache)


def check_one_batch(n_train: int, batch_size: int, seq_len: int) -> None:
    """The training split holds one batch of windows (each seq_len + 1 tokens long)."""
    need = batch_size * seq_len + 1
    if n_train < need:
        raise DataError(
            f"the training split has {n_train} tokens, fewer than one batch of "
            f"train.batch_size={batch_size} x train.seq_len={seq_len} (+1) = {need}; "
            "use more data or a smaller batch")


def _unreadable(path: Path) -> DataError:
    return DataError(f"the data cache {path} exists but this user cannot read it (permission denied): "
                     f"ask its owner to run `chmod -R a+rX {path}`, or set data.cache_dir to a "
                     "directory of your own")


def is_complete(path: Path) -> bool:
    try:
        return (path / META).is_file()
    except PermissionError:  # another user's cache we cannot enter: prepare() says so
        return False


def load(path: Path) -> TokenData:
    try:
        meta = json.loads((path / META).read_text())
        dtype = np.dtype(meta["dtype"])
        splits = {}
        for split in ("train", "val"):
            f = path / f"{split}.bin"
            if f.stat().st_size != meta["tokens"][split] * dtype.itemsize:
                raise ValueError(f"{f.name} has the wrong size")
            splits[split] = np.memmap(f, dtype=dtype, mode="r")
        lengths = None
        if meta.get("byte_lengths"):
            lengths = np.load(path / meta["byte_lengths"], allow_pickle=False)
            if lengths.shape != (meta["vocab_size"],):
                raise ValueError(f"{meta['byte_lengths']} has the wrong shape")
    except PermissionError:
        raise _unreadable(path) from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"the data cache {path} is corrupt ({e}); delete it and prepare again") from None
    return TokenData(train=splits["train"], val=splits["val"], meta=meta, path=path, byte_lengths=lengths)


def num_threads(data_cfg: Any) -> int:
    if data_cfg.num_proc and data_cfg.num_proc > 0:
        return int(data_cfg.num_proc)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def _batched(docs: Iterator[str]) -> Iterator[list[str]]:
    batch, size = [], 0
    for d in docs:
        if not d:
            continue
        batch.append(d)
        size += len(d)
        if len(batch) == _BATCH_DOCS or size >= _BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _prefetch(batches: Iterator[list[str]], depth: int = 2) -> Iterator[list[str]]:
    """Read and clean the next batches in a thread while the current one is tokenized
    (tiktoken releases the GIL), so reading and tokenizing overlap. Errors are re-raised here."""
    import queue
    import threading

    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def produce():
        try:
            for b in batches:
                while not stop.is_set():
                    try:
                        q.put(b, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as e:  # handed to the consumer, raised in its thread
            q.put(e)

    thread = threading.Thread(target=produce, name="ablate-data-reader", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()  # the consumer stopped early (max_tokens, an error): let the reader finish
        thread.join(timeout=5)


class _Progress:
    """Tokenizing, as a person reads it on stderr. On a terminal: a tqdm bar (tokens against
    data.max_tokens when set, else text bytes) whose last frame stays with the final counts. Off
    a terminal (a log file, a pipe): a plain start line and a done line, no `\\r` frames."""

    def __init__(self, enabled: bool, desc: str, max_tokens: Optional[int]):
        self.bar, self.by_tokens, self.desc = None, bool(max_tokens), desc
        self.lines = enabled and not sys.stderr.isatty()
        self.started = time.perf_counter()
        if self.lines:
            print(f"{desc} ...", file=sys.stderr, flush=True)
        elif enabled:
            from tqdm import tqdm

            self.bar = tqdm(desc=desc, total=max_tokens or None, unit="tok" if max_tokens else "B",
                            unit_scale=True, unit_divisor=1000, mininterval=0.5, file=sys.stderr)

    def update(self, n_bytes: int, n_tokens: int) -> None:
        if self.bar is not None:
            self.bar.update(n_tokens if self.by_tokens else n_bytes)

    def close(self, n_bytes: int, n_tokens: int, n_docs: int) -> None:
        if self.bar is not None:
            self.bar.close()  # its last frame: the counts at the end
        if self.lines:
            print(f"{self.desc}: done, {n_bytes:,} bytes of text in {n_docs:,} documents -> "
                  f"{n_tokens:,} tokens ({time.perf_counter() - self.started:.1f} s)",
                  file=sys.stderr, flush=True)


def _split_tail(tmp: Path, all_path: Path, n_tokens: int, dtype, lengths, data_cfg: Any) -> tuple[int, int, int]:
    """Cut the contiguous tail off as the validation split (training windows never overlap the
    validation text): train.bin and val.bin in `tmp`. Returns (train tokens, val tokens, val bytes)."""
    n_val = max(2, int(n_tokens * data_cfg.val_fraction))
    n_train = n_tokens - n_val
    if n_train < 2:
        raise DataError(f"data={data_cfg.name}: the corpus has only {n_tokens} tokens, too few to "
                        "split into training and validation; add data")
    tokens = np.memmap(all_path, dtype=dtype, mode="r")
    val_bytes = 0
    with (tmp / "val.bin").open("wb") as out:  # in chunks: a 5% tail can be gigabytes
        for i in range(n_train, n_tokens, _COPY_CHUNK):
            part = np.asarray(tokens[i:min(i + _COPY_CHUNK, n_tokens)])
            part.tofile(out)
            val_bytes += int(lengths[part].sum())
    del tokens
    os.truncate(all_path, n_train * dtype.itemsize)
    os.replace(all_path, tmp / "train.bin")
    return n_train, n_val, val_bytes


def _tokenize_to(tmp: Path, data_cfg: Any, tok: Tokenizer, progress: bool) -> dict:
    """Stream documents -> token ids with an end-of-text after each document, appended to one
    file (memory stays bounded); then cut the contiguous tail off as the validation split."""
    dtype = np.dtype(np.uint16 if tok.vocab_size <= 2**16 else np.uint32)
    threads = num_threads(data_cfg)
    max_tokens = data_cfg.max_tokens
    eot = np.asarray([tok.eot_id], dtype=dtype)
    lengths = tok.token_byte_lengths()
    n_tokens = n_docs = n_text_bytes = 0
    total_bytes = 0  # UTF-8 bytes the kept tokens stand for
    truncated = False  # text was left out because of data.max_tokens
    bar = _Progress(progress, f"tokenizing {data_cfg.name} with {tok.name}", max_tokens)
    t0 = time.perf_counter()
    all_path = tmp / "tokens.bin"
    with all_path.open("wb") as out:
        for docs in _prefetch(_batched(get_source(data_cfg).documents(data_cfg))):
            if max_tokens and n_tokens >= max_tokens:  # exactly full, and there is more text
                truncated = True
                break
            arrays = tok.encode_arrays(docs, threads, dtype)
            chunk = np.concatenate([x for a in arrays for x in (a, eot)])
            if max_tokens and n_tokens + chunk.size > max_tokens:
                chunk = chunk[:max_tokens - n_tokens]
                truncated = True
            chunk.tofile(out)
            n_tokens += chunk.size
            total_bytes += int(np.bincount(chunk, minlength=len(lengths)) @ lengths)
            n_docs += len(docs)
            batch_bytes = sum(len(d.encode("utf-8")) for d in docs)
            n_text_bytes += batch_bytes
            bar.update(batch_bytes, chunk.size)
            if truncated:
                break
    seconds = time.perf_counter() - t0
    bar.close(n_text_bytes, n_tokens, n_docs)
    if n_docs == 0:
        raise DataError(f"data={data_cfg.name}: the corpus is empty (no text found)")
    n_train, n_val, val_bytes = _split_tail(tmp, all_path, n_tokens, dtype, lengths, data_cfg)
    np.save(tmp / BYTE_LENGTHS, lengths)
    return {
        "source": data_cfg.name, "tokenizer": tok.name, "vocab_size": tok.vocab_size,
        "eot_id": tok.eot_id, "dtype": dtype.name, "documents": n_docs,
        "tokens": {"train": int(n_train), "val": int(n_val)},
        "bytes": {"train": total_bytes - val_bytes, "val": val_bytes},
        "split": {"method": "contiguous tail", "val_fraction": data_cfg.val_fraction},
        "byte_lengths": BYTE_LENGTHS, "source_bytes": n_text_bytes, "truncated": truncated,
        "tokenize_s": round(seconds, 3), "threads": threads,
        "mb_per_s": round(n_text_bytes / 1e6 / max(seconds, 1e-9), 2),
        "key": cache_key(data_cfg, tok.name), "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def prepare(data_cfg: Any, tok: Tokenizer, progress: bool = True,
            wait_message: bool = True) -> tuple[TokenData, bool]:
    """Return the cached token data, tokenizing first if needed. Second value: built now?
    The tokenizer takes its byte lengths from the cache (no encoding files needed to train)."""
    data, built = _prepare(data_cfg, tok, progress, wait_message)
    if data.byte_lengths is not None:
        tok.use_byte_lengths(data.byte_lengths)
    return data, built


def _shared_mode() -> int:
    """What mkdir would give (0o777 & ~umask): a cache_dir shared by a team stays readable."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o777 & ~umask


def _prepare(data_cfg: Any, tok: Tokenizer, progress: bool, wait_message: bool) -> tuple[TokenData, bool]:
    from filelock import FileLock, Timeout

    path = cache_dir_for(data_cfg, tok.name)
    try:
        if path.exists() and not os.access(path, os.R_OK | os.X_OK):
            raise _unreadable(path)
    except PermissionError:  # the cache root itself cannot be entered
        raise _unreadable(path.parent) from None
    if is_complete(path):
        return load(path), False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path) + ".lock")
        try:
            lock.acquire(timeout=1)
        except Timeout:
            if wait_message:
                print(f"waiting for another process that is preparing {path.name} ...", file=sys.stderr)
            lock.acquire()
    except OSError as e:
        raise DataError(f"cannot write to the data cache directory {path.parent} ({e.strerror}); "
                        "set data.cache_dir to a writable directory") from None
    try:
        if is_complete(path):  # another process built it while we waited
            return load(path), False
        for stale in path.parent.glob(path.name + ".tmp-*"):  # left by a killed process
            shutil.rmtree(stale, ignore_errors=True)
        try:
            tmp = Path(tempfile.mkdtemp(prefix=path.name + ".tmp-", dir=path.parent))
        except OSError as e:
            raise DataError(f"cannot write to the data cache directory {path.parent} ({e.strerror}); "
                            "set data.cache_dir to a writable directory") from None
        try:
            os.chmod(tmp, _shared_mode())  # mkdtemp makes it 0700: only its creator could read it
            meta = _tokenize_to(tmp, data_cfg, tok, progress)
            (tmp / META).write_text(json.dumps(meta, indent=2))
            if path.exists():  # an incomplete leftover without meta.json
                shutil.rmtree(path)
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    finally:
        lock.release()
    return load(path), True


def list_cached(root: Path) -> list[dict]:
    """Every complete cache under root, with its meta.json and size on disk."""
    out = []
    if not root.is_dir():
        return out
    for d in sorted(root.iterdir()):
        if not d.is_dir() or ".tmp-" in d.name or not is_complete(d):
            continue
        try:
            meta = json.loads((d / META).read_text())
        except (OSError, ValueError):
            continue
        size = sum(f.stat().st_size for f in d.iterdir() if f.is_file())
        out.append({"path": str(d), "size_bytes": size, **meta})
    return out


def preflight(cfg: Any, tokenizer: Optional[str] = None) -> None:
    """Cheap checks of the `data` group before anything is written (called by config.validate;
    with `tokenizer`, also whether what tokenizing needs is there: hub, encoding files)."""
    if cfg.max_tokens is not None and cfg.max_tokens <= 0:
        raise ConfigError(f"data.max_tokens must be positive or null, got {cfg.max_tokens}")
    if cfg.num_proc < 0:
        raise ConfigError(f"data.num_proc must be >= 0 (0: all cores), got {cfg.num_proc}")
    get_source(cfg).check(cfg)
    if tokenizer and not is_complete(cache_dir_for(cfg, tokenizer)):  # it will be tokenized
        from ablate.data.tokenizers import check_available

        get_source(cfg).check(cfg, tokenizer)
        check_available(tokenizer)
