"""Frozen training numbers of every option: a few CPU steps of each option of every axis, the arch
presets and the `model.*` stability keys, on one thread, compared with tests/golden/frozen_losses.json
(frozen from main at 107f784, before the package was regrouped and options became components).

Refactors of how options are declared, built, initialized or counted must leave these numbers
unchanged: a parameter registered in another order changes the init (init is keyed by name, the
generator is shared) or the sum in gradient clipping, and so the losses after the first step.
The counts (parameters, FLOPs/token, KV bytes) are frozen by tests/test_golden_options.py.

On the CPU that froze them the values must be identical, float for float; another CPU's kernels
round differently, so there they must agree to 1e-5 (a real change moves them far more).

A deliberate change regenerates them (`python tests/test_frozen_values.py --write`); review the diff.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "golden" / "frozen_losses.json"

# A small model where every option fits (gqa: 4 heads -> 1 KV head) and a few steps of its optimizer.
SHAPE = ["model.d_model=64", "model.n_layers=2", "model.n_heads=4", "model.max_seq_len=64",
         "train.batch_size=4", "train.seq_len=32", "train.steps=4", "train.warmup_steps=1",
         "train.eval_every=0", "train.eval_tokens=256", "logger=none", "train.progress=false",
         "train.device=cpu", "train.threads=1"]
STEPS = 4
# Fixed here, not read from the registry: a lost option fails instead of dropping its case.
CASES = [
    "norm=layernorm", "norm=rmsnorm", "norm=dyt",
    "norm_pos=pre", "norm_pos=post", "norm_pos=sandwich", "norm_pos=reordered",
    "act=relu", "act=gelu", "act=silu", "act=swiglu", "act=geglu", "act=reglu",
    "pos=learned", "pos=sinusoidal", "pos=rope", "pos=alibi", "pos=nope",
    "attn=mha", "attn=gqa", "attn=mqa", "attn=mla",
    "ffn=dense", "ffn=moe", "arch=llama ffn=moe ffn.dense_first=1 ffn.renorm=true",
    "arch=deepseek", "arch=llama ffn=moe ffn.router=sigmoid ffn.shared=1 ffn.aux_scope=sequence ffn.capacity=1.0",
    "arch=llama ffn=moe ffn.balance=bias ffn.bias_rate=0.01 ffn.capacity=1.25",
    "tie=tied", "tie=untied",
    "bias=on", "bias=off",
    "dropout=off", "dropout=on",
    "qk_norm=off", "qk_norm=on",
    "param=sp", "param=mup model.base_width=32", "param=completep model.base_width=32 model.base_depth=1",
    "arch=gpt2", "arch=llama", "arch=vaswani", "arch=deepseek_dense",
    "attn=mla pos=rope attn.q_rank=16 attn.kv_rank=24 attn.rope_dim=4 attn.decode=plain",
    # the model.* stability and structure keys
    "model.z_loss=0.001", "model.attn_softcap=20", "model.logit_softcap=30",
    "model.act_clamp=5 act=swiglu", "model.mtp_heads=2", "model.parallel_block=true",
    "model.emb_scale=true", "model.init=xavier", "model.depth_scaled_init=false",
    "norm_pos=sandwich bias=off qk_norm=on attn=mqa pos=rope act=geglu tie=untied",
    # the trainer's axis (added 2026-11-29): Muon on the hidden matrices, both LR adjustments, and mup
    "optim=muon", "optim=muon optim.adjust=original optim.adam_lr=0.003 train.lr=0.02 act=swiglu attn=gqa",
    "optim=muon param=mup model.base_width=32",
    # Muon on each expert of a bank and on MLA's matrices (kv_a's two declared, kv_b's two fused)
    "optim=muon ffn=moe attn=mla pos=rope act=swiglu",
]


def losses(case: str) -> dict:
    """Train-loss and grad-norm per step and the final validation loss of `case`, on random tokens."""
    import numpy as np
    import torch

    from conftest import compose
    from ablate.data.cache import TokenData
    from ablate.model.spec import ModelSpec
    from ablate.model.transformer import build_model
    from ablate.train.optimizers.optim_settings import OptimSpec
    from ablate.train.trainer import Trainer

    cfg = compose([*SHAPE, *case.split()])
    spec = ModelSpec.from_config(cfg, tokenizer_vocab=256)
    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(0)
    data = TokenData(train=rng.integers(0, 256, 4000).astype(np.uint16),
                     val=rng.integers(0, 256, 600).astype(np.uint16), meta={}, path=Path("."))
    trainer = Trainer(build_model(spec), cfg.train, data, None, Path("."),
                      np.ones(spec.vocab_size, dtype=np.int64), optim=OptimSpec.from_config(cfg))
    train, norms = [], []
    for step in range(STEPS):
        loss, gnorm, _ = trainer.train_step(step)
        trainer.apply_update()
        train.append(float(loss))
        norms.append(float(gnorm))
    return {"train_loss": train, "grad_norm": norms, "val_loss": float(trainer.evaluate()["val_loss"])}


def cpu() -> str:
    """The CPU, its kernels' instruction set and torch: what decides the rounding."""
    import torch

    from ablate.train.launch import _cpu_name

    return f"{_cpu_name()} {torch.backends.cpu.get_cpu_capability()} torch {torch.__version__}"


def produce() -> dict:
    return {"cpu": cpu(), "cases": {case: losses(case) for case in CASES}}


def test_every_option_trains_to_its_frozen_losses():
    golden = json.loads(GOLDEN.read_text())
    assert list(golden["cases"]) == CASES
    exact = golden["cpu"] == cpu()
    for case in CASES:
        got, want = losses(case), golden["cases"][case]
        if exact:
            assert got == want, f"{case}: the losses changed"
        else:
            for key in want:
                g, w = got[key], want[key]
                g, w = (g, w) if isinstance(w, list) else ([g], [w])
                assert all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(g, w)), f"{case}: {key} changed"


if __name__ == "__main__":
    if "--write" not in sys.argv:
        sys.exit("usage: python tests/test_frozen_values.py --write  (rewrites tests/golden/frozen_losses.json)")
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here.parent), str(here)]
    GOLDEN.write_text(json.dumps(produce(), indent=1) + "\n")
    print(f"wrote {GOLDEN} ({len(CASES)} cases)")
