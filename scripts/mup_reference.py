"""muP as the `mup` package (github.com/microsoft/mup, PyPI `mup` 1.0.0) builds it, recorded as
numbers for tests/test_parametrization.py (the package is not a dependency of ablate).

A GPT-2 model of ablate's default architecture (pre-norm, LayerNorm, learned positions, GELU
MLP, biases) is written here in plain torch with the package's own machinery: MuSharedReadout
(tied) or MuReadout (untied, lm_head), set_base_shapes(model, base, delta=delta), the init
re-drawn with mup.init.normal_ after it (the package's README recipe), and MuAdamW over
nanoGPT's decay / no-decay groups. Attention is left to the user by the package; its Transformer
example scales the logits by sqrt(attn_mult) / head_dim, here with attn_mult = the base's head_dim
(so the base keeps 1/sqrt(head_dim)). Written to the golden file, per model (tied and untied, at
width 128 against base 32, delta 64; 2 layers, 2 heads, d_ff 4 x width):

- per parameter: the factor mup.init.normal_ puts on the std it is given (`init_scale`),
  MuAdamW's LR and weight-decay multipliers (`lr_mult`, `wd_mult`);
- the readout's multiplier on its input (`logit_mult`);
- `losses` and the final per-parameter norms (`final_norms`) of 5 MuAdamW steps (constant LR,
  no clipping) on one random batch, the reference started from ablate's own initial weights
  (seed 0) copied in by name: what ablate's optimizer and forward pass must reproduce.

    /work/main/.venv/bin/pip install --no-deps --target /tmp/mup-pkg mup
    PYTHONPATH=/tmp/mup-pkg .venv/bin/python scripts/mup_reference.py    # writes the golden file
    PYTHONPATH=/tmp/mup-pkg .venv/bin/python scripts/mup_reference.py --check   # compares, writes nothing
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
GOLDEN = ROOT / "tests" / "golden" / "mup_reference.json"
SETTING = dict(width=128, base_width=32, delta_width=64, n_layers=2, n_heads=2, vocab=64, seq_len=16,
               batch=4, steps=5, lr=1e-2, weight_decay=0.1, betas=[0.9, 0.95], eps=1e-8, seed=0)


class Attention(nn.Module):
    def __init__(self, d: int, n_heads: int, base_head_dim: int):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d // n_heads
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.scale = math.sqrt(base_head_dim) / self.head_dim  # the example's sqrt(attn_mult) / head_dim

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = (t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2) for t in self.qkv(x).split(d, -1))
        att = (q @ k.transpose(-2, -1)) * self.scale
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(B, T, d))


class FFN(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return self.down(F.gelu(self.up(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, d: int, n_heads: int, base_head_dim: int):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(d), Attention(d, n_heads, base_head_dim)
        self.norm2, self.ffn = nn.LayerNorm(d), FFN(d)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class Positions(nn.Module):
    def __init__(self, T: int, d: int):
        super().__init__()
        self.emb = nn.Embedding(T, d)


class ReferenceGPT(nn.Module):
    """Parameter names as ablate's Transformer names them, so weights copy across by name."""

    def __init__(self, d: int, tied: bool, s: dict = SETTING):
        from mup import MuReadout, MuSharedReadout

        super().__init__()
        base_head_dim = s["base_width"] // s["n_heads"]
        self.tok_emb, self.pos = nn.Embedding(s["vocab"], d), Positions(s["seq_len"], d)
        self.blocks = nn.ModuleList(Block(d, s["n_heads"], base_head_dim) for _ in range(s["n_layers"]))
        self.final_norm = nn.LayerNorm(d)
        self.lm_head = MuSharedReadout(self.tok_emb.weight, bias=False) if tied else \
            MuReadout(d, s["vocab"], bias=False)

    def forward(self, idx):
        x = self.tok_emb(idx) + self.pos.emb.weight[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.final_norm(x))


def reference(tied: bool, s: dict = SETTING) -> ReferenceGPT:
    """The target model with the package's base shapes, re-initialized with mup.init (README)."""
    import mup

    model = ReferenceGPT(s["width"], tied)
    mup.set_base_shapes(model, ReferenceGPT(s["base_width"], tied), delta=ReferenceGPT(s["delta_width"], tied))
    for name, p in model.named_parameters():
        if p.dim() == 2:
            mup.init.normal_(p, std=0.02)
    return model


def init_scale(p: torch.Tensor) -> float:
    """The factor mup.init.normal_ puts on the std it is given: its draw over torch's own, same seed."""
    import mup

    saved = p.detach().clone()
    torch.manual_seed(1234)
    mup.init.normal_(p, std=1.0)
    theirs = p.detach().clone()
    torch.manual_seed(1234)
    with torch.no_grad():
        ours = p.normal_(0.0, 1.0).clone()
        p.copy_(saved)
    return float(theirs.norm() / ours.norm())


def optimizer(model: nn.Module, s: dict = SETTING):
    from mup import MuAdamW

    named = list(model.named_parameters())
    groups = [{"params": [p for _, p in named if p.dim() >= 2]},
              {"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0}]
    return MuAdamW(groups, lr=s["lr"], weight_decay=s["weight_decay"], betas=tuple(s["betas"]), eps=s["eps"])


def rules(model: nn.Module, opt, s: dict = SETTING) -> dict:
    out = {}
    for name, p in model.named_parameters():
        group = next(g for g in opt.param_groups if any(q is p for q in g["params"]))
        out[name] = {"init_scale": init_scale(p), "lr_mult": group["lr"] / s["lr"],
                     "wd_mult": group["weight_decay"] / s["weight_decay"] if group["weight_decay"] else None}
    return out


def logit_mult(model: ReferenceGPT) -> float:
    x = torch.randn(3, model.final_norm.normalized_shape[0])
    with torch.no_grad():
        return float((model.lm_head(x) / F.linear(x, model.lm_head.weight)).median())


def batches(s: dict = SETTING) -> list[torch.Tensor]:
    """One random batch at every step (as the package's get_coord_data): the loss falls as it is
    memorized, so the updates, not the init, decide the trajectory."""
    g = torch.Generator().manual_seed(s["seed"])
    return [torch.randint(0, s["vocab"], (s["batch"], s["seq_len"] + 1), generator=g)] * s["steps"]


def ablate_spec(tied: bool, s: dict = SETTING):
    from ablate.model.spec import ModelSpec

    return ModelSpec(vocab_size=s["vocab"], d_model=s["width"], n_layers=s["n_layers"], n_heads=s["n_heads"],
                     n_kv_heads=s["n_heads"], d_ff=4 * s["width"], max_seq_len=s["seq_len"], tied=tied,
                     base_width=s["base_width"], base_depth=s["n_layers"], param="mup")


def train(model: nn.Module, opt, logits_of) -> tuple[list[float], dict]:
    losses = []
    for b in batches():
        loss = F.cross_entropy(logits_of(model, b[:, :-1]).flatten(0, 1), b[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {n: p.detach().norm().item() for n, p in model.named_parameters()}


def record(tied: bool) -> dict:
    from ablate.model.transformer import Transformer

    model = reference(tied)
    opt = optimizer(model)
    out = {"params": rules(model, opt), "logit_mult": logit_mult(model)}
    ours = Transformer(ablate_spec(tied), seed=SETTING["seed"])
    with torch.no_grad():  # the same starting point: ablate's seed-0 weights
        own = dict(ours.named_parameters())
        for name, p in model.named_parameters():
            p.copy_(own[name])
    out["losses"], out["final_norms"] = train(model, opt, lambda m, x: m(x))
    return out


def ablate_trajectory(tied: bool) -> tuple[list[float], dict]:
    """ablate's model and optimizer on the same batches (what the test runs)."""
    from omegaconf import OmegaConf

    from ablate.model.transformer import Transformer
    from ablate.train.optimizer import build_optimizer

    s = SETTING
    model = Transformer(ablate_spec(tied), seed=s["seed"])
    cfg = OmegaConf.create(dict(lr=s["lr"], weight_decay=s["weight_decay"], beta1=s["betas"][0],
                                beta2=s["betas"][1], compile_optimizer=False))
    return train(model, build_optimizer(model, cfg, torch.device("cpu")), lambda m, x: m(x).logits)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with ablate; do not write")
    args = parser.parse_args()
    try:
        import mup
    except ImportError:
        print("error: the mup package is not importable: pip install --no-deps --target DIR mup, "
              "then PYTHONPATH=DIR", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    golden = {"source": f"mup {getattr(mup, '__version__', '1.0.0')} (PyPI), via scripts/mup_reference.py",
              "setting": SETTING, "models": {}}
    for tied in (True, False):
        key = "tied" if tied else "untied"
        golden["models"][key] = record(tied)
        losses, norms = ablate_trajectory(tied)
        ref = golden["models"][key]
        worst = max(abs(norms[n] / v - 1) for n, v in ref["final_norms"].items())
        print(f"{key}: reference losses {[round(v, 6) for v in ref['losses']]}")
        print(f"{key}: ablate    losses {[round(v, 6) for v in losses]}; final norms within {worst:.2e}")
    if not args.check:
        GOLDEN.write_text(json.dumps(golden, indent=1) + "\n")
        print(f"wrote {GOLDEN.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
