"""The evaluation (ablate/train/evaluate.py): val_loss (nats/token) and val_bpb = total nats /
(ln 2 * UTF-8 bytes of the validated text), checked against hand computations on a tiny corpus."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ablate.data.batches import val_windows
from ablate.data.tokenizers import build_tokenizer
from ablate.train.evaluate import evaluate
from conftest import compose

TEXT = ("Now is the winter of our discontent — made glorious summer by this sun of York. "
        "Naïve café, Übermensch, 東京, ☃ and ½ fill the bytes. ") * 6


@pytest.fixture
def tiny_model_data(tmp_path):
    def build(tokenizer: str):
        from ablate.data.cache import prepare
        from ablate.model.spec import ModelSpec
        from ablate.model.transformer import build_model

        (tmp_path / "a.txt").write_text(TEXT, encoding="utf-8")
        cfg = compose(["data=text_files", f"data.paths=[{tmp_path / 'a.txt'}]", "data.val_fraction=0.5",
                       f"tokenizer={tokenizer}", "tie=untied", "bias=off", "model.d_model=32",
                       "model.n_layers=1", "model.n_heads=2", "model.max_seq_len=64", "train.seq_len=16"])
        tok = build_tokenizer(tokenizer)
        data, _ = prepare(cfg.data, tok, progress=False)
        torch.manual_seed(0)
        model = build_model(ModelSpec.from_config(cfg, tokenizer_vocab=tok.vocab_size))
        return tok, data, model

    return build


@pytest.mark.parametrize("tokenizer", ["byte", "cl100k"])
def test_uniform_model_gives_ln_vocab_and_bits_per_byte_by_hand(tiny_model_data, tokenizer):
    tok, data, model = tiny_model_data(tokenizer)
    with torch.no_grad():
        model.lm_head.weight.zero_()  # all logits 0: uniform over the padded vocab
    vocab = model.lm_head.weight.shape[0]
    windows = val_windows(data.val, seq_len=16, max_tokens=10_000)
    m = evaluate(model, data.val, windows, tok.token_byte_lengths(), torch.device("cpu"), batch_size=3)
    targets = np.asarray(data.val[1:])  # every validation token but the first is predicted once
    text_bytes = len(tok.decode_bytes(targets))  # the tokenizer's own decoder, not our table
    assert text_bytes > 0
    assert m["val_loss"] == pytest.approx(math.log(vocab), rel=1e-6)
    assert m["val_bpb"] == pytest.approx(len(targets) * math.log(vocab) / (math.log(2) * text_bytes), rel=1e-6)


def test_val_loss_and_bpb_match_a_window_by_window_computation(tiny_model_data):
    tok, data, model = tiny_model_data("cl100k")
    model.eval()
    windows = val_windows(data.val, seq_len=16, max_tokens=10_000)
    assert len({n for _, n in windows}) == 2  # full windows and a shorter last one
    nats, n_tok, n_bytes = 0.0, 0, 0
    with torch.no_grad():
        for start, n in windows:
            w = torch.from_numpy(np.asarray(data.val[start:start + n + 1], dtype=np.int64))[None]
            logits = model(w[:, :-1]).logits[0]
            nats += float(F.cross_entropy(logits, w[0, 1:], reduction="sum"))
            n_tok += n
            n_bytes += len(tok.decode_bytes(w[0, 1:].tolist()))
    m = evaluate(model, data.val, windows, tok.token_byte_lengths(), torch.device("cpu"), batch_size=4)
    assert m["val_loss"] == pytest.approx(nats / n_tok, rel=1e-5)
    assert m["val_bpb"] == pytest.approx(nats / (math.log(2) * n_bytes), rel=1e-5)


def test_token_byte_lengths_count_utf8_bytes():
    for name in ("byte", "cl100k"):
        tok = build_tokenizer(name)
        ids = tok.encode(TEXT)
        assert int(tok.token_byte_lengths()[ids].sum()) == len(TEXT.encode("utf-8"))
        assert tok.token_byte_lengths()[tok.eot_id] == 0
