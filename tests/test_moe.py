"""The MoE FFN (ablate/model/moe.py) against references written here: a per-token loop of the
routing and the experts, the dense FFN with copied weights, the balancing loss as HF and
OLMo-core define theirs, and the fair expert width by brute force."""

from __future__ import annotations

import math

import pytest
import torch

from ablate.errors import ConfigError
from ablate.model.ffn import GatedMLP, MLP
from ablate.model.moe import (BALANCE, GROUPED, IMBALANCE, LOOP, ROUTER_Z, MoE, balance_loss, build_moe,
                              expert_mm, expert_mm_wgrad, imbalance, router_z_loss)
from ablate.model import options
from ablate.model.moe_spec import (MoESettings, expert_params, fair_d_expert, moe_active_params,
                                   moe_layer_params)
from ablate.model.parametrization import hidden_rule
from ablate.model.roles import Role, glorot_bounds, init_weights, role_of
from ablate.model.spec import ModelSpec

D = 32


def spec_of(act: str = "swiglu", bias: bool = False, **kw) -> ModelSpec:
    return ModelSpec(vocab_size=64, d_model=D, n_layers=2, n_heads=2, n_kv_heads=2, d_ff=64,
                     max_seq_len=16, act=act, bias=bias, **kw)


def moe_of(spec: ModelSpec, seed: int = 0, **settings) -> MoE:
    m = build_moe(spec, spec.n_layers - 1, **settings)
    init_weights(m, 0.02, spec.n_layers, True, seed=seed)
    with torch.no_grad():
        m.router.weight.normal_(0, 0.5)  # routing that depends on the token
        for b in (m.b_in, m.b_out):
            if b is not None:
                b.normal_(0, 0.1)
    return m


def reference(m: MoE, x: torch.Tensor) -> torch.Tensor:
    """Token by token: softmax over the router's logits, the top-k, each chosen expert applied
    to the token on its own, the outputs summed with their gates."""
    act = m.act
    out = torch.zeros_like(x)
    for n in range(x.shape[0]):
        p = torch.softmax(x[n] @ m.router.weight.T, dim=-1)
        top = torch.topk(p, m.k)
        gates = top.values / top.values.sum() if m.settings.renorm else top.values
        for g, e in zip(gates, top.indices):
            h = x[n] @ m.w_in[e].T + (0 if m.b_in is None else m.b_in[e])
            if m.gated:
                a, u = h[:m.d_expert], h[m.d_expert:]
                h = act(a) * u
            else:
                h = act(h)
            out[n] += g * (h @ m.w_out[e].T + (0 if m.b_out is None else m.b_out[e]))
    return out


@pytest.mark.parametrize("act,bias,renorm,path", [
    ("swiglu", False, False, GROUPED), ("swiglu", True, True, GROUPED), ("gelu", True, False, GROUPED),
    ("reglu", False, True, LOOP), ("gelu", False, False, LOOP)])
def test_moe_equals_a_per_token_reference(act, bias, renorm, path):
    torch.manual_seed(0)
    m = moe_of(spec_of(act, bias), experts=4, top_k=2, renorm=renorm)
    m.path = path
    x = torch.randn(2, 8, D)
    y = m(x)
    torch.testing.assert_close(y.view(-1, D), reference(m, x.view(-1, D)), rtol=1e-5, atol=1e-6)
    # and the gradients of every parameter and of the input
    xr = x.clone().requires_grad_(True)
    m(xr).square().sum().backward()
    ours = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    xr2 = x.clone().view(-1, D).requires_grad_(True)
    reference(m, xr2).square().sum().backward()
    for n, p in m.named_parameters():
        torch.testing.assert_close(ours[n], p.grad, rtol=1e-4, atol=1e-6, msg=n)
    torch.testing.assert_close(xr.grad.view(-1, D), xr2.grad, rtol=1e-4, atol=1e-6)


def test_expert_mm_grouped_and_loop_agree_with_empty_experts_and_unaligned_widths():
    """The grouped kernel (aligned widths) and the loop (any width) equal per-expert products,
    forward and backward, also when an expert gets no rows."""
    torch.manual_seed(0)
    for K, N in ((16, 8), (6, 5)):  # 16-byte aligned rows (the grouped kernel), and not
        x = torch.randn(10, K, requires_grad=True)
        w = torch.randn(4, N, K, requires_grad=True)
        offs = torch.tensor([3, 3, 7, 10], dtype=torch.int32)  # expert 1 gets nothing
        y = expert_mm(x, w, offs)
        bounds = [(0, 3), (3, 3), (3, 7), (7, 10)]
        ref = torch.cat([x[a:b] @ w[e].T for e, (a, b) in enumerate(bounds)])
        torch.testing.assert_close(y, ref)
        g = torch.randn_like(y)
        dx, dw = torch.autograd.grad(y, (x, w), g)
        rdx, rdw = torch.autograd.grad(ref, (x, w), g)
        torch.testing.assert_close(dx, rdx)
        torch.testing.assert_close(dw, rdw)
        assert dw[1].abs().sum() == 0
        torch.testing.assert_close(expert_mm_wgrad(g, x.detach(), offs), rdw)


def test_expert_mm_passes_torch_opcheck():
    """The custom op's fake kernel, autograd registration and schema are consistent (what
    torch.compile relies on)."""
    x, w = torch.randn(12, 16), torch.randn(3, 8, 16, requires_grad=True)
    offs = torch.tensor([4, 4, 12], dtype=torch.int32)
    torch.library.opcheck(expert_mm, (x.requires_grad_(True), w, offs))


def test_renormalized_gates_equal_the_softmax_over_the_selected_logits():
    torch.manual_seed(0)
    m = moe_of(spec_of(), experts=6, top_k=3, renorm=True)
    x = torch.randn(20, D)
    logits, probs, top_i, gates = m.route(x)
    selected = logits.float().gather(-1, top_i)  # (N, k)
    torch.testing.assert_close(gates, torch.softmax(selected, dim=-1))
    torch.testing.assert_close(gates.sum(-1), torch.ones(20))
    m_raw = moe_of(spec_of(), experts=6, top_k=3, renorm=False)
    m_raw.load_state_dict(m.state_dict())
    raw = m_raw.route(x)[3]
    torch.testing.assert_close(raw, probs.gather(-1, top_i))
    assert (raw.sum(-1) < 1).all()


@pytest.mark.parametrize("act,bias", [("swiglu", False), ("gelu", True)])
def test_one_expert_top1_at_the_dense_width_equals_the_dense_ffn(act, bias):
    torch.manual_seed(0)
    spec = spec_of(act, bias)
    dense = (GatedMLP if spec.gated else MLP)(spec, options.get("act", act))
    init_weights(dense, 0.02, 2, True, seed=0)
    m = moe_of(spec, experts=1, top_k=1, d_expert=spec.d_ff, balance="none", z_coef=0.0)
    with torch.no_grad():
        w_in = dense.gate_up if spec.gated else dense.up
        m.w_in[0].copy_(w_in.weight)
        m.w_out[0].copy_(dense.down.weight)
        if bias:
            m.b_in[0].copy_(w_in.bias)
            m.b_out[0].copy_(dense.down.bias)
    m.train()
    x = torch.randn(2, 8, D)
    torch.testing.assert_close(m(x), dense(x), rtol=1e-6, atol=1e-7)
    assert m.aux_losses() == {}


def test_balance_loss_is_one_when_balanced_whatever_the_probabilities():
    torch.manual_seed(0)
    E, k, N = 8, 2, 64
    probs = torch.softmax(3 * torch.randn(N, E), -1)  # far from uniform
    counts = torch.full((E,), N * k // E)
    assert balance_loss(probs, counts, N, k).item() == pytest.approx(1.0, abs=1e-6)
    # collapsed onto experts 0 and 1, with probabilities peaked there: higher, up to E/k
    peaked = torch.softmax(torch.tensor([8.0, 8.0] + [0.0] * (E - 2)).expand(N, E), -1)
    collapsed = torch.tensor([N, N] + [0] * (E - 2))
    assert 3.5 < balance_loss(peaked, collapsed, N, k).item() <= E / k


def test_balance_loss_is_hf_mixtral_loss_over_k():
    """HF's pooled loss (Mixtral's load_balancing_loss_func) is k times OLMo-core's normalization."""
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    torch.manual_seed(0)
    E, k = 6, 2
    m = moe_of(spec_of(), experts=E, top_k=k, aux_coef=1.0)
    m.train()
    x = torch.randn(3, 10, D)
    m(x)
    logits = m.router(x.view(-1, D))
    hf = load_balancing_loss_func((logits,), E, k)
    torch.testing.assert_close(m.aux_losses()[BALANCE] * m.moe_layers, hf / k)


def test_router_z_loss_is_the_mean_squared_logsumexp():
    logits = torch.zeros(5, 4)
    assert router_z_loss(logits).item() == pytest.approx(math.log(4) ** 2)
    logits = torch.tensor([[1.0, 2.0], [0.0, -1.0]])
    want = ((math.log(math.e + math.e ** 2)) ** 2 + (math.log(1 + math.e ** -1)) ** 2) / 2
    assert router_z_loss(logits).item() == pytest.approx(want, rel=1e-6)


def test_terms_are_weighted_and_averaged_over_moe_layers_in_training_only():
    torch.manual_seed(0)
    spec = ModelSpec(vocab_size=64, d_model=D, n_layers=4, n_heads=2, n_kv_heads=2, d_ff=64, max_seq_len=16,
                     act="swiglu")
    m = build_moe(spec, 3, experts=4, top_k=2, aux_coef=0.5, z_coef=0.25, dense_first=1)
    init_weights(m, 0.02, 4, True, seed=0)
    m.train()
    x = torch.randn(2, 8, D)
    m(x)
    logits, probs, top_i, _ = m.route(x.view(-1, D))
    counts = torch.bincount(top_i.reshape(-1), minlength=4)
    terms = m.aux_losses()
    assert set(terms) == {BALANCE, ROUTER_Z}
    # three MoE layers (dense_first=1 of 4): each reports a third of its weighted term
    torch.testing.assert_close(terms[BALANCE], 0.5 / 3 * balance_loss(probs, counts, 16, 2))
    torch.testing.assert_close(terms[ROUTER_Z], 0.25 / 3 * router_z_loss(logits))
    assert torch.equal(m.counts, counts)
    m.eval()
    m(x)
    assert m.aux_losses() == {}  # evaluation adds nothing to any objective
    assert isinstance(build_moe(spec, 0, experts=4, top_k=2, dense_first=1), GatedMLP)


def test_imbalance_is_one_balanced_and_e_over_k_collapsed():
    assert imbalance(torch.tensor([4, 4, 4, 4])).item() == 1.0
    assert imbalance(torch.tensor([8, 8, 0, 0])).item() == 2.0  # E=4, k=2: all on two experts


def test_forward_and_backward_are_deterministic_on_cpu():
    torch.manual_seed(0)
    m = moe_of(spec_of(), experts=8, top_k=2)
    m.train()
    x = torch.randn(4, 16, D)
    runs = []
    for _ in range(2):
        m.zero_grad()
        y = m(x)
        (y.square().sum() + sum(m.aux_losses().values())).backward()
        runs.append([y.detach().clone()] + [p.grad.clone() for p in m.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_compiled_equals_eager_fp32_and_bf16_autocast():
    """torch.compile sees one opaque op per grouped product (its fp32 CPU path included, where
    torch._grouped_mm's own meta kernel refuses fp32)."""
    torch.manual_seed(0)
    m = moe_of(spec_of(), experts=4, top_k=2)
    m.train()
    x = torch.randn(2, 8, D, requires_grad=True)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    y = compiled(x)
    torch.testing.assert_close(y, m(x))
    (gx,) = torch.autograd.grad(y.sum(), x)
    (rx,) = torch.autograd.grad(m(x).sum(), x)
    torch.testing.assert_close(gx, rx)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yb, rb = compiled(x), m(x)
    assert yb.dtype == torch.float32
    torch.testing.assert_close(yb, rb)


# ---- sizes, init and parametrization ---------------------------------------------------------

@pytest.mark.parametrize("gated,bias,k,multiple", [(True, False, 2, 16), (True, True, 8, 16),
                                                   (False, False, 3, 8), (True, False, 1, 64)])
def test_fair_width_is_the_nearest_multiple_in_parameters(gated, bias, k, multiple):
    for d, d_ff in ((128, 336), (96, 256), (64, 170)):
        target = expert_params(d, d_ff, gated, bias)
        widths = range(multiple, 4 * d_ff + multiple, multiple)
        best = min(widths, key=lambda w: (abs(k * expert_params(d, w, gated, bias) - target), w))
        assert fair_d_expert(d, d_ff, gated, bias, k, multiple) == best


def test_fair_width_ties_go_to_the_smaller():
    # plain, no bias: P(h) = 2*d*h; k=2, d_ff=24 -> exact h = 12, multiples 8 and 16 equally far
    assert fair_d_expert(4, 24, False, False, 2, 8) == 8


@pytest.mark.parametrize("act,bias", [("swiglu", False), ("gelu", True)])
def test_declared_counts_equal_the_built_layer(act, bias):
    spec = spec_of(act, bias)
    m = build_moe(spec, 1, experts=5, top_k=2)
    total = sum(p.numel() for p in m.parameters())
    assert total == moe_layer_params(D, m.d_expert, spec.gated, bias, 5)
    per_expert = (m.w_in[0].numel() + m.w_out[0].numel()
                  + (m.b_in[0].numel() + m.b_out[0].numel() if bias else 0))
    assert moe_active_params(D, m.d_expert, spec.gated, bias, 5, 2) == m.router.weight.numel() + 2 * per_expert


def test_banks_init_each_expert_by_its_own_fan_in():
    torch.manual_seed(0)
    m = build_moe(spec_of(), 1, experts=4, top_k=2, d_expert=48)
    assert role_of(m.w_in) is Role.INPUT and role_of(m.w_out) is Role.OUTPUT
    assert role_of(m.router.weight) is Role.ROUTER
    # xavier: each expert's gate and up are (48, 32) matrices, its down (32, 48)
    bound_in = glorot_bounds(m.w_in)
    assert bound_in.shape == (96, 1)
    torch.testing.assert_close(bound_in, torch.full((96, 1), math.sqrt(6 / (32 + 48))))
    init_weights(m, 0.02, 2, True, seed=0, scheme="xavier")
    for e in range(4):
        assert m.w_in[e].abs().max() <= math.sqrt(6 / (32 + 48)) + 1e-7
        assert m.w_out[e].abs().max() <= math.sqrt(6 / (48 + 32)) / 2 + 1e-7  # / sqrt(2L)
    # normal: N(0, 0.02); output projections / sqrt(2L); experts drawn independently
    init_weights(m, 0.02, 2, True, seed=0)
    assert m.w_in.std().item() == pytest.approx(0.02, rel=0.05)
    assert m.w_out.std().item() == pytest.approx(0.01, rel=0.05)
    assert not torch.equal(m.w_in[0], m.w_in[1])


def test_mup_takes_each_expert_and_the_router_as_hidden_matrices_of_their_own_fan_in():
    """param=mup: a bank's fan-in is its last dim (each expert a matrix), the base model's
    experts take the fair width of the base model's own d_ff, the router is scaled by its fan-in."""
    from ablate.model.transformer import Transformer

    spec = ModelSpec(vocab_size=64, d_model=64, n_layers=2, n_heads=2, n_kv_heads=2, d_ff=176, max_seq_len=16,
                     act="swiglu", ffn="moe", settings={"ffn": dict(experts=4, top_k=2)}, param="mup",
                     base_width=32, base_d_ff=80)
    with torch.device("meta"):
        rules = Transformer(spec).param_rules
    w_in, w_out, router = (rules[f"blocks.1.ffn.{n}"] for n in ("w_in", "w_out", "router.weight"))
    assert (w_in.fan_in, w_in.base_fan_in) == (64, 32)
    # the fair widths at k=2 of d_ff 176 (d 64) and of 80 (d 32): 88 and 40 exactly, ties going down
    assert (w_out.fan_in, w_out.base_fan_in) == (80, 32)
    assert (router.fan_in, router.base_fan_in, router.lr_mult) == (64, 32, 0.5)
    assert router.init_mult == pytest.approx(math.sqrt(0.5)) and w_in.init_mult == pytest.approx(math.sqrt(0.5))
    assert hidden_rule("w", "input", (8, 192, 128), {"w": (8, 96, 64)}).fan_in == 128


@pytest.mark.parametrize("settings,message", [
    (dict(experts=0), "ffn.experts must be >= 1"),
    (dict(experts=4, top_k=5), "ffn.top_k must be between 1 and ffn.experts=4"),
    (dict(top_k=0), "ffn.top_k"),
    (dict(dense_first=4), "ffn.dense_first=4"),
    (dict(dense_first=-1), "ffn.dense_first=-1"),
    (dict(d_expert=0), "ffn.d_expert"),
    (dict(balance="loss"), "ffn.balance='loss' is not one of aux, bias, none"),
    (dict(router="relu"), "ffn.router='relu' is not one of softmax, sigmoid"),
    (dict(aux_coef=-0.1), "ffn.aux_coef must be >= 0"),
    (dict(aux_scope="token"), "ffn.aux_scope='token' is not one of batch, sequence"),
    (dict(balance="bias", bias_rate=0.0), "ffn.bias_rate must be > 0"),
    (dict(balance="bias", bias_rate=-1e-3), "ffn.bias_rate must be > 0"),
    (dict(capacity=0.0), "ffn.capacity must be > 0"),
    (dict(capacity=-1.0), "ffn.capacity must be > 0"),
    (dict(shared=-1), "ffn.shared must be >= 0"),
    # one balancing form's settings with another form
    (dict(balance="aux", bias_rate=0.01), "ffn.bias_rate=0.01 is a setting of ffn.balance=bias, not of ffn.balance=aux"),
    (dict(balance="none", bias_rate=0.01), "ffn.bias_rate=0.01 is a setting of ffn.balance=bias"),
    (dict(balance="bias", aux_coef=0.1), "ffn.aux_coef=0.1 is a setting of ffn.balance=aux, not of ffn.balance=bias"),
    (dict(balance="bias", aux_scope="sequence"), "ffn.aux_scope='sequence' is a setting of ffn.balance=aux"),
])
def test_bad_settings_are_one_line_naming_the_key(settings, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        MoESettings(**settings).check(n_layers=4)
    assert "\n" not in str(e.value)


# ---- Hugging Face's MoE blocks ----------------------------------------------------------------

@pytest.mark.parametrize("family,renorm", [("qwen3_moe", False), ("qwen3_moe", True), ("mixtral", True)])
def test_the_layer_equals_hf_moe_blocks_with_copied_weights(family, renorm):
    """Qwen3-MoE (norm_topk_prob = renorm) and Mixtral (always renormalized) hold the experts as we
    do: gate_up_proj (E, 2h, d) with rows [gate; up], down_proj (E, d, h), router `gate` (E, d)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    E, k, h = 4, 2, 24
    m = moe_of(spec_of(), experts=E, top_k=k, d_expert=h, renorm=renorm).eval()
    common = dict(hidden_size=D, num_experts_per_tok=k, hidden_act="silu")
    if family == "mixtral":
        block = transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock(
            transformers.MixtralConfig(**common, num_local_experts=E, intermediate_size=h))
    else:
        block = transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock(
            transformers.Qwen3MoeConfig(**common, num_experts=E, moe_intermediate_size=h, norm_topk_prob=renorm))
    with torch.no_grad():
        block.gate.weight.copy_(m.router.weight)
        block.experts.gate_up_proj.copy_(m.w_in)
        block.experts.down_proj.copy_(m.w_out)
    x = torch.randn(2, 8, D)
    with torch.no_grad():
        torch.testing.assert_close(m(x), block.eval()(x), rtol=1e-5, atol=1e-6)


def test_loads_sum_the_micro_steps_a_step_adds_and_nothing_else():
    """Two micro-steps' counts add up; an evaluation forward in between, or a forward nobody
    added, counts nothing; a skipped step's loads are dropped."""
    from types import SimpleNamespace

    from ablate.model.moe import IMBALANCE_LAYER, ExpertLoads

    torch.manual_seed(0)
    spec = ModelSpec(vocab_size=64, d_model=D, n_layers=3, n_heads=2, n_kv_heads=2, d_ff=64, max_seq_len=16,
                     act="swiglu")
    blocks = [SimpleNamespace(ffn=build_moe(spec, i, experts=4, top_k=2, dense_first=1)) for i in range(3)]
    for b in blocks[1:]:
        init_weights(b.ffn, 0.02, 3, True, seed=0)
        with torch.no_grad():
            b.ffn.router.weight.normal_(0, 1.0)
    loads = ExpertLoads(blocks)
    assert loads.layers == [1, 2]
    x1, x2 = torch.randn(2, 8, D), torch.randn(2, 8, D)

    def counts(x):
        return torch.stack([torch.bincount(b.ffn.route(x.view(-1, D))[2].reshape(-1), minlength=4)
                            for b in blocks[1:]])

    for x in (x1, x2):
        for b in blocks[1:]:
            b.ffn(x)
        loads.add()
    for b in blocks[1:]:  # an evaluation pass: not added
        b.ffn.eval()(torch.randn(4, 8, D))
    total = loads.take()
    assert torch.equal(total, counts(x1) + counts(x2))
    assert total.sum() == 2 * 2 * 16 * 2  # layers x micro-steps x tokens x k
    assert loads.take() is None
    stats = loads.stats(total)
    per_layer = total.max(-1).values / total.float().mean(-1)
    assert stats[IMBALANCE].item() == pytest.approx(per_layer.max().item())
    assert stats[IMBALANCE_LAYER].item() == 1 + per_layer.argmax().item()
    for b in blocks[1:]:
        b.ffn(x1)
    loads.add()
    loads.discard()  # a skipped step
    assert loads.take() is None
