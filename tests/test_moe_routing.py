"""DeepSeek's routing parts of ffn=moe (ablate/model/moe.py) against references written here and
HF's DeepseekV3MoE with copied weights: sigmoid scores renormalized over the chosen experts, the
choice bias that moves the choice and not the gates, shared experts (their counts and the fair
width), the sequence-wise balancing loss and the capacity factor."""

from __future__ import annotations

import math

import pytest
import torch

from ablate.model.moe import BALANCE, MoE, balance_loss, build_moe
from ablate.model.moe_spec import DROPPED, expert_params, fair_d_expert
from ablate.model.roles import init_weights
from ablate.model.spec import ModelSpec, active_params, count_params
from ablate.model.transformer import Transformer

D = 32


pytestmark = pytest.mark.usefixtures("one_thread")


def spec_of(**kw) -> ModelSpec:
    return ModelSpec(vocab_size=64, d_model=D, n_layers=2, n_heads=2, n_kv_heads=2, d_ff=64,
                     max_seq_len=16, act="swiglu", bias=False, **kw)


def moe_of(seed: int = 0, **settings) -> MoE:
    spec = spec_of()
    torch.manual_seed(seed)
    m = build_moe(spec, 1, **settings)
    init_weights(m, 0.02, spec.n_layers, True, seed=seed)
    with torch.no_grad():
        m.router.weight.normal_(0, 0.5)  # routing that depends on the token
    return m


def test_a_choice_bias_flips_the_choice_while_the_gate_stays_the_unbiased_score():
    m = moe_of(experts=4, top_k=1, d_expert=16, router="sigmoid", balance="bias")
    x = torch.randn(1, D)
    _, scores, chosen, gates = m.route(x)
    first = chosen.item()
    runner_up = scores[0].clone()
    runner_up[first] = -1
    second = runner_up.argmax().item()
    with torch.no_grad():  # lift the runner-up just past the first choice
        m.choice_bias[second] = (scores[0, first] - scores[0, second]).item() + 1e-3
    _, scores_b, chosen_b, gates_b = m.route(x)
    assert chosen_b.item() == second != first
    torch.testing.assert_close(scores_b, scores)  # the bias is not in the scores
    assert gates_b.item() == scores[0, second].item() == torch.sigmoid(x @ m.router.weight.T)[0, second].item()
    assert gates.item() == scores[0, first].item()


@pytest.mark.parametrize("renorm", [True, False])
def test_sigmoid_routing_shared_experts_and_bias_equal_hf_deepseek_v3_moe(renorm):
    """DeepseekV3MoE (n_group = topk_group = 1, routed_scaling_factor 1) with our weights, a
    nonzero e_score_correction_bias and two shared experts: the same output."""
    transformers = pytest.importorskip("transformers")
    E, k, h, shared = 6, 2, 16, 2
    m = moe_of(experts=E, top_k=k, d_expert=h, renorm=renorm, router="sigmoid", shared=shared,
               balance="bias").eval()
    with torch.no_grad():
        m.choice_bias.copy_(torch.linspace(-0.3, 0.3, E))
    config = transformers.DeepseekV3Config(
        hidden_size=D, hidden_act="silu", n_routed_experts=E, num_experts_per_tok=k, moe_intermediate_size=h,
        n_shared_experts=shared, n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=renorm)
    block = transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3MoE(config).eval()
    gate, up = m.shared.gate_up.weight.chunk(2)
    block.load_state_dict({
        "gate.weight": m.router.weight, "gate.e_score_correction_bias": m.choice_bias,
        "experts.gate_up_proj": m.w_in, "experts.down_proj": m.w_out,
        "shared_experts.gate_proj.weight": gate, "shared_experts.up_proj.weight": up,
        "shared_experts.down_proj.weight": m.shared.down.weight})
    x = torch.randn(2, 8, D)
    with torch.no_grad():
        torch.testing.assert_close(m(x), block(x), rtol=1e-5, atol=1e-6)
        # the bias decided some choices: without it the output differs
        m.choice_bias.zero_()
        assert not torch.allclose(m(x), block(x), atol=1e-4)


def test_shared_experts_count_in_total_and_active_params_and_the_fair_width():
    """d_expert null with S shared experts: the width whose k routed and S shared experts'
    parameters are nearest the dense FFN's (brute force here); the counts are the built model's."""
    for d, d_ff, k, shared, mult in [(32, 64, 2, 1, 8), (64, 176, 2, 2, 16), (48, 128, 1, 1, 8)]:
        dense = expert_params(d, d_ff, True, False)
        widths = range(mult, 4 * d_ff, mult)
        best = min(widths, key=lambda w: (abs((k + shared) * expert_params(d, w, True, False) - dense), w))
        assert fair_d_expert(d, d_ff, True, False, k, mult, shared) == best
    spec = spec_of(ffn="moe", settings={"ffn": dict(experts=4, top_k=2, shared=1, dense_first=1)})
    model = Transformer(spec)
    m = model.blocks[1].ffn
    assert m.d_expert == fair_d_expert(D, 64, True, False, 2, spec.ffn_multiple_of, 1)
    total = sum(p.numel() for p in model.parameters())
    per_expert = m.w_in[0].numel() + m.w_out[0].numel()
    assert count_params(spec)["total"] == total
    # active: all but the 2 routed experts a token does not use (the router and shared expert included)
    assert active_params(spec) == total - 2 * per_expert
    assert sum(p.numel() for p in m.shared.parameters()) == per_expert  # one shared expert, d_expert wide


def test_sequence_wise_balancing_is_the_mean_over_sequences_of_their_own_loss():
    m = moe_of(experts=4, top_k=2, d_expert=16, aux_scope="sequence", aux_coef=1.0).train()
    batch = moe_of(experts=4, top_k=2, d_expert=16, aux_coef=1.0).train()
    x = torch.randn(3, 8, D)
    m(x)
    per_sequence = []
    for b in range(3):  # each sequence's loss, in the batch-wise formula over its 8 tokens
        batch(x[b:b + 1])
        per_sequence.append(batch.terms[BALANCE])
    torch.testing.assert_close(m.terms[BALANCE], torch.stack(per_sequence).mean())
    batch(x)
    assert not torch.allclose(m.terms[BALANCE], batch.terms[BALANCE])  # not the batch-wise loss


def test_sigmoid_balancing_uses_the_scores_normalized_per_token():
    m = moe_of(experts=4, top_k=2, d_expert=16, router="sigmoid", aux_coef=1.0).train()
    x = torch.randn(16, D)
    m(x.view(1, 16, D))
    logits, scores, chosen, _ = m.route(x)
    counts = torch.bincount(chosen.reshape(-1), minlength=4)
    expected = balance_loss(scores / scores.sum(-1, keepdim=True), counts, 16, 2) / m.moe_layers
    torch.testing.assert_close(m.terms[BALANCE], expected)


def test_capacity_keeps_each_experts_highest_gates_and_evaluation_is_dropless():
    """A per-token reference: expert e keeps its ceil(capacity * k * N / E) assignments of highest
    gate; a token's output sums its kept experts' gated outputs (zero when none is kept)."""
    E, k, N, capacity = 4, 2, 16, 0.5
    m = moe_of(experts=E, top_k=k, d_expert=16, capacity=capacity, renorm=True).train()
    dropless = moe_of(experts=E, top_k=k, d_expert=16, renorm=True).train()
    x = torch.randn(1, N, D)
    y = m(x)
    _, _, chosen, gates = m.route(x[0])
    cap = math.ceil(capacity * k * N / E)
    assert cap == 4
    kept = torch.zeros(N, k, dtype=torch.bool)
    for e in range(E):
        rows = [(gates[n, j].item(), -n, n, j) for n in range(N) for j in range(k) if chosen[n, j] == e]
        for _, _, n, j in sorted(rows, reverse=True)[:cap]:  # highest gate first; ties: earlier token
            kept[n, j] = True
    with torch.no_grad():
        ref = torch.zeros(N, D)
        for n in range(N):
            for j in range(k):
                if kept[n, j]:
                    e = chosen[n, j]
                    a, u = (x[0, n] @ m.w_in[e].T).chunk(2)
                    ref[n] += gates[n, j] * ((m.act(a) * u) @ m.w_out[e].T)
    torch.testing.assert_close(y[0], ref, rtol=1e-5, atol=1e-6)
    assert m.log_stats()[DROPPED].item() == pytest.approx(1 - kept.sum().item() / (N * k))
    assert kept.sum() < N * k
    assert torch.all(y[0][~kept.any(dim=1)] == 0)  # a token that lost every expert: zero, the residual carries it
    # evaluation (and so decode and sampling) is dropless: the dropless layer's output, no statistic
    with torch.no_grad():
        torch.testing.assert_close(m.eval()(x), dropless.eval()(x))
    assert m.log_stats() == {}
