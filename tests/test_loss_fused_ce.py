"""train.fused_ce: the unembedding + cross-entropy in chunks of rows (ablate/model/loss.py). The
same objective, reported loss and gradients as the plain path, without the full logits."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from conftest import TINY, compose, read_jsonl, run_ablate
from ablate.model.loss import linear_cross_entropy
from ablate.model.spec import ModelSpec
from ablate.model.transformer import Transformer


def model(chunk: int, **kw) -> tuple[Transformer, Transformer]:
    """(plain, fused) copies of one tiny model: same weights, different loss path."""
    torch.manual_seed(0)
    spec = ModelSpec(**{"vocab_size": 96, "d_model": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 2,
                        "d_ff": 64, "max_seq_len": 16, **kw})
    plain = Transformer(spec, seed=0)
    fused = copy.deepcopy(plain)
    fused.fused_ce, fused.ce_chunk = True, chunk
    return plain, fused


def loss_and_grads(m: Transformer, idx: torch.Tensor, autocast: bool = False):
    m.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = m(idx[:, :-1], idx[:, 1:])
    out.loss.backward()
    return out, {n: p.grad for n, p in m.named_parameters() if p.grad is not None}


IDX = torch.randint(0, 96, (3, 12), generator=torch.Generator().manual_seed(1))  # N = 3 x 11 = 33 rows


ALL = {"tied": False, "z_loss": 1e-2, "logit_softcap": 2.0}
CASES = [({}, 11), ({"tied": False}, 11), ({"z_loss": 1e-2}, 11), ({"logit_softcap": 2.0}, 11),
         (ALL, 8), (ALL, 11), (ALL, 33), (ALL, 64),  # 33 rows: chunks that do and do not divide them
         ({"mtp_heads": 2, "z_loss": 1e-2, "logit_softcap": 2.0}, 8)]


def case_id(v) -> str:
    return (",".join(f"{k}={x}" for k, x in v.items()) or "plain") if isinstance(v, dict) else str(v)


@pytest.mark.parametrize("opts, chunk", CASES, ids=case_id)
def test_fused_loss_lm_loss_and_every_gradient_equal_the_plain_path(opts, chunk):
    plain, fused = model(chunk, **opts)
    ref, ref_grads = loss_and_grads(plain, IDX)
    out, grads = loss_and_grads(fused, IDX)
    assert out.logits is None  # the full logits were never built
    torch.testing.assert_close(out.loss, ref.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.lm_loss, ref.lm_loss, rtol=1e-5, atol=1e-6)
    if opts.get("z_loss") or opts.get("mtp_heads"):
        assert out.loss - out.lm_loss > 1e-3  # the total really carries the extra terms
    assert grads.keys() == ref_grads.keys()
    assert ("lm_head.weight" in grads) == (opts.get("tied") is False)
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-6, msg=name)
    # without targets (evaluation, generation) the fused model gives the plain logits
    torch.testing.assert_close(fused(IDX).logits, plain(IDX).logits)


def test_under_bf16_autocast_it_matches_the_plain_bf16_path_and_keeps_fp32_loss_and_grads():
    plain, fused = model(10, z_loss=1e-2, logit_softcap=3.0)
    ref, ref_grads = loss_and_grads(plain, IDX, autocast=True)
    out, grads = loss_and_grads(fused, IDX, autocast=True)
    fp32, _ = loss_and_grads(model(10, z_loss=1e-2, logit_softcap=3.0)[1], IDX)
    assert out.loss.dtype == out.lm_loss.dtype == torch.float32
    assert out.loss.item() != fp32.loss.item()  # the matmuls really ran in bf16
    torch.testing.assert_close(out.loss, ref.loss, rtol=0, atol=5e-3)
    torch.testing.assert_close(out.lm_loss, ref.lm_loss, rtol=0, atol=5e-3)
    for name, g in ref_grads.items():
        assert grads[name].dtype == torch.float32  # the parameters' dtype
        rel = (grads[name] - g).norm() / g.norm()
        assert rel < 2e-2, (name, rel.item())  # a few bf16 roundings apart


def test_bf16_inputs_get_bf16_gradients():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(20, 16, generator=g).bfloat16().requires_grad_()
    w = torch.randn(50, 16, generator=g).bfloat16().requires_grad_()
    y = torch.randint(0, 50, (20,), generator=g)
    loss, lm = linear_cross_entropy(h, w, y, chunk=7)
    loss.backward()
    assert loss.dtype == torch.float32 and h.grad.dtype == w.grad.dtype == torch.bfloat16
    ref_h, ref_w = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    F.cross_entropy(ref_h @ ref_w.T, y).backward()
    torch.testing.assert_close(h.grad.float(), ref_h.grad, rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(w.grad.float(), ref_w.grad, rtol=2e-2, atol=2e-3)


def test_the_gradient_is_scaled_by_the_incoming_one_and_lm_loss_has_none():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(9, 8, generator=g, requires_grad=True)
    w = torch.randn(30, 8, generator=g, requires_grad=True)
    y = torch.randint(0, 30, (9,), generator=g)
    loss, lm = linear_cross_entropy(h, w, y, chunk=4, z_loss=0.1)
    (loss / 4).backward()  # as under gradient accumulation
    ref_h, ref_w = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    logits = ref_h @ ref_w.T
    ref = F.cross_entropy(logits, y) + 0.1 * torch.logsumexp(logits, -1).pow(2).mean()
    (ref / 4).backward()
    torch.testing.assert_close(h.grad, ref_h.grad)
    torch.testing.assert_close(w.grad, ref_w.grad)
    assert not lm.requires_grad  # a reported number; the objective is `loss`
    with torch.no_grad():  # no gradients are computed (or kept) without grad mode
        loss2, _ = linear_cross_entropy(h, w, y, chunk=4, z_loss=0.1)
    assert loss2.grad_fn is None and loss2.item() == pytest.approx(loss.item())


class PeakBytes(TorchDispatchMode):
    """Peak bytes of the tensors that ops allocate while active (forward and backward), counted
    per storage from creation until it is freed: the extra memory a computation needs. Views and
    in-place results (outputs sharing an input's storage) allocate nothing."""

    def __init__(self):
        super().__init__()
        self.live: dict[StorageWeakRef, int] = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for ref in [r for r in self.live if r.expired()]:
            del self.live[ref]
        inputs = {StorageWeakRef(t.untyped_storage()) for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                ref = StorageWeakRef(st)
                if ref not in inputs:
                    self.live.setdefault(ref, st.nbytes())
        self.peak = max(self.peak, sum(self.live.values()))
        return out


@pytest.mark.parametrize("z_loss, softcap", [(0.0, None), (1e-3, 5.0)])
def test_the_fused_path_needs_a_fraction_of_the_plain_paths_memory_at_a_large_vocab(z_loss, softcap):
    N, d, V, chunk = 512, 32, 32768, 64
    g = torch.Generator().manual_seed(0)
    h = torch.randn(N, d, generator=g, requires_grad=True)
    w = (torch.randn(V, d, generator=g) * 0.02).requires_grad_()
    y = torch.randint(0, V, (N,), generator=g)
    peaks = {}
    for name in ("plain", "fused"):
        h.grad = w.grad = None
        with PeakBytes() as mem:
            if name == "plain":
                F.cross_entropy(F.linear(h, w).float(), y).backward()
            else:
                linear_cross_entropy(h, w, y, chunk, z_loss, softcap)[0].backward()
        peaks[name] = mem.peak
    logits_bytes, chunk_bytes, w_bytes = N * V * 4, chunk * V * 4, V * d * 4
    assert peaks["plain"] >= 2 * logits_bytes  # logits and their gradient, at least
    # one or two chunk-sized buffers (soft-capping keeps tanh) plus d(loss)/dW and its scaled copy
    assert peaks["fused"] <= (2 if softcap else 1) * chunk_bytes + 2 * w_bytes + N * d * 4 * 2
    assert peaks["fused"] < logits_bytes / 2


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])  # aot_eager: functionalized, as inductor
def test_it_traces_under_torch_compile(backend):
    plain, fused = model(8, z_loss=1e-2, logit_softcap=2.0, mtp_heads=1)
    ref, ref_grads = loss_and_grads(plain, IDX)
    torch._dynamo.reset()
    compiled = torch.compile(fused, backend=backend, fullgraph=True)  # one graph: no breaks
    try:
        compiled.zero_grad(set_to_none=True)
        out = compiled(IDX[:, :-1], IDX[:, 1:])
        out.loss.backward()
    finally:
        torch._dynamo.reset()
    assert out.logits is None
    torch.testing.assert_close(out.loss, ref.loss)
    torch.testing.assert_close(out.lm_loss, ref.lm_loss)
    for name, p in fused.named_parameters():
        torch.testing.assert_close(p.grad, ref_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_a_fused_training_run_follows_the_plain_loss_curve(tmp_path):
    """20 fixed-seed steps through the CLI, with an evaluation (the plain path) on the way."""
    rows = {}
    for fused in ("false", "true"):
        run_dir = tmp_path / fused
        res = run_ablate("run", *TINY, "train.steps=20", "train.eval_every=10", f"train.fused_ce={fused}",
                         "train.ce_chunk=48", f"hydra.run.dir={run_dir}")
        assert res.returncode == 0, res.stderr
        rows[fused] = read_jsonl(run_dir / "metrics.jsonl")
    plain, fused = rows["false"], rows["true"]
    curve = [(r["step"], r["train_loss"]) for r in plain if "train_loss" in r]
    assert len(curve) == 20 and curve[-1][1] < curve[0][1] - 0.5  # it learned something
    for key in ("train_loss", "val_loss", "grad_norm"):
        a = [(r["step"], r[key]) for r in plain if key in r]
        b = [(r["step"], r[key]) for r in fused if key in r]
        assert [s for s, _ in a] == [s for s, _ in b] and a, key
        for (step, x), (_, y) in zip(a, b):
            assert abs(x - y) <= 2e-5 * abs(x), (key, step, x, y)  # fp32 summation-order noise
    assert plain != fused  # ... which shows the fused path ran: a different order of fp32 sums


def test_ce_chunk_must_be_positive_and_fused_ce_is_not_part_of_the_variant(tmp_path):
    from ablate.config.schema import validate
    from ablate.errors import ConfigError
    from ablate.analysis import compare_dirs
    from compare_fixtures import BASE, PAIRED, set_config, write_run

    with pytest.raises(ConfigError, match="train.ce_chunk must be a positive integer"):
        validate(compose(["train.ce_chunk=0"], validate=False))
    root = tmp_path / "runs"
    for s, v in BASE.items():
        write_run(root, f"base_s{s}", {}, s, v)
    for s, v in PAIRED.items():  # the variant trained with the fused loss
        d = write_run(root, f"rms_s{s}", {"norm": "rmsnorm"}, s, v)
        set_config(d, "train.fused_ce", True)
        set_config(d, "train.ce_chunk", 256)
    rows = compare_dirs([root])
    assert rows.mixed == {} and len(rows) == 2  # compared, not refused as mixed
