"""`ablate bench` times the trainer's own step and reports tokens/s, MFU, memory;
--reference and --vs/--axes alternate contenders in one process. Ratios are reported, never
asserted: timings on a shared machine are noise."""

from __future__ import annotations

import json

import pytest

from conftest import TINY, compose, invoke_ablate, run_ablate

KEYS = ("tokens_per_s", "step_ms", "flops_per_token", "peak_memory_bytes", "params", "achieved_flops")
FAST = ["--steps", "2", "--warmup", "1", "--rounds", "2"]


def bench_json(*args: str) -> dict:
    res = run_ablate("bench", *TINY, *FAST, "--json", *args)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_bench_json_reports_positive_speed_and_no_cpu_mfu():
    r = bench_json()
    for key in KEYS:
        assert isinstance(r[key], (int, float)) and r[key] > 0, key
    assert r["tokens_per_step"] == 4 * 32  # TINY: batch 4 x seq 32
    assert r["steps"] == 2 and r["loss_finite"] is True
    assert r["mfu"] is None and r["peak_flops"] is None
    assert r["peak_flops_source"].startswith("CPU: no MFU")  # and it says why


def test_reference_has_the_same_dimensions_and_gives_a_ratio():
    r = bench_json("--reference")
    ref = r["reference"]
    assert ref["params"] == r["params"]  # the plain-PyTorch GPT matches our gpt2 exactly
    assert ref["tokens_per_s"] > 0 and ref["loss_finite"] is True
    assert r["ratio"] > 0 and r["ratio_best"] > 0 and len(r["round_ratios"]) == 2
    assert ref["differs_on"] == []  # the default is arch=gpt2: like for like


def test_reference_says_when_the_architectures_differ():
    from ablate.measure.bench import reference_differences

    assert reference_differences(compose(["norm=rmsnorm", "attn=gqa"])) == ["norm=rmsnorm", "attn=gqa"]
    assert set(reference_differences(compose(["arch=llama"]))) >= {"norm=rmsnorm", "act=swiglu", "pos=rope"}


def test_vs_and_axes_time_each_variant_against_the_baseline():
    r = bench_json("--axes", "--only", "act=swiglu", "--only", "pos=rope", "--vs", "norm=rmsnorm")
    rows = {row["variant"]: row for row in r["rows"]}
    assert set(rows) == {"norm=rmsnorm", "act=swiglu", "pos=rope"}
    for row in rows.values():
        assert row["tokens_per_s"] > 0 and row["ratio"] > 0
        # what FLOPs alone predict, from the variant's own count (inspect's), and the remainder
        assert row["flops_ratio"] == pytest.approx(r["baseline"]["flops_per_token"] / row["flops_per_token"])
        assert row["efficiency"] == pytest.approx(row["ratio"] / row["flops_ratio"])
    assert rows["pos=rope"]["params"] < r["baseline"]["params"]  # no learned position table
    assert rows["norm=rmsnorm"]["flops_per_token"] == inspect_flops("norm=rmsnorm")


def inspect_flops(*overrides: str) -> int:
    res = run_ablate("inspect", *TINY, *overrides, "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["flops_per_token"]


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "--steps must be >= 1"),
    (["--reference", "--axes"], "pick one"),
    (["norm=nope"], "norm"),
    (["--vs", "act=nope"], "act"),
])
def test_bad_input_is_one_line(args, message):
    res = invoke_ablate("bench", *TINY, *args)  # refused before anything is timed
    assert res.returncode != 0
    assert res.stderr.strip().startswith("error:") and message in res.stderr
    assert "Traceback" not in res.stderr


def test_bench_times_the_trainers_own_step(monkeypatch):
    """No separate loop: every timed step goes through Trainer.train_step and apply_update."""
    from ablate.measure import bench
    from ablate.train.trainer import Trainer

    calls = {"train_step": 0, "apply_update": 0}
    for name in calls:
        original = getattr(Trainer, name)

        def counted(self, *a, _orig=original, _name=name, **k):
            calls[_name] += 1
            return _orig(self, *a, **k)

        monkeypatch.setattr(Trainer, name, counted)
    r = bench.bench(compose(TINY), steps=3, warmup=2, rounds=3)
    assert calls == {"train_step": 5, "apply_update": 5}
    assert r["steps"] == 3 and r["warmup"] == 2


@pytest.mark.parametrize("name, precision, peak", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989e12),
    ("NVIDIA H100 PCIe", "bf16", 756e12),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312e12),
    ("NVIDIA A100-SXM4-80GB", "fp32", 19.5e12),
    ("Some Future GPU", "bf16", None),
])
def test_gpu_peak_table_matches_specific_names_first(name, precision, peak):
    from ablate.measure.bench import gpu_peak

    assert gpu_peak(name, precision).flops == peak


def test_diagnostics_are_off_in_bench_unless_asked_and_then_timed(monkeypatch):
    """`ablate bench --vs train.diagnostics_every=N` prices diagnostics: they run inside the
    timed steps, and a full row (update ratios included) is produced each time."""
    from ablate.measure import bench
    from ablate.train.diagnostics import Diagnostics

    rows = []
    original = Diagnostics.__call__

    def recorded(self, trainer, step):
        finish = original(self, trainer, step)
        trainer.sinks = type("Rows", (), {"log": staticmethod(rows.append)})()
        return finish

    monkeypatch.setattr(Diagnostics, "__call__", recorded)
    bench.bench(compose(TINY), steps=4, warmup=1, rounds=1)
    assert rows == []  # off by default
    bench.bench(compose([*TINY, "train.diagnostics_every=2"]), steps=4, warmup=1, rounds=1)
    assert len(rows) >= 2 and all(any(k.startswith("diag/update_ratio/") for k in r) for r in rows)


def test_bench_needs_no_corpus_and_no_tokenizer_files(tmp_path):
    """Synthetic batches: `ablate bench tokenizer=gpt2` works offline without tiktoken's files
    (only the vocab size matters), and a data source that is not there does not matter."""
    empty = tmp_path / "tiktoken-cache"
    empty.mkdir()
    env = {"TIKTOKEN_CACHE_DIR": str(empty), "HTTPS_PROXY": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
           "ABLATE_CACHE": str(tmp_path / "cache")}
    res = run_ablate("bench", *TINY, *FAST, "--json", "tokenizer=gpt2", "data=fineweb_edu", env=env)
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    assert r["tokens_per_s"] > 0 and r["params"] > 50257 * 32  # the GPT-2 vocab's embedding
