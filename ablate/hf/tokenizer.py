"""The run's tokenizer as a Hugging Face tokenizer: ablate's tokenizers are tiktoken encodings
(or raw bytes), which transformers' TikTokenConverter turns into a byte-level BPE tokenizer.json
with the same ids."""

from __future__ import annotations

from typing import Any, Optional

from ablate.errors import AblateError

# The end-of-text id of each tokenizer (ablate/data/tokenizers.py), for when its encoding files
# are not here: the exported bos/eos/pad ids are the tokenizer's, never Llama's 1/2.
EOT_IDS = {"byte": 256, "gpt2": 50256, "cl100k": 100257}
EOT_TEXT = "<|endoftext|>"


def eot_id(tokenizer_name: str) -> int:
    from ablate.data.tokenizers import build_tokenizer

    try:
        return int(build_tokenizer(tokenizer_name).eot_id)
    except AblateError:
        if tokenizer_name in EOT_IDS:
            return EOT_IDS[tokenizer_name]
        raise


def _from_ranks(ranks: dict, pattern: str, specials: dict) -> Any:
    """A `tokenizers` Tokenizer equal to tiktoken's ranks, by transformers' TikTokenConverter
    (vocab = the ranks; merges = each multi-byte token's splits into two tokens, by rank)."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class FromRanks(TikTokenConverter):
        def load_tiktoken_bpe(self, _):  # the converter reads a .tiktoken file; ours are in memory
            return ranks

        def extract_vocab_merges_from_model(self, url):
            vocab, merges = super().extract_vocab_merges_from_model(url)
            vocab.update(specials)  # at tiktoken's ids (cl100k has holes below them): added tokens find them
            return vocab, merges

    tok = FromRanks(pattern=pattern, extra_special_tokens=sorted(specials, key=specials.get)).converted()
    assert all(tok.token_to_id(t) == i for t, i in specials.items())  # ids as tiktoken's
    return tok


def hf_tokenizer(tokenizer_name: str, context: Optional[int] = None) -> tuple[Any, str]:
    """(a transformers PreTrainedTokenizerFast equal to the run's tokenizer, or None; a note).
    `context`: the model's, the tokenizer's model_max_length (else transformers' 1e30: no limit)."""
    if tokenizer_name == "byte":  # 256 bytes, no merges, end-of-text 256: exactly byte-level BPE
        # no merges: any split of the text into pieces gives the same ids
        tok = _from_ranks({bytes([b]): b for b in range(256)}, r"[\s\S]+", {EOT_TEXT: 256})
    else:
        from ablate.data.tokenizers import TiktokenTokenizer, build_tokenizer

        ours = build_tokenizer(tokenizer_name)
        if not isinstance(ours, TiktokenTokenizer):
            return None, f"no Hugging Face tokenizer file: tokenizer={tokenizer_name} has no HF equivalent"
        try:
            enc = ours.enc
        except AblateError as e:
            return None, f"no Hugging Face tokenizer file written: {e}"
        # Oniguruma (tokenizers) reads `{1,3}+` as "one or more runs of 1-3", not possessive:
        # "2026" would be one piece; tiktoken's regex splits it "202" + "6".
        pattern = enc._pat_str.replace("{1,3}+", "{1,3}")
        tok = _from_ranks(enc._mergeable_ranks, pattern, enc._special_tokens)
    from transformers import PreTrainedTokenizerFast

    limit = {"model_max_length": context} if context else {}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOT_TEXT, eos_token=EOT_TEXT,
                                   pad_token=EOT_TEXT, **limit)
    return fast, f"tokenizer: {tokenizer_name} as a byte-level BPE tokenizer.json (same ids as ablate's)"
