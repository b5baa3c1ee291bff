"""The bf16 mixed-precision path (the CUDA default) run on CPU for a few steps: matmuls in bf16
under autocast, fp32 master weights, gradients and loss. bf16 matmuls are slow on this CPU, so
the model is tiny."""

from __future__ import annotations

import json
import math

import torch

from conftest import TINY, read_jsonl, run_ablate
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
