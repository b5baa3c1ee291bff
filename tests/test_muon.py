"""Muon on logical matrices (ablate/train/optimizers/): a fused parameter's update equals
torch.optim.Muon's on its matrices as separate parameters; the adjusted LR is exactly the
formula; the realized update RMS is where Moonlight puts it; which parameters Muon takes."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from ablate.model.roles import Role, linear, tag
from ablate.train.optimizers.matrices import Matrix, matrices_of
from ablate.train.optimizers.muon import Muon

ADJUSTS = ["match_rms_adamw", "original"]


pytestmark = pytest.mark.usefixtures("one_thread")


def reference_step(weight: torch.Tensor, grads: list[torch.Tensor], pieces: list[Matrix], adjust: str,
                   **kw) -> torch.Tensor:
    """torch.optim.Muon run on each logical matrix as its own parameter (copies), with
    adjust_lr_fn passed explicitly; the matrices' values put back in the parameter's layout."""
    copies = [nn.Parameter(m.take(weight.detach()).clone()) for m in pieces]
    opt = torch.optim.Muon(copies, adjust_lr_fn=adjust, **kw)
    for g in grads:
        for c, m in zip(copies, pieces):
            c.grad = m.take(g).clone()
        opt.step()
    out = weight.detach().clone()
    for c, m in zip(copies, pieces):
        rows, offset = out if m.expert is None else out[m.expert], 0
        for a, b in m.rows:
            rows[a:b] = c.detach()[offset:offset + b - a]
            offset += b - a
    return out


def fused_step(weight: nn.Parameter, grads: list[torch.Tensor], adjust: str, **kw) -> torch.Tensor:
    opt = Muon([weight], adjust=adjust, **kw)
    for g in grads:
        weight.grad = g.clone()
        opt.step()
    return weight.detach()


def grads_like(shape, n=3, seed=0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen) for _ in range(n)]


@pytest.mark.parametrize("adjust", ADJUSTS)
@pytest.mark.parametrize("parts", [(32, 16, 16), (48, 48)], ids=["qkv-gqa", "gate_up"])
def test_a_fused_weight_updates_as_torch_muon_on_its_separate_matrices(adjust, parts):
    """q, k and v (GQA: k and v narrower than q) or gate and up, one fused weight: three steps
    (momentum, nesterov, weight decay) equal torch.optim.Muon on separate copies, bit for bit."""
    layer = linear(32, sum(parts), False, Role.INPUT, fused=parts)
    pieces = matrices_of(layer.weight)
    assert [m.shape for m in pieces] == [(n, 32) for n in parts]
    grads = grads_like(layer.weight.shape)
    kw = dict(lr=0.02, weight_decay=0.1, momentum=0.9, nesterov=True)
    expected = reference_step(layer.weight, grads, pieces, adjust, **kw)
    got = fused_step(layer.weight, grads, adjust, **kw)
    assert torch.equal(got, expected)
    # and not what one Newton-Schulz over the whole fused matrix gives
    whole = reference_step(layer.weight.detach().clone(), grads, [Matrix("", ((0, sum(parts)),), 32)], adjust, **kw)
    assert not torch.allclose(got, whole, atol=1e-4)


class InterleavedKV(nn.Module):
    """An MLA-like kv_b: per head, key rows then value rows, in one weight; it declares its key
    and value up-projections as two matrices across heads (the hook matrices.py reads)."""

    def __init__(self, heads=4, d_k=6, d_v=10, rank=16):
        super().__init__()
        self.heads, self.d_k, self.d_v = heads, d_k, d_v
        self.kv_b = nn.Linear(rank, heads * (d_k + d_v), bias=False)
        tag(self.kv_b.weight, Role.INPUT)

    def optimizer_matrices(self):
        step = self.d_k + self.d_v
        return {"kv_b.weight": {"k": [(h * step, h * step + self.d_k) for h in range(self.heads)],
                                "v": [(h * step + self.d_k, (h + 1) * step) for h in range(self.heads)]}}


@pytest.mark.parametrize("adjust", ADJUSTS)
def test_declared_and_banked_matrices_update_as_torch_muon_on_each(adjust):
    """A module's declared matrices (rows interleaved by head) and an expert bank (E, A, B):
    each matrix as torch.optim.Muon updates it alone."""
    from ablate.train.optimizers.matrices import muon_matrices

    kv = InterleavedKV()
    ((_, w, pieces),) = list(muon_matrices(kv))
    assert [(m.label, m.shape) for m in pieces] == [("k", (24, 16)), ("v", (40, 16))]
    grads = grads_like(w.shape)
    kw = dict(lr=0.01, weight_decay=0.1, momentum=0.95, nesterov=False)
    expected = reference_step(w, grads, pieces, adjust, **kw)
    opt = Muon([w], adjust=adjust, matrices={id(w): pieces}, **kw)
    for g in grads:
        w.grad = g.clone()
        opt.step()
    assert torch.equal(w.detach(), expected)

    bank = nn.Parameter(torch.randn(3, 20, 12, generator=torch.Generator().manual_seed(1)))
    tag(bank, Role.INPUT)
    experts = matrices_of(bank)
    assert [(m.expert, m.shape) for m in experts] == [(e, (20, 12)) for e in range(3)]
    grads = grads_like(bank.shape, seed=2)
    expected = reference_step(bank, grads, experts, adjust, **kw)
    assert torch.equal(fused_step(bank, grads, adjust, **kw), expected)


def test_the_adjusted_lr_is_the_formula_exactly(monkeypatch):
    """With Newton-Schulz replaced by ones, each matrix moves by exactly its adjusted LR:
    0.2 * lr * sqrt(max(A, B)) (match_rms_adamw), lr * sqrt(max(1, A / B)) (original)."""
    import ablate.train.optimizers.muon as muon

    monkeypatch.setattr(muon, "orthogonalize", lambda g, *a: torch.ones_like(g))
    parts, lr = (64, 16, 16), 0.02
    for adjust, formula in (("match_rms_adamw", lambda a, b: 0.2 * lr * math.sqrt(max(a, b))),
                            ("original", lambda a, b: lr * math.sqrt(max(1.0, a / b)))):
        layer = linear(48, sum(parts), False, Role.INPUT, fused=parts)
        with torch.no_grad():
            layer.weight.zero_()
        fused_step(layer.weight, grads_like(layer.weight.shape, n=1), adjust, lr=lr, weight_decay=0.0)
        for m in matrices_of(layer.weight):
            moved = -m.take(layer.weight.detach())
            assert torch.equal(moved, torch.full_like(moved, formula(*m.shape))), (adjust, m.shape)


@pytest.mark.parametrize("shape", [(64, 128), (128, 64), (96, 96)])
def test_a_full_rank_update_has_rms_between_0_1_and_0_25_of_the_lr(shape):
    """match_rms_adamw on a Gaussian (full-rank) gradient: RMS(update) / lr in [0.1, 0.25]
    (0.2 if Newton-Schulz were exact; bf16 and 5 quintic steps land near 0.17), and the
    diagnostics' record of it is the same number."""
    w = nn.Parameter(torch.zeros(shape))
    lr = 0.01
    opt = Muon([{"params": [w], "name": "g"}], lr=lr, weight_decay=0.0)
    opt.record_updates = True
    w.grad = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    opt.step()
    rms = w.detach().pow(2).mean().sqrt().item() / lr
    assert 0.1 <= rms <= 0.25, rms
    assert opt.update_rms["g"].item() == pytest.approx(rms, rel=1e-5)


def test_an_older_torch_is_refused_in_one_line():
    from ablate.errors import ConfigError
    from ablate.train.optimizers.optim_settings import check_torch

    with pytest.raises(ConfigError) as e:
        check_torch("muon", have=(2, 8))
    assert str(e.value) == ("optim=muon needs torch >= 2.9 (torch.optim.Muon's update and its tests); this is "
                            "torch 2.8: upgrade torch or use optim=adamw")
    check_torch("muon", have=(2, 9))
