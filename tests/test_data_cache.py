"""Sources, the token cache (layout, split, keys, reuse) and the hub code path on a
local `datasets` source. In-process; the CLI and concurrency are in test_data_cli.py."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ablate.data.cache import cache_dir_for, prepare
from ablate.data.tokenizers import build_tokenizer
from ablate.errors import DataError
from conftest import compose

DOCS = ["First document.\nWith two lines.", "Second — with ünïcödé ☃.", "Third <|endoftext|> is text here."]


def make_corpus(d):
    """.txt, .md, .jsonl and .parquet files, one document each kind per row/file."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "a.txt").write_text(DOCS[0], encoding="utf-8")
    (d / "b.jsonl").write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(DOCS[1:])),
                               encoding="utf-8")
    pq.write_table(pa.table({"text": DOCS, "n": [1, 2, 3]}), d / "c.parquet")
    (d / "d.md").write_text("# Title\n", encoding="utf-8")
    return [DOCS[0]] + DOCS[1:] + DOCS + ["# Title\n"]  # sorted file order: a, b, c, d


def prep(overrides, tokenizer="byte"):
    cfg = compose(["data=text_files", f"tokenizer={tokenizer}", "data.val_fraction=0.25"] + overrides)
    return prepare(cfg.data, build_tokenizer(tokenizer), progress=False), cfg


@pytest.mark.parametrize("tokenizer", ["byte", "cl100k"])
def test_text_files_of_every_kind_become_documents_separated_by_end_of_text(tmp_path, tokenizer):
    docs = make_corpus(tmp_path / "corpus")
    (data, built), _ = prep([f"data.paths=[{tmp_path / 'corpus'}]"], tokenizer)
    tok = build_tokenizer(tokenizer)
    assert built
    stream = np.concatenate([data.train, data.val])  # the split is a contiguous cut
    expected = np.concatenate([np.asarray(tok.encode(d) + [tok.eot_id]) for d in docs])
    assert np.array_equal(stream, expected)
    # round trip: each document decodes back to its text
    cuts = np.flatnonzero(stream == tok.eot_id)
    assert [tok.decode(p) for p in np.split(stream, cuts + 1)[:-1]] == [d for d in docs]
    m = data.meta
    assert m["dtype"] == ("uint16" if tokenizer == "byte" else "uint32")
    assert data.train.dtype == np.dtype(m["dtype"])
    assert m["source"] == "text_files" and m["tokenizer"] == tokenizer and m["documents"] == len(docs)
    assert m["tokens"]["train"] + m["tokens"]["val"] == len(expected)
    assert m["tokens"]["val"] == int(len(expected) * 0.25)
    assert m["bytes"]["train"] + m["bytes"]["val"] == sum(len(d.encode()) for d in docs) == m["source_bytes"]
    assert m["bytes"]["val"] == len(tok.decode_bytes(data.val))


def test_round_trip_of_the_shakespeare_corpus():
    from ablate.data.sources import Shakespeare

    play = next(iter(Shakespeare().documents(None)))
    for name in ("byte", "cl100k"):
        tok = build_tokenizer(name)
        assert tok.decode(tok.encode(play)) == play


def test_globs_and_max_tokens(tmp_path):
    make_corpus(tmp_path / "c")
    (data, _), _ = prep([f"data.paths=['{tmp_path}/c/*.jsonl','{tmp_path}/c/a.txt']"])
    assert data.meta["documents"] == 3
    (capped, _), _ = prep([f"data.paths=[{tmp_path / 'c'}]", "data.max_tokens=50"])
    assert capped.meta["tokens"]["train"] + capped.meta["tokens"]["val"] == 50 and capped.meta["truncated"]


def test_second_prepare_reuses_the_cache_and_an_edit_invalidates_it(tmp_path):
    make_corpus(tmp_path / "c")
    (first, built1), cfg = prep([f"data.paths=[{tmp_path / 'c'}]"])
    stamp = {f.name: f.stat().st_mtime_ns for f in first.path.iterdir()}
    (second, built2), _ = prep([f"data.paths=[{tmp_path / 'c'}]"])
    assert built1 and not built2 and second.path == first.path
    assert {f.name: f.stat().st_mtime_ns for f in second.path.iterdir()} == stamp  # nothing rewritten
    with (tmp_path / "c" / "a.txt").open("a", encoding="utf-8") as f:
        f.write(" More text.")
    (third, built3), _ = prep([f"data.paths=[{tmp_path / 'c'}]"])
    assert built3 and third.path != first.path
    assert third.meta["tokens"]["train"] + third.meta["tokens"]["val"] == \
        first.meta["tokens"]["train"] + first.meta["tokens"]["val"] + len(" More text.")


def test_cache_key_separates_tokenizers_and_settings(tmp_path):
    make_corpus(tmp_path / "c")
    cfg = compose(["data=text_files", f"data.paths=[{tmp_path / 'c'}]"])
    other = compose(["data=text_files", f"data.paths=[{tmp_path / 'c'}]", "data.val_fraction=0.1"])
    assert cache_dir_for(cfg.data, "byte") != cache_dir_for(cfg.data, "cl100k")
    assert cache_dir_for(cfg.data, "byte") != cache_dir_for(other.data, "byte")
    assert cache_dir_for(cfg.data, "byte") == cache_dir_for(cfg.data, "byte")


@pytest.mark.parametrize("case", ["empty", "no_text_field", "bad_parquet_column", "too_small", "not_utf8_jsonl"])
def test_bad_corpora_raise_one_line_and_leave_no_cache(tmp_path, case):
    d = tmp_path / "c"
    d.mkdir()
    if case == "empty":
        (d / "a.txt").write_text("")
        (d / "b.jsonl").write_text(json.dumps({"text": ""}) + "\n")
    elif case == "no_text_field":
        (d / "a.jsonl").write_text(json.dumps({"text": "ok"}) + "\n" + json.dumps({"body": "x"}) + "\n")
    elif case == "bad_parquet_column":
        pq.write_table(pa.table({"body": ["x"]}), d / "a.parquet")
    elif case == "not_utf8_jsonl":
        (d / "a.jsonl").write_bytes(b'{"text": "caf\xe9"}\n')  # Latin-1
    else:
        (d / "a.txt").write_text("a")
    cache = tmp_path / "cache"
    with pytest.raises(DataError) as e:
        prep([f"data.paths=[{d}]", f"data.cache_dir={cache}"])
    msg = str(e.value)
    assert "\n" not in msg
    assert {"empty": "empty", "no_text_field": "a.jsonl:2: no 'text' field",
            "bad_parquet_column": "no 'text' column", "too_small": "too few",
            "not_utf8_jsonl": "a.jsonl: not UTF-8 text"}[case] in msg
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []


def test_missing_path_fails_at_validation(tmp_path):
    from ablate.errors import AblateError

    with pytest.raises(AblateError, match=f"data path not found: {tmp_path}/nope"):
        compose(["data=text_files", f"data.paths=[{tmp_path}/nope/*.txt]"])


def test_hub_code_path_on_a_local_datasets_directory(tmp_path):
    d = tmp_path / "hub"
    d.mkdir()
    rows = [{"text": f"row {i}: " + "lorem ipsum " * (i + 1)} for i in range(20)]
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (data, built), _ = prep(["data=fineweb_edu", f"data.hf_path={d}", "data.val_fraction=0.2"])
    tok = build_tokenizer("byte")
    expected = sum(len(r["text"].encode()) + 1 for r in rows)
    assert built and data.meta["documents"] == 20
    assert data.meta["tokens"]["train"] + data.meta["tokens"]["val"] == expected
    assert data.val[-1] == tok.eot_id
    (capped, _), _ = prep(["data=openwebtext", f"data.hf_path={d}", "data.max_tokens=100"])
    assert capped.meta["tokens"]["train"] + capped.meta["tokens"]["val"] == 100
    # a packaged builder reading data.paths goes through the same code
    pq.write_table(pa.table({"text": [r["text"] for r in rows]}), tmp_path / "rows.parquet")
    (pqd, _), _ = prep(["data=fineweb_edu", "data.hf_path=parquet", f"data.paths=[{tmp_path / 'rows.parquet'}]",
                        "data.val_fraction=0.2"])
    assert np.array_equal(np.concatenate([pqd.train, pqd.val]), np.concatenate([data.train, data.val]))


def test_unreachable_hub_fails_fast_with_one_line(tmp_path, monkeypatch):
    t0 = time.perf_counter()
    with pytest.raises(DataError, match="HF_HUB_OFFLINE"):  # conftest sets HF_HUB_OFFLINE=1
        prep(["data=fineweb_edu", f"data.cache_dir={tmp_path}"])
    # no offline flag, no network: one TCP probe instead of datasets' retries with backoff
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(DataError, match="cannot stream 'Skylion007/openwebtext' from the Hugging Face hub"):
        prep(["data=openwebtext", f"data.cache_dir={tmp_path}"])
    assert time.perf_counter() - t0 < 15
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_many_small_batches_and_chunks_give_the_same_tokens(tmp_path, monkeypatch):
    """One document per tokenizer batch (read ahead in a thread) and a 3-token copy chunk:
    the cache holds exactly what one big batch gives."""
    import ablate.data.cache as cache

    docs = make_corpus(tmp_path / "c")
    (big, _), _ = prep([f"data.paths=[{tmp_path / 'c'}]", f"data.cache_dir={tmp_path / 'one'}"], "cl100k")
    monkeypatch.setattr(cache, "_BATCH_DOCS", 1)
    monkeypatch.setattr(cache, "_COPY_CHUNK", 3)
    (small, _), _ = prep([f"data.paths=[{tmp_path / 'c'}]", f"data.cache_dir={tmp_path / 'two'}"], "cl100k")
    assert np.array_equal(big.train, small.train) and np.array_equal(big.val, small.val)
    assert big.meta["bytes"] == small.meta["bytes"] and small.meta["documents"] == len(docs)


def test_training_side_needs_no_encoding_files_once_the_data_is_cached(tmp_path, monkeypatch):
    """Byte lengths (for val_bpb) are stored in the cache: data prepared where tiktoken's files
    exist trains where they do not (e.g. tokenizer=gpt2 offline without TIKTOKEN_CACHE_DIR)."""
    import tiktoken

    from ablate.train.launch import prepare_data

    make_corpus(tmp_path / "c")
    (data, _), cfg = prep([f"data.paths=[{tmp_path / 'c'}]"], "cl100k")
    expected = build_tokenizer("cl100k").token_byte_lengths()
    assert np.array_equal(data.byte_lengths, expected)
    assert (data.path / data.meta["byte_lengths"]).is_file()

    def unavailable(name):
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken, "get_encoding", unavailable)
    with pytest.raises(DataError):
        build_tokenizer("cl100k").enc  # the encoding really is gone
    tok, again = prepare_data(cfg, progress=False)  # what the trainer calls
    assert np.array_equal(tok.token_byte_lengths(), expected)
    assert np.array_equal(again.byte_lengths, expected)


def test_cache_dirs_get_normal_permissions(tmp_path):
    """mkdtemp makes 0700 directories: a data.cache_dir shared by a team must stay readable."""
    old = os.umask(0o022)
    try:
        make_corpus(tmp_path / "c")
        (data, _), _ = prep([f"data.paths=[{tmp_path / 'c'}]"])
    finally:
        os.umask(old)
    assert data.path.stat().st_mode & 0o777 == 0o755
    assert {f.stat().st_mode & 0o777 for f in data.path.iterdir()} == {0o644}


def test_an_unreadable_cache_is_one_line_that_says_so(tmp_path, monkeypatch):
    make_corpus(tmp_path / "c")
    (data, _), _ = prep([f"data.paths=[{tmp_path / 'c'}]"])
    real_access = os.access
    # as root (CI containers) chmod cannot take read access away: pretend it did
    monkeypatch.setattr(os, "access", lambda p, mode: str(p) != str(data.path) and real_access(p, mode))
    with pytest.raises(DataError, match="cannot read it .*chmod -R a\\+rX") as e:
        prep([f"data.paths=[{tmp_path / 'c'}]"])
    assert str(data.path) in str(e.value) and "\n" not in str(e.value)


def test_truncated_only_when_tokens_were_dropped(tmp_path, monkeypatch):
    import ablate.data.cache as cache

    (tmp_path / "a.txt").write_text("x" * 99)  # 99 bytes + end-of-text = 100 tokens
    (exact, _), _ = prep([f"data.paths=[{tmp_path / 'a.txt'}]", "data.max_tokens=100"])
    (cut, _), _ = prep([f"data.paths=[{tmp_path / 'a.txt'}]", "data.max_tokens=99"])
    assert exact.meta["truncated"] is False and cut.meta["truncated"] is True
    # exactly full after the first batch (one file each), with another file left unread: dropped
    monkeypatch.setattr(cache, "_BATCH_DOCS", 1)
    (tmp_path / "b.txt").write_text("y")
    (more, _), _ = prep([f"data.paths=[{tmp_path / 'a.txt'},{tmp_path / 'b.txt'}]", "data.max_tokens=100"])
    assert more.meta["truncated"] is True


@pytest.mark.parametrize("name", ["rows.json", "table.csv", "README"])
def test_a_file_type_text_files_cannot_read_is_refused(tmp_path, name):
    from ablate.errors import AblateError

    (tmp_path / name).write_text('{"text": "hello"}\n')
    supported = r"\.txt, \.md, \.jsonl, \.parquet"
    with pytest.raises(AblateError, match=f"{name} has an unsupported file type .*{supported}"):
        compose(["data=text_files", f"data.paths=[{tmp_path / name}]"])
