"""The decoder-only transformer, assembled from one declared option per axis (ablate/model/options.py):
its blocks, each built for its layer, hold that layer's attention and FFN components.

The training objective is assembled in one place (`Transformer._objective`, for the plain and
the fused loss alike): the next-token loss, plus the logit z-loss, the MTP heads' loss and each
component's auxiliary terms (ablate/model/component.py), each reported as the weighted value it
adds, under its metric name `loss/<name>` (ablate/names.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ablate.errors import ConfigError
from ablate.model import options
from ablate.model.component import Reduce, sublayers
from ablate.model.kv_cache import KVCache
from ablate.model.loss import linear_cross_entropy
from ablate.model.parametrization import Parametrization, param_rules
from ablate.model.roles import Role, init_weights, linear, tag
from ablate.model.spec import ModelSpec, count_params
from ablate.names import MTP_TERM, Z_TERM, loss_key, stat_key

_REDUCE = {Reduce.MEAN: torch.mean, Reduce.MAX: torch.amax, Reduce.SUM: torch.sum}


@dataclass
class LMOutput:
    logits: Optional[torch.Tensor]  # (B, T, V); None from the fused loss (fused_ce, with targets)
    loss: Optional[torch.Tensor] = None  # the training objective: lm_loss + every term
    lm_loss: Optional[torch.Tensor] = None  # next-token cross-entropy alone: comparable across variants
    # Each auxiliary term as the weighted value it adds to `loss` (detached), by name: z, mtp, and
    # the components' (summed over layers); and the components' every-row statistics (reduced over
    # layers as their declarations say).
    terms: dict[str, torch.Tensor] = field(default_factory=dict)
    stats: dict[str, torch.Tensor] = field(default_factory=dict)

    def metrics(self) -> dict[str, torch.Tensor]:
        """The terms and statistics under their metrics.jsonl names (loss/<name>, stat/<name>)."""
        return {**{loss_key(k): v for k, v in self.terms.items()}, **{stat_key(k): v for k, v in self.stats.items()}}


class Transformer(nn.Module):
    def __init__(self, spec: ModelSpec, seed: Optional[int] = None):
        """seed: keys every parameter's init (None: the current torch seed, see init_weights)."""
        super().__init__()
        self.spec = spec
        make_norm = options.norm_factory(spec)
        block = options.get("norm_pos", spec.norm_pos)
        self.tok_emb = nn.Embedding(spec.vocab_size, spec.d_model)
        tag(self.tok_emb.weight, Role.EMBEDDING)
        self.pos = options.get("pos", spec.pos).build(spec)
        self.emb_drop = nn.Dropout(spec.dropout)
        self.blocks = nn.ModuleList(block.build(spec, make_norm, layer) for layer in range(spec.n_layers))
        # What the components may report (their declarations): a term or statistic by another
        # name is refused at the first forward, not logged under a name no table knows.
        components = [options.get(axis, getattr(spec, axis)) for axis in ("attn", "ffn")]
        self._terms = {name for c in components for name in c.losses} | {Z_TERM, MTP_TERM}
        self._stats = {name: reduce for c in components for name, reduce in c.stats.items()}
        self.final_norm = make_norm(spec.d_model) if block.final_norm else nn.Identity()
        self.lm_head = None if spec.tied else linear(spec.d_model, spec.vocab_size, False, Role.HEAD)
        # Multi-token prediction: head k maps h_t to a state predicting token t+1+k through the
        # shared unembedding. Each head is a norm plus one d x d linear map: far lighter than the
        # transformer-layer MTP modules of Gloeckle et al. 2024 and DeepSeek-V3. The trunk's init is
        # that of the plain model (init is keyed by parameter name, see roles.init_weights).
        self.mtp = nn.ModuleList(
            nn.Sequential(make_norm(spec.d_model), linear(spec.d_model, spec.d_model, False, Role.INPUT))
            for _ in range(spec.mtp_heads))
        self.emb_multiplier = math.sqrt(spec.d_model) if spec.emb_scale else 1.0
        # How the loss is computed, not what it is (train.fused_ce, train.ce_chunk; set by the
        # Trainer): with targets, the unembedding and cross-entropy run chunk by chunk
        # (ablate/model/loss.py) and the full logits are never built.
        self.fused_ce, self.ce_chunk = False, 1024
        # param (ablate/model/parametrization.py): the readout's multiplier, each residual
        # branch's, and per parameter its init and LR multipliers (the optimizer reads them)
        self.parametrization = Parametrization.of(spec)
        self.logit_mult = self.parametrization.logit_mult
        for b in self.blocks:
            b.branch_multiplier = self.parametrization.branch_mult
        self.param_rules = param_rules(self)
        init_weights(self, spec.init_std, spec.n_layers, self.parametrization.depth_scaled_init, seed,
                     spec.init, {name: rule.init_mult for name, rule in self.param_rules.items()})

    def unembedding(self) -> torch.Tensor:
        return self.tok_emb.weight if self.lm_head is None else self.lm_head.weight  # (V, d)

    def readout_input(self, h: torch.Tensor) -> torch.Tensor:
        """h times the logit multiplier (muP's MuReadout: base_width / d_model), so every
        logit made from it is scaled before any soft-capping."""
        return h if self.logit_mult == 1.0 else h * self.logit_mult

    def unembed(self, h: torch.Tensor) -> torch.Tensor:
        logits = F.linear(self.readout_input(h), self.unembedding())  # (B, T, V)
        if self.spec.logit_softcap is not None:
            c = self.spec.logit_softcap
            logits = c * torch.tanh(logits / c)
        return logits

    def hidden_states(self, idx: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """offset: the position of idx[:, 0] (0, or a KV cache's length inside decode)."""
        B, T = idx.shape
        x = self.tok_emb(idx)  # (B, T, d)
        if self.emb_multiplier != 1.0:
            x = x * self.emb_multiplier
        x = self.emb_drop(self.pos.add_to_embeddings(x, offset=offset))
        ctx = self.pos.context(T, idx.device, x.dtype, offset=offset)
        for block in self.blocks:
            x = block(x, ctx)  # (B, T, d)
        return self.final_norm(x)

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None) -> LMOutput:
        h = self.hidden_states(idx)  # (B, T, d)
        if targets is None:
            return LMOutput(self.unembed(h))
        if self.fused_ce:
            return self.fused_loss(h, targets)
        logits = self.unembed(h)  # (B, T, V)
        V = logits.shape[-1]
        lm_loss = F.cross_entropy(logits.float().view(-1, V), targets.reshape(-1))
        terms = {}
        if self.spec.z_loss > 0:  # PaLM: penalise log Z drifting from 0
            log_z = torch.logsumexp(logits.float(), dim=-1)  # (B, T)
            terms[Z_TERM] = self.spec.z_loss * log_z.pow(2).mean()
        if len(self.mtp):  # DeepSeek-V3: lambda * mean over depths, one total weight for any k
            mtp_losses = [F.cross_entropy(self.unembed(head(h[:, :-k])).float().reshape(-1, V),
                                          targets[:, k:].reshape(-1))  # head k: targets shifted by k
                          for k, head in enumerate(self.mtp, start=1)]
            terms[MTP_TERM] = self.spec.mtp_weight * torch.stack(mtp_losses).mean()
        return self._objective(logits, lm_loss, lm_loss, terms)

    def _objective(self, logits: Optional[torch.Tensor], lm_loss: torch.Tensor, base: torch.Tensor,
                   terms: dict[str, torch.Tensor], included: Optional[dict[str, torch.Tensor]] = None) -> LMOutput:
        """The training objective, assembled here only: `base` (the LM loss; with fused_ce the
        z-loss is inside it, reported in `included`) plus each term, in order: z, mtp, then the
        components' auxiliary losses (ablate/model/component.py, summed over layers)."""
        for name, value in self.component_terms().items():
            terms[name] = terms[name] + value if name in terms else value
        loss = base
        for value in terms.values():
            loss = loss + value
        reported = {**(included or {}), **terms}
        return LMOutput(logits, loss, lm_loss, {k: v.detach() for k, v in reported.items()}, self.component_stats())

    def _components(self):
        return (component for block in self.blocks for component in sublayers(block))

    def component_terms(self) -> dict[str, torch.Tensor]:
        """The components' auxiliary losses of the last forward pass, summed over layers by name."""
        out: dict[str, torch.Tensor] = {}
        for module in self._components():
            for name, value in module.aux_losses().items():
                if name not in self._terms:
                    raise ValueError(f"a component reported the loss term '{name}', which its declaration does "
                                     f"not list (losses=...: {', '.join(sorted(self._terms))})")
                out[name] = out[name] + value if name in out else value
        return out

    def component_stats(self) -> dict[str, torch.Tensor]:
        """The components' every-row statistics of the last forward pass, each reduced over the
        layers that report it as its declaration says (stats={name: Reduce})."""
        by_name: dict[str, list[torch.Tensor]] = {}
        for module in self._components():
            for name, value in module.log_stats().items():
                if name not in self._stats:
                    raise ValueError(f"a component reported the statistic '{name}', which its declaration does "
                                     f"not list (stats={{...}}: {', '.join(sorted(self._stats)) or 'none'})")
                by_name.setdefault(name, []).append(value.detach().float().reshape(()))
        return {name: _REDUCE[self._stats[name]](torch.stack(values)) for name, values in by_name.items()}

    def decode(self, idx: torch.Tensor, cache: KVCache, last: bool = False) -> torch.Tensor:
        """Next-token logits (B, T, V) of idx (B, T), the tokens at positions cache.length ..
        cache.length + T - 1, attending to the cached ones; their keys and values join the cache.
        Prefill with the prompt, then one token per step (ablate/model/kv_cache.py). Equals
        forward(whole sequence).logits at those positions; MTP heads are not used. last: only
        the last position's logits (B, 1, V), all a generator needs from a prefill (the d x V
        matmul of every other prompt position is skipped)."""
        end, limit = cache.length + idx.shape[1], self.pos.max_positions
        if limit is not None and end > limit:
            raise ValueError(f"position {end - 1} is past the model's {limit} positions "
                             f"(pos={self.spec.pos}: model.max_seq_len)")
        with cache.attached([block.attn for block in self.blocks]):
            h = self.hidden_states(idx, offset=cache.length)  # (B, T, d)
        return self.unembed(h[:, -1:] if last else h)  # (B, T or 1, V)

    def fused_loss(self, h: torch.Tensor, targets: torch.Tensor) -> LMOutput:
        """forward's objective through linear_cross_entropy: the same values and gradients, no
        logits. lm_loss is a reported number here (no gradient)."""
        w, spec = self.unembedding(), self.spec

        def ce(hk: torch.Tensor, yk: torch.Tensor, z_loss: float = 0.0):
            hk = self.readout_input(hk)
            return linear_cross_entropy(hk.reshape(-1, hk.shape[-1]), w, yk.reshape(-1), self.ce_chunk,
                                        z_loss, spec.logit_softcap)

        base, lm_loss = ce(h, targets, spec.z_loss)  # (), (): the z-loss is inside base
        included = {Z_TERM: base.detach() - lm_loss} if spec.z_loss > 0 else {}
        terms = {}
        if len(self.mtp):  # as in forward; the z-loss is on the next-token logits only
            mtp_losses = [ce(head(h[:, :-k]), targets[:, k:])[0] for k, head in enumerate(self.mtp, start=1)]
            terms[MTP_TERM] = spec.mtp_weight * torch.stack(mtp_losses).mean()
        return self._objective(None, lm_loss, base, terms, included)


def built_counts(model: Transformer) -> dict[str, int]:
    """The breakdown of ablate.model.spec.count_params, counted on a built model."""
    out = {"embedding": model.tok_emb.weight.numel() + sum(p.numel() for p in model.pos.parameters()),
           "attention": sum(p.numel() for b in model.blocks for p in b.attn.parameters()),
           "ffn": sum(p.numel() for b in model.blocks for p in b.ffn.parameters()),
           "head": sum(p.numel() for p in model.mtp.parameters())
           + (0 if model.lm_head is None else model.lm_head.weight.numel())}
    out["total"] = sum(p.numel() for p in model.parameters())
    out["norm"] = out["total"] - sum(v for k, v in out.items() if k != "total")
    return out


def check_counts(model: Transformer) -> dict[str, int]:
    """The built model's counts, refused unless they equal the analytic ones: summary.json,
    FLOPs and MFU report the analytic count, so an option whose declared `params` is wrong (a
    plugin's) must not train."""
    analytic, built = count_params(model.spec), built_counts(model)
    bad = {k: (analytic[k], built[k]) for k in built if built[k] != analytic[k]}
    if bad:
        raise ConfigError(f"analytic parameter count disagrees with the built model: {bad} "
                          "(analytic, built); fix the params= an option declares in its register_option")
    return built


def build_model(spec: ModelSpec, seed: Optional[int] = None) -> Transformer:
    model = Transformer(spec, seed)
    check_counts(model)
    return model
