"""A catalogue of bad inputs. Each is refused by the real CLI with a non-zero exit, one
`error: ...` line on stderr naming the problem, no traceback, and nothing written: the output
directory, which already holds a finished run (and a damaged one), is byte-for-byte unchanged."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import TINY, built_once, run_ablate, trained_run

from ablate.train import checkpoint

# (id, overrides, words the one-line message must contain). {out}, {data}: paths set up below.
CASES = [
    ("unknown-group-option", ["norm=rmsnrm"], ["rmsnrm", "layernorm", "rmsnorm"]),
    ("unknown-group", ["normx=rmsnorm"], ["unknown config key 'normx'", "did you mean norm?"]),
    ("unknown-key", ["train.stpes=10"], ["train.stpes", "did you mean train.steps?"]),
    ("unknown-key-appended", ["+train.stpes=10"], ["train.stpes", "did you mean train.steps?"]),
    ("wrong-type-float", ["train.lr=abc"], ["train.lr", "abc"]),
    ("wrong-type-int", ["model.d_model=1.5"], ["model.d_model", "1.5"]),
    ("malformed-override", ["train.steps"], ["train.steps"]),
    ("negative-steps", ["train.steps=-1"], ["train.steps", "-1"]),
    ("zero-steps", ["train.steps=0"], ["train.steps must be a positive integer, got 0"]),
    ("warmup-as-long-as-the-run", ["train.warmup_steps=6"],  # TINY: 6 steps
     ["train.warmup_steps=6 is not below train.steps=6", "null"]),
    ("warmup-fraction-of-one", ["train.warmup_fraction=1"], ["train.warmup_fraction", "[0, 1)"]),
    ("zero-batch-size", ["train.batch_size=0"], ["train.batch_size", "0"]),
    ("zero-lr", ["train.lr=0"], ["train.lr"]),
    ("heads-not-dividing-d_model", ["model.d_model=30", "model.n_heads=4"],
     ["model.d_model=30", "model.n_heads=4"]),
    ("kv-heads-not-dividing-heads", ["attn=gqa", "model.n_heads=4", "model.n_kv_heads=3"],
     ["model.n_heads=4", "model.n_kv_heads=3"]),
    ("kv-heads-contradict-mha", ["model.n_heads=4", "model.n_kv_heads=2"],
     ["model.n_kv_heads=2", "attn=mha", "use attn=gqa"]),
    ("kv-heads-contradict-mqa", ["attn=mqa", "model.n_heads=4", "model.n_kv_heads=4"],
     ["model.n_kv_heads=4", "attn=mqa", "use attn=mha"]),
    ("kv-heads-contradict-gqa", ["attn=gqa", "model.n_heads=4", "model.n_kv_heads=1"],
     ["model.n_kv_heads=1", "attn=gqa", "use attn=mqa"]),
    ("gqa-on-a-prime-head-count", ["attn=gqa"], ["attn=gqa", "model.n_heads=2"]),  # TINY: 2 heads
    ("kv-group-zero", ["attn=gqa", "model.n_heads=4", "attn.kv_group=0"], ["attn.kv_group", ">= 2"]),
    ("ffn-multiple-of-zero", ["act=swiglu", "model.ffn_multiple_of=0"], ["model.ffn_multiple_of", "0"]),
    ("ffn-multiple-of-negative", ["act=swiglu", "model.ffn_multiple_of=-16"], ["model.ffn_multiple_of", "-16"]),
    ("norm-eps-zero", ["norm.eps=0"], ["norm.eps", "positive"]),
    ("rope-base-negative", ["pos=rope", "pos.base=-1"], ["pos.base", "positive"]),
    ("init-std-negative", ["model.init_std=-0.02"], ["model.init_std", "positive"]),
    ("seed-negative", ["seed=-1"], ["seed", "-1", "2**32"]),
    ("data-seed-too-large", ["data_seed=4294967296"], ["data_seed", "4294967296"]),
    ("bad-logger-mode", ["logger.mode=bogus"], ["logger.mode", "bogus", "offline"]),
    ("dropout-rate-with-dropout-off", ["dropout.rate=0.2"], ["dropout.rate=0.2", "dropout=on"]),
    ("unset-env-interpolation", ["out_dir=${{oc.env:ABLATE_TEST_UNSET}}"], ["out_dir", "ABLATE_TEST_UNSET"]),
    ("unset-env-in-device", ["train.device=${{oc.env:ABLATE_TEST_NOPE}}"], ["train.device", "ABLATE_TEST_NOPE"]),
    ("missing-interpolation-key", ["logger.group=${{train.nope}}"], ["logger.group", "train.nope"]),
    ("rope-odd-head-dim", ["pos=rope", "model.d_model=36", "model.n_heads=4"], ["rope", "even", "9"]),
    # attn=mla (TINY: head_dim 16): what it cannot combine with, and its settings' values
    ("mla-with-qk-norm", ["attn=mla", "qk_norm=on"], ["qk_norm=on", "attn=mla", "qk_norm=off"]),
    ("mla-with-kv-heads", ["attn=mla", "model.n_kv_heads=2"], ["model.n_kv_heads=2", "attn=mla", "null"]),
    ("mla-rank-zero", ["attn=mla", "attn.kv_rank=0"], ["attn.kv_rank=0", "positive integer or null"]),
    ("mla-rank-not-an-integer", ["attn=mla", "attn.q_rank=1.5"], ["attn.q_rank", "1.5"]),
    ("mla-odd-rope-dim", ["attn=mla", "pos=rope", "attn.rope_dim=7"], ["attn.rope_dim=7", "even"]),
    ("mla-rope-dim-without-rope", ["attn=mla", "attn.rope_dim=8"], ["attn.rope_dim=8", "pos=rope"]),
    ("mla-unknown-decode", ["attn=mla", "attn.decode=fast"], ["attn.decode='fast'", "absorbed, plain"]),
    ("seq_len-above-max_seq_len", ["train.seq_len=128"], ["train.seq_len=128", "model.max_seq_len=64"]),
    ("bad-schedule", ["train.schedule=cosine_wrong"], ["train.schedule", "cosine_wrong"]),
    ("bad-precision", ["train.precision=fp8"], ["train.precision", "fp8"]),
    ("bad-resume-mode", ["train.resume=sometimes"], ["train.resume", "sometimes"]),
    ("dropout-rate-out-of-range", ["dropout=on", "dropout.rate=1.5"], ["dropout.rate", "1.5"]),
    ("val-fraction-zero", ["data.val_fraction=0"], ["data.val_fraction"]),
    ("unknown-tokenizer", ["tokenizer=bpe9"], ["bpe9", "byte", "gpt2"]),
    ("unknown-device", ["train.device=tpu"], ["train.device", "tpu"]),
    ("missing-gpu", ["train.device=cuda:99"], ["cuda:99"]),
    ("missing-data-path", ["data=text_files", "data.paths=[{data}/nope.txt]"], ["{data}/nope.txt"]),
    ("no-data-paths", ["data=text_files"], ["data.paths"]),
    ("empty-corpus", ["data=text_files", "data.paths=[{data}/empty.txt]"], ["empty"]),
    # found only by tokenizing: the pre-flight prepares the data before a run dir exists
    ("jsonl-without-text-field", ["data=text_files", "data.paths=[{data}/body.jsonl]"],
     ["body.jsonl:1", "no 'text' field"]),
    ("jsonl-with-empty-texts", ["data=text_files", "data.paths=[{data}/blank.jsonl]"], ["corpus is empty"]),
    ("jsonl-invalid-json", ["data=text_files", "data.paths=[{data}/invalid.jsonl]"],
     ["invalid.jsonl:2", "not valid JSON"]),
    ("text-not-utf8", ["data=text_files", "data.paths=[{data}/latin1.txt]"], ["latin1.txt", "not UTF-8"]),
    ("jsonl-not-utf8", ["data=text_files", "data.paths=[{data}/latin1.jsonl]"], ["latin1.jsonl", "not UTF-8"]),
    ("corpus-smaller-than-a-batch", ["data=text_files", "data.paths=[{data}/small.txt]"],
     ["fewer than one batch", "train.batch_size=4"]),
    ("unsupported-file-type", ["data=text_files", "data.paths=[{data}/rows.json]"],
     ["rows.json", "unsupported file type", ".jsonl"]),
    ("unwritable-out_dir", ["out_dir={data}/a_file/runs"], ["{data}/a_file", "not a directory"]),
    ("unwritable-run-dir", ["hydra.run.dir={data}/a_file/run"], ["{data}/a_file", "not a directory"]),
    ("corrupt-checkpoint", ["hydra.run.dir={out}/damaged"], ["no usable checkpoint", "checksum"]),
    ("checkpoint-of-another-model", ["hydra.run.dir={out}/finished", "model.d_model=64"],
     ["holds a completed run with model.d_model=32", "this config has model.d_model=64"]),
    ("second-process-on-the-run-dir", ["hydra.run.dir={out}/locked"], ["in use by process"]),
    ("vocab-smaller-than-tokenizer", ["model.vocab_size=64"], ["model.vocab_size=64"]),
    # sliding windows (TINY: 2 layers)
    ("window-not-an-integer", ["attn.window=1.5"], ["attn.window", "1.5"]),
    ("window-zero", ["attn.window=0"], ["attn.window must be a positive integer", "got 0"]),
    ("global-every-below-one", ["attn.window=8", "attn.global_every=0"], ["attn.global_every must be an integer >= 1"]),
    ("global-every-without-window", ["attn.global_every=2"], ["attn.global_every=2 needs attn.window"]),
    ("global-every-leaving-no-full-layer", ["attn.window=8", "attn.global_every=3"],
     ["attn.global_every=3 leaves no full layer in a 2-layer model"]),
    ("local-rope-base-without-rope", ["attn.window=8", "attn.global_every=2", "attn.local_rope_base=10000"],
     ["attn.local_rope_base needs pos=rope", "pos=learned"]),
    # attn=mla declares no window (one latent per position, no per-head keys to slide over)
    ("window-on-mla", ["attn=mla", "attn.window=16"],
     ["unknown config key 'attn.window'", "a setting of attn=mha or attn=gqa or attn=mqa only"]),
    ("secret-as-override", ["+logger.api_key=0123456789abcdef"], ["WANDB_API_KEY"]),
    ("moe-top-k-above-experts", ["ffn=moe", "ffn.experts=4", "ffn.top_k=5"],
     ["ffn.top_k must be between 1 and ffn.experts=4, got 5"]),
    ("moe-no-experts", ["ffn=moe", "ffn.experts=0"], ["ffn.experts must be >= 1, got 0"]),
    ("moe-dense-first-every-layer", ["ffn=moe", "ffn.dense_first=2"],  # TINY: 2 layers
     ["ffn.dense_first=2", "below model.n_layers=2", "ffn=dense"]),
    ("moe-setting-without-moe", ["ffn.experts=8"], ["ffn.experts", "ffn=moe"]),
    # the optim axis (ablate/train/optimizers/optim_settings.py)
    ("optim-unknown", ["optim=sgd"], ["sgd", "adamw", "muon"]),
    ("optim-unknown-adjust", ["optim=muon", "optim.adjust=spectral"], ["optim.adjust", "spectral", "match_rms_adamw"]),
    ("optim-adam-lr-with-match-rms", ["optim=muon", "optim.adam_lr=0.001"],
     ["optim.adam_lr=0.001", "match_rms_adamw", "optim.adjust=original"]),
    ("optim-original-without-adam-lr", ["optim=muon", "optim.adjust=original"], ["optim.adjust=original", "optim.adam_lr"]),
    ("optim-adam-lr-zero", ["optim=muon", "optim.adjust=original", "optim.adam_lr=0"], ["optim.adam_lr must be positive"]),
    ("optim-negative-lr", ["optim=muon", "train.lr=-0.01"], ["train.lr must be positive"]),
    ("optim-original-with-mup", ["optim=muon", "optim.adjust=original", "optim.adam_lr=0.003", "param=mup"],
     ["optim.adjust=original with param=mup", "match_rms_adamw"]),
    ("optim-muon-key-with-adamw", ["optim.momentum=0.9"], ["optim.momentum=0.9", "optim=adamw", "optim=muon"]),
    ("optim-ns-steps-zero", ["optim=muon", "optim.ns_steps=0"], ["optim.ns_steps", "got 0"]),
    ("moe-bias-rate-zero", ["ffn=moe", "ffn.balance=bias", "ffn.bias_rate=0"], ["ffn.bias_rate must be > 0", "got 0.0"]),
    ("moe-capacity-zero", ["ffn=moe", "ffn.capacity=0"], ["ffn.capacity must be > 0", "null (dropless)"]),
    ("moe-negative-shared", ["ffn=moe", "ffn.shared=-1"], ["ffn.shared must be >= 0", "got -1"]),
    ("moe-bias-rate-with-aux", ["ffn=moe", "ffn.bias_rate=0.01"],
     ["ffn.bias_rate=0.01 is a setting of ffn.balance=bias, not of ffn.balance=aux"]),
    ("moe-aux-coef-with-bias", ["ffn=moe", "ffn.balance=bias", "ffn.aux_coef=0.1"],
     ["ffn.aux_coef=0.1 is a setting of ffn.balance=aux, not of ffn.balance=bias"]),
    # a preset's setting of an option the command line replaced: named with the preset
    ("preset-setting-of-replaced-option", ["arch=mistral", "attn=mla"],
     ["arch=mistral sets attn.window, a setting of attn=mha or attn=gqa or attn=mqa only"]),
]


def snapshot(root) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(root.rglob("*")) if p.is_file()} | {
            str(p.relative_to(root)) + "/": None for p in root.rglob("*") if p.is_dir()}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """An output dir with a finished run, a copy whose checkpoints are damaged, and a run dir
    locked by a live process; a data dir with an empty file and a plain file. The finished run is
    trained once for the session's workers and copied into each one's world."""
    out, data = tmp_path_factory.mktemp("out"), tmp_path_factory.mktemp("data")
    trained = built_once(tmp_path_factory, "bad-inputs-finished",
                         lambda d: trained_run(d / "run", *TINY, "train.ckpt_every=3", "train.threads=1"))
    shutil.copytree(trained / "run", out / "finished")
    shutil.copytree(out / "finished", out / "damaged")
    for _, path in checkpoint.list_checkpoints(out / "damaged"):
        path.write_bytes(path.read_bytes()[:-100])
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    (out / "locked").mkdir()
    (out / "locked" / "run.lock").write_text(json.dumps({"pid": holder.pid, "host": os.uname().nodename}))
    (data / "empty.txt").write_text("")
    (data / "a_file").write_text("not a directory")
    (data / "body.jsonl").write_text('{"body": "no text field"}\n')
    (data / "blank.jsonl").write_text('{"text": ""}\n{"text": ""}\n')
    (data / "invalid.jsonl").write_text('{"text": "fine"}\n{"text": broken\n')
    (data / "latin1.txt").write_bytes("café au lait".encode("latin-1"))
    (data / "latin1.jsonl").write_bytes('{"text": "café"}\n'.encode("latin-1"))
    (data / "small.txt").write_text("tiny " * 20)
    (data / "rows.json").write_text('[{"text": "a whole corpus"}]')
    yield {"out": out, "data": data}
    holder.kill()
    holder.wait()


@pytest.mark.parametrize("name,overrides,words", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_cleanly_and_changes_nothing(world, name, overrides, words):
    fill = lambda s: s.format(**world)  # noqa: E731
    before = snapshot(world["out"])
    res = run_ablate("run", *TINY, f"out_dir={world['out']}", *map(fill, overrides))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for word in map(fill, words):
        assert word in lines[0], lines[0]
    assert snapshot(world["out"]) == before  # no new run dir, no other run dir touched


def test_a_corpus_without_text_is_refused_before_a_run_dir_exists(world, tmp_path):
    """Found only by tokenizing, which the pre-flight does: one line, exit 2, no run directory
    (not a failed run with config.yaml, summary.json and a log); other runs are untouched."""
    corpus = tmp_path / "blank.jsonl"
    corpus.write_text('{"text": ""}\n{"text": ""}\n')
    before = snapshot(world["out"])
    res = run_ablate("run", *TINY, "data=text_files", f"data.paths=[{corpus}]", "train.threads=1",
                     f"hydra.run.dir={tmp_path}/run")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == ["error: data=text_files: the corpus is empty (no text found)"]
    assert res.stdout == "" and not (tmp_path / "run").exists()
    assert snapshot(world["out"]) == before


def test_an_unexpected_exception_is_recorded_as_failed_in_one_line(tmp_path, monkeypatch):
    """Bit rot in the token cache (ids beyond the vocabulary) makes the model raise deep inside
    training: summary.json says failed with the one-line error, the console gets one line, the
    traceback goes to error.txt."""
    import numpy as np

    from conftest import compose

    from ablate.data.cache import prepare
    from ablate.data.tokenizers import build_tokenizer

    corpus = tmp_path / "play.txt"
    corpus.write_text("To be, or not to be, that is the question. " * 200)
    overrides = ["data=text_files", f"data.paths=[{corpus}]"]
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path / "cache"))
    data, _ = prepare(compose([*TINY, *overrides]).data, build_tokenizer("byte"), progress=False)
    train_bin = data.path / "train.bin"
    np.full(len(data.train), 60000, dtype=data.train.dtype).tofile(train_bin)
    run = tmp_path / "run"
    res = run_ablate("run", *TINY, *overrides, "train.threads=1", f"hydra.run.dir={run}")
    assert res.returncode != 0
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: IndexError"), res.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith("IndexError")
    assert "Traceback" in (run / "error.txt").read_text()


UNREACHABLE = "http://127.0.0.1:9"  # the discard port: refused at once, with or without network
OFFLINE_CASES = [
    # tiktoken's gpt2 files neither cached nor downloadable
    ("gpt2-encoding-offline", ["tokenizer=gpt2"],
     lambda tmp: {"TIKTOKEN_CACHE_DIR": str(tmp), "HTTPS_PROXY": UNREACHABLE, "https_proxy": UNREACHABLE},
     ["tokenizer=gpt2", "TIKTOKEN_CACHE_DIR"]),
    # a hub dataset, not cached, the hub unreachable (without HF_HUB_OFFLINE to say so)
    ("hub-unreachable", ["data=fineweb_edu"],
     lambda tmp: {"HF_HUB_OFFLINE": "", "HF_DATASETS_OFFLINE": "", "HF_ENDPOINT": UNREACHABLE,
                  "ABLATE_CACHE": str(tmp), **{k: "" for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")}},
     ["HuggingFaceFW/fineweb-edu", "127.0.0.1:9", "ablate data prepare"]),
]


@pytest.mark.parametrize("name,overrides,env,words", OFFLINE_CASES, ids=[c[0] for c in OFFLINE_CASES])
def test_what_tokenizing_needs_is_checked_before_a_run_dir_exists(world, tmp_path, name, overrides, env, words):
    """Offline without the encoding files or the hub: one line before anything is written, not a
    failed run directory a second later."""
    before = snapshot(world["out"])
    res = run_ablate("run", *TINY, f"out_dir={world['out']}", *overrides, env=env(tmp_path))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert all(w in lines[0] for w in words), lines[0]
    assert snapshot(world["out"]) == before
