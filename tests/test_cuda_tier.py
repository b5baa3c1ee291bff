"""The cuda tier. What CPU tests cannot see: bf16 + torch.compile (Inductor) on a GPU,
every axis option compiled, FlexAttention against the explicit path, deterministic CUDA training
and resume, `bench --axes` without recompile fallback. Skipped where torch.cuda.is_available()
is false (tests/conftest.py); run with `pytest -m cuda`."""

from __future__ import annotations

import json
import signal
import statistics

import pytest
import torch

from conftest import (PRESET_DEPTH, TINY, read_jsonl, read_summary as summary, run_ablate, scripted_trainer,
                      stop_after_first_checkpoint, weights_hash)

pytestmark = pytest.mark.cuda

# TINY on the GPU (its steps are set per test); four heads so that gqa has a KV group.
GPU = [o for o in TINY if not o.startswith(("train.device", "train.steps", "model.n_heads"))] + [
    "train.device=cuda", "model.n_heads=4"]
COMPILED = ["train.precision=bf16", "train.compile=true", "train.flex_attention=true"]


def test_default_preset_bf16_compiled_run(tmp_path):
    run_dir = tmp_path / "run"
    res = run_ablate("run", "train.steps=60", "train.log_every=5", "train.eval_every=30", "logger=none",
                     "train.progress=false", "train.device=cuda", *COMPILED, f"hydra.run.dir={run_dir}")
    assert res.returncode == 0, res.stderr
    assert "fell back to eager" not in res.stderr
    s = summary(run_dir)
    assert s["status"] == "completed" and s["device"].startswith("cuda") and s["precision"] == "bf16"
    assert s["compile"] is True and s["compile_fallback"] is False and s["compile_s"] > 0
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "tokens_per_s" in r]
    # the first window holds the compile; the summary is the steady state of the others
    assert s["tokens_per_s"] == pytest.approx(statistics.median(r["tokens_per_s"] for r in rows[1:]), rel=0.15)
    assert all(0 < r["mfu"] < 1 for r in rows[1:]) and 0 < s["mfu"] < 1
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]


def _axis_runs() -> list[str]:
    from ablate.config.axes import list_axes

    runs = [" ".join([f"{row['group']}={o}", *PRESET_DEPTH.get(o, [])]) for row in list_axes()
            if row["axis"] or row["group"] == "arch" for o in row["options"] if o != row["default"]]
    # the stability keys (README "Diagnostics and stability options"); soft-capping and ALiBi
    # take FlexAttention on CUDA, inside the compiled model
    return runs + ["model.z_loss=1e-4", "model.attn_softcap=20", "model.logit_softcap=30",
                   "model.emb_scale=true", "model.depth_scaled_init=false", "act=swiglu model.act_clamp=10",
                   "model.mtp_heads=2", "model.parallel_block=true", "pos=alibi model.attn_softcap=20",
                   # a sliding window's band through FlexAttention's block mask, compiled
                   "pos=rope attn.window=8 attn.global_every=2"]


@pytest.mark.parametrize("variant", _axis_runs())
def test_every_axis_option_trains_compiled_on_cuda(tmp_path, variant):
    """All in one process, as in-process sweep jobs run: each compiles afresh, none falls back."""
    trainer = scripted_trainer(tmp_path, *variant.split(), *GPU, *COMPILED, "train.steps=3")
    out = trainer.fit()
    assert out.status == "completed", out.reason
    assert trainer.compiled and out.result.compile_fallback is False, out.result
    assert torch.isfinite(torch.tensor(out.result.train_loss))


def outputs_and_grads(attn, x, ctx, explicit: bool):
    """The attention's output and its input's gradient, on the explicit path (forced by
    record_max_logit) or the fused one."""
    attn.record_max_logit = explicit
    y = attn(x, ctx)
    (gx,) = torch.autograd.grad(y.square().sum(), x)
    return y.detach(), gx


@pytest.mark.parametrize("pos, softcap, n_kv", [("alibi", None, 4), ("learned", 5.0, 4),
                                                ("alibi", 3.0, 2), ("alibi", None, 1)])
def test_flex_attention_matches_the_explicit_path_on_cuda(pos, softcap, n_kv):
    """The model's CUDA path for ALiBi / soft-capping (FlexAttention, compiled) against the
    explicit one (forced by record_max_logit), forward and gradients, in fp32 without TF32."""
    from ablate.model.attention import CausalSelfAttention
    from ablate.model import options
    from ablate.model.spec import ModelSpec

    spec = ModelSpec(vocab_size=64, d_model=64, n_layers=1, n_heads=4, n_kv_heads=n_kv, d_ff=128,
                     max_seq_len=256, pos=pos, attn_softcap=softcap)
    dev = torch.device("cuda")
    from ablate.model import flex

    flex.enable(True)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        torch.manual_seed(0)
        attn = CausalSelfAttention(spec).to(dev)
        ctx = options.get("pos", pos).build(spec).to(dev).context(128, dev, torch.float32)
        x = torch.randn(2, 128, 64, device=dev, requires_grad=True)
        results = [outputs_and_grads(attn, x, ctx, explicit) for explicit in (False, True)]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        flex.enable(False)
    torch.testing.assert_close(results[0][0], results[1][0], atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(results[0][1], results[1][1], atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("pos, softcap, n_kv, window", [("rope", None, 4, 64), ("alibi", None, 2, 64),
                                                       ("learned", 5.0, 1, 200), ("alibi", 3.0, 4, 1)])
def test_flex_sliding_window_matches_the_explicit_band_on_cuda(pos, softcap, n_kv, window):
    """A sliding layer's CUDA path (FlexAttention with the band's block mask, compiled) against
    the explicit path's band (forced by record_max_logit), forward and gradients, T = 512: blocks
    wholly outside the window are skipped, partial ones masked; the flex path was taken."""
    from ablate.model import flex, options
    from ablate.model.spec import ModelSpec

    spec = ModelSpec(vocab_size=64, d_model=64, n_layers=1, n_heads=4, n_kv_heads=n_kv, d_ff=128,
                     max_seq_len=512, pos=pos, attn_softcap=softcap, settings={"attn": {"window": window}})
    dev = torch.device("cuda")
    flex.enable(True)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    calls = []
    real = flex.sliding_block_mask
    try:
        torch.manual_seed(0)
        attn = options.get("attn", spec.attn).build(spec, 0).to(dev)
        assert attn.window == window
        ctx = options.get("pos", pos).build(spec).to(dev).context(512, dev, torch.float32)
        x = torch.randn(2, 512, 64, device=dev, requires_grad=True)
        flex.sliding_block_mask = lambda *a: calls.append(a) or real(*a)
        results = [outputs_and_grads(attn, x, ctx, explicit) for explicit in (False, True)]
    finally:
        flex.sliding_block_mask = real
        torch.backends.cuda.matmul.allow_tf32 = tf32
        flex.enable(False)
    assert [c[:2] for c in calls] == [(512, window)]  # once: the explicit pass takes no flex
    torch.testing.assert_close(results[0][0], results[1][0], atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(results[0][1], results[1][1], atol=2e-3, rtol=2e-3)


def _curve_and_weights(run_dir):

    rows = [(r["step"], r["train_loss"], r["grad_norm"]) for r in read_jsonl(run_dir / "metrics.jsonl")
            if "train_loss" in r]
    return rows, weights_hash(run_dir)


DETERMINISTIC = [*GPU, *COMPILED, "train.deterministic=true", "dropout=on"]


def test_deterministic_cuda_runs_are_bit_identical(tmp_path):
    results = []
    for name in ("a", "b"):
        res = run_ablate("run", *DETERMINISTIC, "train.steps=40", f"hydra.run.dir={tmp_path / name}")
        assert res.returncode == 0, res.stderr
        assert summary(tmp_path / name)["deterministic"] is True
        results.append(_curve_and_weights(tmp_path / name))
    assert len(results[0][0]) == 40 and results[0] == results[1]


def test_deterministic_resume_is_bit_exact_on_cuda(tmp_path):

    # enough steps after the first checkpoint (step 20) for the stop signal to land mid-run
    args = [*DETERMINISTIC, "train.steps=600", "train.ckpt_every=20"]
    res = run_ablate("run", *args, f"hydra.run.dir={tmp_path / 'ref'}")
    assert res.returncode == 0, res.stderr
    run = tmp_path / "run"
    stop_after_first_checkpoint(("run", *args, f"hydra.run.dir={run}"), signal.SIGTERM, run)
    res = run_ablate("run", *args, f"hydra.run.dir={run}")
    assert res.returncode == 0, res.stderr
    assert summary(run)["resumed_from"] and summary(run)["status"] == "completed"
    assert _curve_and_weights(run) == _curve_and_weights(tmp_path / "ref")


def test_bench_axes_compiles_every_variant_without_fallback():
    """More variants than dynamo's recompile limit (8), in one process."""
    res = run_ablate("bench", *GPU, *COMPILED, "--axes", "--only", "norm", "--only", "act",
                     "--only", "pos", "--steps", "4", "--warmup", "2", "--rounds", "2", "--json")
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    assert len(r["rows"]) >= 10 and r["compile_fallbacks"] == 0
    assert all(row.get("compile_fallback") is False for row in r["rows"] if "error" not in row)


def _bf16_curve(tmp_path, *overrides) -> list[float]:
    trainer = scripted_trainer(tmp_path, *GPU, *COMPILED, "train.steps=20", "train.log_every=1", *overrides)
    out = trainer.fit()
    assert out.status == "completed" and out.result.compile_fallback is False, (out.reason, out.result)
    return [r["train_loss"] for r in trainer.sinks.rows if "train_loss" in r]


@pytest.mark.parametrize("setting", ["train.compile_mode=reduce-overhead", "train.compile_mode=max-autotune",
                                     "train.compile_optimizer=true",
                                     "train.compile_optimizer=true train.compile_mode=reduce-overhead",
                                     "train.sdpa_backend=flash", "train.sdpa_backend=efficient",
                                     "train.sdpa_backend=cudnn", "train.sdpa_backend=math"])
def test_each_speed_setting_trains_the_same_curve_on_cuda(tmp_path, setting):
    """An optimisation keeps a fixed-seed curve within bf16 noise of the default path
    (CUDA graphs, each attention kernel, the compiled optimizer step)."""
    ref = _bf16_curve(tmp_path / "ref")
    assert _bf16_curve(tmp_path / "opt", *setting.split()) == pytest.approx(ref, rel=2e-2)


def test_a_kernel_that_takes_no_fp32_is_refused_in_one_line(tmp_path):
    res = run_ablate("run", *GPU, "train.precision=fp32", "train.sdpa_backend=flash", "train.steps=2",
                     "logger=none", f"hydra.run.dir={tmp_path / 'run'}")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "error: train.sdpa_backend=flash cannot run this model's attention on cuda (float32" in res.stderr


def test_auto_micro_batch_takes_the_largest_pass_that_fits():
    """GPT-2-small dims at T=1024: the whole global batch (512 sequences) cannot fit in one
    pass on any GPU of today; auto settles on a divisor that does, and that pass then runs."""
    from ablate.measure.bench import build_trainer
    from conftest import compose

    cfg = compose(["model=small", "tokenizer=gpt2", "train=gpu", "train.batch_size=128",
                   "train.grad_accum=4", "train.micro_batch=auto", "train.compile=false"])
    trainer, _, _ = build_trainer(cfg)
    m = trainer.micro_batch
    assert 1 <= m < 512 and 512 % m == 0 and trainer.grad_accum == 512 // m
    torch.cuda.reset_peak_memory_stats()
    trainer.train_step(0)
    trainer.apply_update()
    _, total = torch.cuda.mem_get_info()
    assert torch.cuda.max_memory_allocated() < total
