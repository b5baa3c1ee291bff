"""Data through the real CLI: `ablate data prepare` / `ablate data info`, two concurrent
prepares, offline tokenizers and hub, and bad input (one line, non-zero exit, nothing half-written)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, TINY, compose, invoke_ablate, run_ablate

TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 40


def corpus(tmp_path: Path) -> Path:
    d = tmp_path / "corpus"
    d.mkdir(exist_ok=True)
    for i in range(3):
        (d / f"{i}.txt").write_text(TEXT * (i + 1), encoding="utf-8")
    return d


def one_error_line(res: subprocess.CompletedProcess, *needles: str) -> str:
    assert res.returncode != 0, res.stdout
    assert "Traceback" not in res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, res.stderr
    for n in needles:
        assert n in errors[0], errors[0]
    return errors[0]


def leftovers(cache: Path) -> list[str]:
    """Everything under the cache root but lock files, as relative paths."""
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*")
                  if not p.name.endswith(".lock")) if cache.exists() else []


def test_prepare_then_prepare_again_is_a_no_op_and_info_lists_it(tmp_path):
    args = ["data", "prepare", "data=text_files", f"data.paths=[{corpus(tmp_path)}]", "tokenizer=cl100k",
            f"data.cache_dir={tmp_path / 'cache'}"]
    first = run_ablate(*args)
    assert first.returncode == 0, first.stderr
    assert "prepared text_files / cl100k" in first.stdout and "MB/s" in first.stdout
    assert "batch fetch:" in first.stdout and "ms per step" in first.stdout
    path = Path(first.stdout.split("cache: ")[1].splitlines()[0].strip())
    stamp = {f.name: f.stat().st_mtime_ns for f in path.iterdir()}
    second = run_ablate(*args, "--json")
    assert second.returncode == 0, second.stderr
    meta = json.loads(second.stdout)
    assert meta["built"] is False and meta["path"] == str(path) and meta["tokenizer"] == "cl100k"
    assert {f.name: f.stat().st_mtime_ns for f in path.iterdir()} == stamp
    info = invoke_ablate("data", "info", "--dir", str(tmp_path / "cache"), "--json")  # read only: in this process
    rows = json.loads(info.stdout)
    assert [(r["source"], r["tokenizer"], r["path"]) for r in rows] == [("text_files", "cl100k", str(path))]
    assert rows[0]["tokens"] == meta["tokens"] and rows[0]["size_bytes"] > 4 * sum(meta["tokens"].values())
    table = invoke_ablate("data", "info", "--dir", str(tmp_path / "cache"))
    assert "text_files" in table.stdout and path.name in table.stdout


def test_two_concurrent_prepares_build_one_valid_cache(tmp_path):
    """Both processes are started while this test holds the cache's lock, so they really
    overlap; when it is released one builds and the other reuses its result."""
    from filelock import FileLock

    from ablate.data.cache import cache_dir_for, load

    overrides = ["data=text_files", f"data.paths=[{corpus(tmp_path)}]", f"data.cache_dir={tmp_path / 'cache'}"]
    target = cache_dir_for(compose(overrides).data, "byte")
    target.parent.mkdir(parents=True)
    lock = FileLock(str(target) + ".lock")
    lock.acquire()
    procs, logs = [], []
    try:
        for i in range(2):
            err = (tmp_path / f"err{i}").open("w")
            logs.append(err)
            procs.append(subprocess.Popen([sys.executable, "-m", "cli.main", "data", "prepare", *overrides],
                                          cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True))
        deadline = time.time() + 90
        while not all("waiting for another process" in (tmp_path / f"err{i}").read_text() for i in range(2)):
            assert time.time() < deadline and all(p.poll() is None for p in procs), "prepares did not wait"
            time.sleep(0.2)
    finally:
        lock.release()
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for f in logs:
        f.close()
    assert [p.returncode for p in procs] == [0, 0]
    assert sorted(o.split(" ")[0] for o in outs) == ["already", "prepared"]
    assert leftovers(tmp_path / "cache") == sorted([target.name] + [f"{target.name}/{f}" for f in
                                                                     ("meta.json", "token_bytes.npy",
                                                                      "train.bin", "val.bin")])
    data = load(target)
    assert data.meta["tokens"]["train"] + data.meta["tokens"]["val"] == len(TEXT) * 6 + 3


@pytest.mark.parametrize("case", ["missing", "empty", "no_text"])
def test_bad_data_is_one_line_and_leaves_nothing(tmp_path, case):
    d = tmp_path / "c"
    d.mkdir()
    if case == "missing":
        paths, needle = f"{tmp_path}/nope.txt", f"data path not found: {tmp_path}/nope.txt"
    elif case == "empty":
        (d / "a.txt").write_text("")
        paths, needle = str(d / "a.txt"), "empty"
    else:
        (d / "a.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
        paths, needle = str(d / "a.jsonl"), "a.jsonl:1: no 'text' field"
    cache = tmp_path / "cache"
    res = invoke_ablate("data", "prepare", "--no-progress", "data=text_files", f"data.paths=[{paths}]",
                        f"data.cache_dir={cache}")
    one_error_line(res, needle)
    assert leftovers(cache) == []


def test_run_refuses_missing_data_and_a_too_large_vocab_before_making_a_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    res = invoke_ablate("run", *TINY, "data=text_files", f"data.paths=[{tmp_path}/missing/*.md]",
                        f"hydra.run.dir={run_dir}")  # refused before Hydra starts a job
    one_error_line(res, "data path not found")
    res = invoke_ablate("run", *TINY, "tokenizer=cl100k", "model.vocab_size=50304", f"hydra.run.dir={run_dir}")
    one_error_line(res, "model.vocab_size=50304", "100277")
    assert not run_dir.exists()


def test_run_refuses_a_corpus_smaller_than_one_batch(tmp_path):
    """Found by tokenizing in the pre-flight: one line and no run directory (not a failed run)."""
    (tmp_path / "a.txt").write_text("tiny " * 20)  # 101 tokens: 96 for training < 4 x 32 + 1
    res = invoke_ablate("run", *TINY, "data=text_files", f"data.paths=[{tmp_path / 'a.txt'}]",
                        f"hydra.run.dir={tmp_path / 'run'}")
    one_error_line(res, "fewer than one batch", "train.batch_size=4", "train.seq_len=32")
    assert res.stderr.strip().startswith("error:") and len(res.stderr.strip().splitlines()) == 1
    assert res.returncode == 2 and not (tmp_path / "run").exists()


def test_gpt2_without_cached_encoding_files_says_how_to_provide_them(tmp_path):
    empty = tmp_path / "tiktoken-cache"
    empty.mkdir()
    # an unusable proxy makes "no network" certain, even on a machine that has one
    env = {"TIKTOKEN_CACHE_DIR": str(empty), "HTTPS_PROXY": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"}
    t0 = time.perf_counter()
    res = run_ablate("data", "prepare", "--no-progress", "tokenizer=gpt2", f"data.cache_dir={tmp_path / 'cache'}",
                     env=env)
    one_error_line(res, "tokenizer=gpt2", "TIKTOKEN_CACHE_DIR", str(empty))
    assert time.perf_counter() - t0 < 30
    assert leftovers(tmp_path / "cache") == []


def test_hub_dataset_offline_is_one_line(tmp_path):
    res = run_ablate("data", "prepare", "--no-progress", "data=fineweb_edu", f"data.cache_dir={tmp_path / 'cache'}")
    one_error_line(res, "HuggingFaceFW/fineweb-edu", "HF_HUB_OFFLINE")
    assert leftovers(tmp_path / "cache") == []


def test_run_with_an_uncached_hub_dataset_offline_makes_no_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    res = run_ablate("run", *TINY, "data=openwebtext", f"data.cache_dir={tmp_path / 'cache'}",
                     f"hydra.run.dir={run_dir}")
    one_error_line(res, "Skylion007/openwebtext", "not in the data cache")
    assert not run_dir.exists()
