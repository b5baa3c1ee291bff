"""Axis `ffn`, option `moe`: a Mixture-of-Experts FFN with token-choice top-k routing (Shazeer
et al. 2017; Switch Transformer; OLMoE), dropless unless `ffn.capacity`, with DeepSeek's parts
(sigmoid scores, a choice bias, shared experts). Its settings, checks and counts are
ablate/model/moe_spec.py.

    x ─ router (no bias) ─ softmax | sigmoid ─ scores ─ (+ choice bias) ─ top-k ─> k experts,
        their unbiased scores as gates (renormalized over them with ffn.renorm)      (per token)
    x ─ sorted by expert ─ (capacity: each expert's lowest gates dropped, training only)
      ─ W_in (grouped) ─ act ─ × gate ─ W_out (grouped) ─ Σ over the token's kept rows ─ + shared(x) ─> y

Experts follow the act axis's choice (GLU experts with swiglu: W_in holds [gate; up] per expert,
as HF's Mixtral / Qwen3-MoE `gate_up_proj`), stored as 3-D banks (E, out, in), one matrix per
expert. Tokens are sorted by expert once (a stable sort: deterministic) and each bank is one
grouped product over the sorted rows (`expert_mm`): torch._grouped_mm where this torch has it for
the device, dtype and alignment, otherwise a loop over the experts. Both sit behind one custom op
with its own backward, so the layer compiles (torch.compile sees one opaque op whose output shape
it knows) on every torch from 2.4 on. `path = LOOP` is the benchmark's reference: a plain loop
over experts with autograd through each slice, as HF's eager experts do.

After each forward the module holds (for the objective, the log rows and diagnostics) its
auxiliary losses, the tokens each expert received (`counts`) and, while recording, its detailed
statistics. Only the training step reads `counts` (the trainer sums them over micro-steps), so
evaluation, diagnostics' extra forward and the micro-batch probe count nothing. With
ffn.balance=bias the choice bias moves only in `after_update`, which the trainer calls with the
step's loads (summed over micro-steps and ranks) after an applied optimizer step: every rank
moves it alike, and nothing else moves it.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import torch
from torch import nn

from ablate.model import options
from ablate.model.component import MEAN_ABS_FFN_HIDDEN, Sublayer, sublayers
from ablate.model.ffn import DEAD_FFN_FRAC, build_ffn
from ablate.model.moe_spec import DROPPED, AuxScope, Balance, MoESettings, RouterKind, expert_width
from ablate.model.roles import Role, bank, linear
from ablate.names import BALANCE_TERM as BALANCE
from ablate.names import ROUTER_Z_TERM as ROUTER_Z

IMBALANCE = "moe_imbalance"  # the busiest expert's tokens over the mean (1 when balanced; max E/k)
GROUPED, LOOP = "grouped", "loop"


# ---- the grouped product ------------------------------------------------------------------------

def _aligned(t: torch.Tensor) -> bool:
    """torch._grouped_mm wants 16-byte aligned strides and data (CPU and CUDA)."""
    size = t.element_size()
    return t.data_ptr() % 16 == 0 and all(s * size % 16 == 0 for s in t.stride() if s != 1)


@functools.lru_cache(maxsize=None)
def _grouped_kernel_works(device_type: str, dtype: torch.dtype) -> bool:
    """Whether this torch's torch._grouped_mm runs for the device and dtype (absent before 2.8,
    CUDA-only or Hopper-only in some versions, bf16-only on CUDA): tried once on a small case
    with an empty group, and checked against a plain product."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(24, 16, generator=g).to(device_type, dtype)
        w = torch.randn(3, 16, 16, generator=g).to(device_type, dtype)
        offs = torch.tensor([8, 8, 24], dtype=torch.int32, device=device_type)
        y = torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
        ref = torch.cat([x[:8] @ w[0].T, x[8:] @ w[2].T])
        return bool(torch.allclose(y.float(), ref.float(), rtol=2e-2, atol=2e-2))
    except (RuntimeError, NotImplementedError):
        return False


def _use_grouped(*tensors: torch.Tensor) -> bool:
    t = tensors[0]
    return all(_aligned(u) for u in tensors) and _grouped_kernel_works(t.device.type, t.dtype)


def _bounds(offs: torch.Tensor) -> list[tuple[int, int]]:
    ends = offs.tolist()  # one host sync
    return list(zip([0] + ends[:-1], ends))


@torch.library.custom_op("ablate::expert_mm", mutates_args=())
def expert_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Rows of x sorted by expert, (M, K); w (E, N, K), each expert's matrix as a Linear stores it;
    offs (E,) int32, the end of each expert's rows. -> (M, N): row r of expert e is x[r] @ w[e]^T."""
    if _use_grouped(x, w):
        return torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
    out = x.new_empty(x.shape[0], w.shape[1])
    for e, (a, b) in enumerate(_bounds(offs)):
        torch.mm(x[a:b], w[e].T, out=out[a:b])
    return out


@expert_mm.register_fake
def _(x, w, offs):
    return x.new_empty(x.shape[0], w.shape[1])


@torch.library.custom_op("ablate::expert_mm_wgrad", mutates_args=())
def expert_mm_wgrad(grad: torch.Tensor, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """The gradient of expert_mm's w: (E, N, K), expert e's grad[rows]^T @ x[rows] (zero when it
    got no rows)."""
    E = offs.shape[0]
    if _use_grouped(grad, x):
        return torch._grouped_mm(grad.t(), x, offs=offs)
    out = x.new_zeros(E, grad.shape[1], x.shape[1])
    for e, (a, b) in enumerate(_bounds(offs)):
        if b > a:
            torch.mm(grad[a:b].T, x[a:b], out=out[e])
    return out


@expert_mm_wgrad.register_fake
def _(grad, x, offs):
    return x.new_empty(offs.shape[0], grad.shape[1], x.shape[1])


def _setup(ctx, inputs, output):
    x, w, offs = inputs
    ctx.save_for_backward(x, w, offs)


def _backward(ctx, grad):
    x, w, offs = ctx.saved_tensors
    grad = grad.contiguous()  # torch._grouped_mm refuses an expanded (stride-0) gradient
    dx = expert_mm(grad, w.transpose(-2, -1), offs)  # (M, K)
    dw = expert_mm_wgrad(grad, x, offs)  # (E, N, K)
    return dx, dw, None


expert_mm.register_autograd(_backward, setup_context=_setup)


def expert_mm_loop(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """expert_mm as a plain loop over the experts, autograd through each slice: the reference path."""
    return torch.cat([x[a:b] @ w[e].T for e, (a, b) in enumerate(_bounds(offs))])


# ---- the layer ----------------------------------------------------------------------------------

class MoE(Sublayer, nn.Module):
    """Token-choice top-k routing over E experts of the act axis's kind; see the module docstring.

    settings: the ffn=moe settings; d_expert: the resolved expert width; moe_layers: how many MoE
    layers the model has (each layer's auxiliary terms are divided by it, so their sum over
    layers, which the objective takes, is the mean over MoE layers times the coefficient)."""

    def __init__(self, spec, settings: MoESettings, d_expert: int, moe_layers: int):
        super().__init__()
        act = options.get("act", spec.act)
        self.settings, self.moe_layers = settings, moe_layers
        self.E, self.k, self.d_expert = settings.experts, settings.top_k, d_expert
        self.act = act.function(spec)
        self.gated, self.relu_family, self.clamp = act.gated, act.relu_family, spec.act_clamp
        n_in = 2 if act.gated else 1
        d = spec.d_model
        self.router = linear(d, self.E, False, Role.ROUTER)
        self.w_in = bank(self.E, n_in * d_expert, d, Role.INPUT, fused=(d_expert,) * n_in)  # (E, n_in*h, d)
        self.w_out = bank(self.E, d, d_expert, Role.OUTPUT)  # (E, d, h)
        self.b_in = bank(self.E, n_in * d_expert, None, Role.BIAS) if spec.bias else None  # (E, n_in*h)
        self.b_out = bank(self.E, d, None, Role.BIAS) if spec.bias else None  # (E, d)
        # ffn.shared experts side by side: one FFN of width shared * d_expert that every token uses
        self.shared = build_ffn(spec, width=settings.shared * d_expert) if settings.shared else None
        if settings.has_choice_bias:  # added to the scores for the choice only (checkpointed)
            self.register_buffer("choice_bias", torch.zeros(self.E))  # (E,), fp32
        else:
            self.choice_bias = None
        self.resid_drop = nn.Dropout(spec.dropout)
        self.path = GROUPED
        # of the last forward: tokens per expert (E,), its terms, and while recording its statistics
        self.counts: Optional[torch.Tensor] = None
        self.dropped: Optional[torch.Tensor] = None  # with ffn.capacity in training: the fraction dropped
        self.terms: dict[str, torch.Tensor] = {}
        self.recording = False
        self.recorded: dict[str, torch.Tensor] = {}

    def route(self, x: torch.Tensor):
        """x (N, d) -> logits (N, E), scores (N, E) in fp32, chosen experts (N, k), gates (N, k).
        The choice and the gates are separate steps: the gates are the chosen experts' scores
        (renormalized over them with ffn.renorm), whatever decided the choice (the choice bias
        moves the choice only)."""
        logits = self.router(x)  # (N, E), in the compute dtype (autocast's, or x's)
        if self.settings.router == RouterKind.SIGMOID.value:
            scores = logits.float().sigmoid()  # (N, E), each in (0, 1)
        else:
            scores = logits.float().softmax(dim=-1)  # (N, E), summing to 1
        choice = scores if self.choice_bias is None else scores + self.choice_bias
        chosen = choice.topk(self.k, dim=-1).indices  # (N, k)
        gates = scores.gather(-1, chosen)  # (N, k)
        if self.settings.renorm:
            gates = gates / gates.sum(dim=-1, keepdim=True)
        return logits, scores, chosen, gates

    def experts(self, xs: torch.Tensor, experts: torch.Tensor, gates: torch.Tensor,
                offs: torch.Tensor) -> torch.Tensor:
        """Rows sorted by expert (M, d) -> each row through its expert, times its gate (M, d);
        experts (M,): each row's expert; gates (M,). The gate scales the hidden activation (the
        narrower tensor when d_expert < d_model): gate * (W h + b) = W (gate * h) + gate * b."""
        mm = expert_mm if self.path == GROUPED else expert_mm_loop
        dtype = xs.dtype
        h = mm(xs, self.w_in.to(dtype), offs)  # (M, n_in*h)
        if self.b_in is not None:
            h = h + self.b_in.to(dtype)[experts]
        if self.gated:
            gate, up = h.chunk(2, dim=-1)  # (M, h) each
            h = self.act(gate) * up
        else:
            h = self.act(h)
        if self.clamp is not None:
            h = h.clamp(-self.clamp, self.clamp)
        if self.recording:
            self._record_hidden(h, offs)
        g = gates.to(dtype).unsqueeze(-1)  # (M, 1)
        y = mm(h * g, self.w_out.to(dtype), offs)  # (M, d)
        if self.b_out is not None:
            y = y + g * self.b_out.to(dtype)[experts]
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        flat = x.reshape(-1, d)  # (N, d)
        N = flat.shape[0]
        logits, scores, top_i, gates = self.route(flat)
        chosen = top_i.reshape(-1)  # (N*k,): token n's j-th expert at n*k + j
        counts = torch.zeros(self.E, dtype=torch.long, device=x.device).scatter_add_(
            0, chosen, torch.ones_like(chosen))  # (E,): the choice, before any drop
        gate_rows = gates.reshape(-1)  # (N*k,)
        if self.settings.capacity is not None and self.training:  # evaluation and decode: dropless
            sorted_experts, order, kept = self._within_capacity(chosen, gate_rows, counts, N)
            self.dropped = 1.0 - kept.sum().float() / chosen.numel()
        else:
            sorted_experts, order = torch.sort(chosen, stable=True)  # (M,), M = N*k
            kept, self.dropped = counts, None
        offs = kept.cumsum(0).to(torch.int32)  # (E,)
        token = order // self.k  # (M,): the token of each sorted row
        xs = flat[token].to(logits.dtype)  # (M, d), sorted by expert
        ys = self.experts(xs, sorted_experts, gate_rows[order], offs)  # (M, d)
        # each token's kept rows summed (in x's dtype: fp32 under autocast; a token with none
        # gets zero, the residual carries it); on the CPU index_add adds in index order, so the
        # sum is deterministic
        out = torch.zeros_like(flat).index_add_(0, token, ys.to(x.dtype))  # (N, d)
        self.counts = counts.detach()
        self.terms = self._terms(logits, scores, counts, top_i, B) if self.training else {}
        if self.recording:
            self._record_routing(scores, counts)
        y = self.resid_drop(out.view(B, T, d))
        return y if self.shared is None else y + self.shared(x)  # (B, T, d)

    def _within_capacity(self, chosen: torch.Tensor, gates: torch.Tensor, counts: torch.Tensor, n_tokens: int):
        """The assignments each expert keeps under ffn.capacity: at most ceil(capacity * k *
        tokens / E) (at least one while capacity > 0), those with the highest gates (ties: the
        earlier token). -> its rows sorted by expert (M',), their indices among the N*k
        assignments (M',) and the kept count per expert (E,)."""
        cap = math.ceil(self.settings.capacity * self.k * n_tokens / self.E)
        by_gate = torch.sort(gates, descending=True, stable=True).indices  # (N*k,)
        by_expert = torch.sort(chosen[by_gate], stable=True)  # each expert's rows, highest gate first
        order = by_gate[by_expert.indices]  # (N*k,)
        starts = counts.cumsum(0) - counts  # (E,): each expert's first row
        rank = torch.arange(order.numel(), device=order.device) - starts[by_expert.values]  # (N*k,)
        keep = rank < cap
        return by_expert.values[keep], order[keep], counts.clamp(max=cap)

    def _terms(self, logits, scores, counts, chosen, batch: int) -> dict[str, torch.Tensor]:
        """The weighted auxiliary losses of this layer, each divided by the MoE layer count."""
        s, out = self.settings, {}
        if s.balance == Balance.AUX.value and s.aux_coef > 0:
            # the router's probabilities: sigmoid scores normalized per token (DeepSeek-V3's s')
            probs = scores if s.router == RouterKind.SOFTMAX.value else scores / scores.sum(-1, keepdim=True)
            if s.aux_scope == AuxScope.SEQUENCE.value:
                loss = sequence_balance_loss(probs.view(batch, -1, self.E), chosen.view(batch, -1), self.k)
            else:
                loss = balance_loss(probs, counts, probs.shape[0], self.k)
            out[BALANCE] = s.aux_coef / self.moe_layers * loss
        if s.z_coef > 0:
            out[ROUTER_Z] = s.z_coef / self.moe_layers * router_z_loss(logits)
        return out

    def after_update(self, loads: Optional[torch.Tensor]) -> None:
        """ffn.balance=bias, after an applied optimizer step: the choice bias moves by -bias_rate
        * sign(load - mean load) against the step's loads (E,) (all its micro-steps and ranks),
        then is centred to mean 0 (torchtitan's convention)."""
        if self.settings.balance != Balance.BIAS.value or loads is None:
            return
        load = loads.to(self.choice_bias)
        with torch.no_grad():
            self.choice_bias.sub_(self.settings.rate * torch.sign(load - load.mean()))
            self.choice_bias.sub_(self.choice_bias.mean())

    # -- the component's reports (ablate/model/component.py's Sublayer) -------------------------
    def aux_losses(self) -> dict[str, torch.Tensor]:
        return dict(self.terms)

    def log_stats(self) -> dict[str, torch.Tensor]:
        # a row's imbalance is of the whole step's loads (ExpertLoads), not one micro-step's
        return {} if self.dropped is None else {DROPPED: self.dropped.detach()}

    def record(self, on: bool) -> None:
        self.recording, self.recorded = on, {}

    def diag_stats(self) -> dict[str, torch.Tensor]:
        return dict(self.recorded)

    def _record_routing(self, probs: torch.Tensor, counts: torch.Tensor) -> None:
        load = counts.float() / counts.sum().clamp(min=1)  # (E,): each expert's share of the assignments
        self.recorded[IMBALANCE] = imbalance(counts)
        entropy = -(probs * probs.clamp(min=1e-30).log()).sum(-1).mean()
        self.recorded["router_entropy"] = entropy.detach()
        for e in range(self.E):
            self.recorded[f"expert_load_{e}"] = load[e]

    def _record_hidden(self, h: torch.Tensor, offs: torch.Tensor) -> None:
        """The experts' hidden activation (what a dense FFN's `hidden` is): its mean |h| and, for a
        ReLU family, the fraction of units that never fire in experts that got tokens."""
        h = h.detach()
        self.recorded[MEAN_ABS_FFN_HIDDEN] = h.abs().float().mean()
        if self.relu_family:
            fired = [h[a:b].ne(0).any(dim=0) for a, b in _bounds(offs) if b > a]
            self.recorded[DEAD_FFN_FRAC] = 1.0 - torch.stack(fired).float().mean()


def balance_loss(probs: torch.Tensor, counts: torch.Tensor, n_tokens: int, top_k: int) -> torch.Tensor:
    """(E / k) * sum_i f_i * P_i (OLMo-core's normalization of Switch Transformer's loss): f_i the
    fraction of the tokens routed to expert i (sum_i f_i = k), P_i its mean router probability.
    1 when the load is balanced (f_i = k/E) whatever the probabilities; up to E/k collapsed."""
    E = probs.shape[-1]
    f = counts.to(probs.dtype) / n_tokens  # (E,), no gradient: the choice is discrete
    return E / top_k * (f * probs.mean(dim=0)).sum()


def sequence_balance_loss(probs: torch.Tensor, chosen: torch.Tensor, top_k: int) -> torch.Tensor:
    """The balancing loss taken per sequence and averaged over them (DeepSeek-V3's sequence-wise
    loss in the same normalization, 1 when each sequence is balanced): probs (B, T, E), chosen
    (B, T*k) the experts each sequence's tokens were routed to."""
    B, T, E = probs.shape
    counts = torch.zeros(B, E, dtype=probs.dtype, device=probs.device).scatter_add_(
        1, chosen, torch.ones_like(chosen, dtype=probs.dtype))  # (B, E)
    f = counts / T  # (B, E), no gradient
    return (E / top_k * (f * probs.mean(dim=1)).sum(-1)).mean()


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE's router z-loss: the mean over tokens of logsumexp(logits)^2."""
    return torch.logsumexp(logits.float(), dim=-1).square().mean()


def imbalance(counts: torch.Tensor) -> torch.Tensor:
    """The busiest expert's tokens over the mean expert's: 1 balanced, E/k when k experts get all."""
    c = counts.detach().float()
    return c.max() / c.mean().clamp(min=1e-30)


IMBALANCE_LAYER = "moe_imbalance_layer"  # the index of the layer with the largest imbalance


class ExpertLoads:
    """The tokens each expert of every MoE layer received, summed over what a training step adds:
    the trainer calls `add()` after each micro-step's forward and `take()` once the step's update
    is applied (`discard()` when it is skipped). Nothing else reads the layers' counts, so
    evaluation, diagnostics' extra forward and the micro-batch probe count no token."""

    def __init__(self, blocks):
        self.blocks = list(blocks)
        self.layers = [i for i, b in enumerate(blocks) if isinstance(b.ffn, MoE)]
        self._moe = [blocks[i].ffn for i in self.layers]
        self.total: Optional[torch.Tensor] = None  # (MoE layers, E)

    def __bool__(self) -> bool:
        return bool(self.layers)

    def add(self) -> None:
        counts = torch.stack([m.counts for m in self._moe])  # (L, E)
        self.total = counts if self.total is None else self.total + counts

    def after_update(self, loads: Optional[torch.Tensor]) -> None:
        """After an applied optimizer step: every component's own update (Sublayer.after_update),
        an MoE layer's with its row of the step's loads (L, E) (ffn.balance=bias moves its
        choice bias)."""
        rows = dict(zip(self.layers, loads)) if loads is not None else {}
        for i, block in enumerate(self.blocks):
            for c in sublayers(block):
                c.after_update(rows.get(i) if c is block.ffn else None)

    def take(self) -> Optional[torch.Tensor]:
        total, self.total = self.total, None
        return total

    def discard(self) -> None:
        self.total = None

    def stats(self, loads: torch.Tensor) -> dict[str, torch.Tensor]:
        """A log row's summary of a step's loads (L, E): the largest imbalance over the MoE layers
        and that layer's index (in the model's blocks)."""
        per_layer = torch.stack([imbalance(c) for c in loads])  # (L,)
        worst = per_layer.argmax()
        index = torch.tensor(self.layers, device=loads.device)[worst]
        return {IMBALANCE: per_layer[worst], IMBALANCE_LAYER: index.float()}


def build_moe(spec, layer: int, **settings) -> nn.Module:
    """ffn=moe for layer `layer`: the dense FFN in the first `dense_first` layers, else an MoE
    whose expert width is `d_expert` or, when null, the fair width (ablate/model/moe_spec.py)."""
    s = MoESettings.of(settings)
    if not s.is_moe(layer):
        return build_ffn(spec, layer)
    return MoE(spec, s, expert_width(spec, s), spec.n_layers - s.dense_first)
