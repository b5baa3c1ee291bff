"""The bf16 mixed-precision path (the CUDA default) run on CPU for a few steps: matmuls in bf16
under autocast, fp32 master weights, gradients and loss. bf16 matmuls are slow on this CPU, so
the model is tiny."""

from __future__ import annotations

import json
import math

import torch

from conftest import TINY, compose, read_jsonl, run_ablate
from ablate.model.spec import ModelSpec
from ablate.model.transformer import Transformer


def test_autocast_runs_matmuls_in_bf16_and_keeps_fp32_weights_grads_and_loss():
    torch.manual_seed(0)
    model = Transformer(ModelSpec(vocab_size=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=2,
                                  d_ff=64, max_seq_len=16, norm="rmsnorm", act="swiglu", pos="rope"))
    idx = torch.randint(0, 64, (2, 16))
    ref = model(idx, idx)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        out = model(idx, idx)
    assert out.logits.dtype == torch.bfloat16  # the head ran in bf16
    assert out.loss.dtype == torch.float32  # cross-entropy in fp32
    torch.testing.assert_close(out.loss, ref.loss, atol=3e-2, rtol=0)
    assert out.loss.item() != ref.loss.item()  # it really took the low-precision path
    out.loss.backward()
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32
               for p in model.parameters() if p.grad is not None)


def test_a_bf16_run_on_cpu_trains_and_says_so(tmp_path):
    losses = {}
    for precision in ("fp32", "bf16"):
        run_dir = tmp_path / precision
        res = run_ablate("run", *TINY, "train.steps=4", f"train.precision={precision}",
                         f"hydra.run.dir={run_dir}")
        assert res.returncode == 0, res.stderr
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["precision"] == precision
        losses[precision] = [r["train_loss"] for r in read_jsonl(run_dir / "metrics.jsonl")
                             if "train_loss" in r]
    assert len(losses["bf16"]) == 4 and all(math.isfinite(v) for v in losses["bf16"])
    # same batches and init: close to the fp32 curve, but not the fp32 computation
    assert max(abs(a - b) for a, b in zip(losses["bf16"], losses["fp32"])) < 0.05
    assert losses["bf16"] != losses["fp32"]


# ---- train.deterministic and train.tf32 -------------------------------------------

def test_deterministic_runs_are_bit_identical_and_the_config_says_so(tmp_path):
    """Every op of the model has a deterministic CPU kernel (use_deterministic_algorithms would
    raise otherwise); dropout on, so the RNG stream matters too."""
    curves = []
    for name in ("a", "b"):
        run_dir = tmp_path / name
        res = run_ablate("run", *TINY, "train.steps=4", "train.deterministic=true", "dropout=on",
                         "dropout.rate=0.1", f"hydra.run.dir={run_dir}")
        assert res.returncode == 0, res.stderr
        assert "deterministic: true" in (run_dir / "config.yaml").read_text()
        curves.append([(r["step"], r["train_loss"], r["grad_norm"])
                       for r in read_jsonl(run_dir / "metrics.jsonl") if "train_loss" in r])
    assert len(curves[0]) == 4 and curves[0] == curves[1]


def test_deterministic_setting_is_applied_and_undone_by_the_next_trainer(tmp_path, monkeypatch):
    import os

    from conftest import scripted_trainer

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        t = scripted_trainer(tmp_path / "det", "train.deterministic=true", "train.steps=2")
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"  # set before any CUDA matmul
        assert t.fit().result.backend.deterministic is True
        scripted_trainer(tmp_path / "plain", "train.steps=2")  # a sweep's next job, same process
        assert not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


def _backend_flags():
    return (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision,
            torch.backends.cudnn.deterministic, torch.backends.cuda.cudnn_sdp_enabled(),
            torch.are_deterministic_algorithms_enabled())


def test_tf32_flag_reaches_torch_on_cuda_and_is_a_no_op_on_cpu():
    from ablate.run.record import BackendSettings
    from ablate.train.backends import configure_backends

    before = _backend_flags()
    cfg = compose([*TINY, "train.tf32=true"]).train
    try:
        assert configure_backends(cfg, "cpu") == BackendSettings(deterministic=False)
        assert _backend_flags() == before  # CPU: TF32 is a CUDA format; nothing changes
        assert configure_backends(cfg, "cuda").tf32 is True  # the flags exist without a GPU
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
        assert torch.backends.cudnn.conv.fp32_precision == "tf32"
        assert torch.get_float32_matmul_precision() == "high"
        configure_backends(compose([*TINY, "train.tf32=false", "train.deterministic=true"]).train, "cuda")
        assert torch.backends.cuda.matmul.fp32_precision == "ieee"
        assert torch.backends.cudnn.deterministic is True
        assert not torch.backends.cuda.cudnn_sdp_enabled()  # cuDNN attention: no deterministic backward
    finally:
        configure_backends(compose(TINY).train, "cuda")  # back to the defaults ...
        torch.backends.cuda.matmul.allow_tf32 = False  # ... and to torch's own
        torch.backends.cudnn.deterministic = False
    assert _backend_flags()[2:] == before[2:]
