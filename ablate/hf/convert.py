"""Our Transformer <-> an HF causal LM of one of the families, tensor by tensor (weights.py)."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from ablate.errors import ConfigError
from ablate.hf.families import FAMILIES, family_for, transformers_module
from ablate.hf.weights import EMBEDDING
from ablate.model.spec import ModelSpec


def to_hf(model, family: Optional[str] = None):
    """Our Transformer -> (HF config, HF state dict). The vocab keeps our (padded) size."""
    spec: ModelSpec = model.spec
    fam = family_for(spec, family)
    ours = model.state_dict()
    out = {}
    maps = fam.tensor_maps(spec)
    for m in maps:
        t = ours[m.ours].detach() - m.offset
        if m.rows is not None:
            t = t[list(m.rows)]
        parts = t.split(list(m.sizes), dim=0) if m.sizes else (t,)
        for key, p in zip(m.theirs, parts):
            out[key] = (p.t() if m.transpose and p.ndim == 2 else p).contiguous().clone()
    if spec.tied:  # HF keeps the (shared) head in its state dict too
        out["lm_head.weight"] = out[next(m.theirs[0] for m in maps if m.ours == EMBEDDING)]
    return fam.config_from_spec(spec), out


def to_hf_model(model, family: Optional[str] = None):
    """Our Transformer -> an HF *ForCausalLM (eval mode) carrying the same weights."""
    transformers = transformers_module()
    config, state = to_hf(model, family)
    config._attn_implementation = "eager"
    hf = getattr(transformers, FAMILIES.get(config.model_type).model_class)(config)
    _load_strict(hf, state)
    return hf.eval()


def _load_strict(module, state: dict) -> None:
    missing, unexpected = module.load_state_dict(state, strict=False)
    # Non-persistent buffers (rotary tables, GPT-2's causal mask) are rebuilt by the module.
    missing = [k for k in missing if not k.endswith((".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq"))]
    if missing or unexpected:
        raise ConfigError(f"state dict mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")


def spec_from_hf_config(config: Any) -> ModelSpec:
    return FAMILIES.get(config.model_type).spec_from_config(config)


def from_hf(hf_model, **spec_changes):
    """An HF causal LM (one of FAMILIES) -> our Transformer with its weights, in eval mode.

    `spec_changes` override ModelSpec fields that do not change the weights' shapes or meaning
    (e.g. dropout=0.1 to fine-tune with dropout)."""
    import torch

    from ablate.model.transformer import Transformer

    spec = spec_from_hf_config(hf_model.config)
    if spec_changes:
        spec = dataclasses.replace(spec, **spec_changes)
    fam = FAMILIES.get(hf_model.config.model_type)
    theirs = hf_model.state_dict()
    state = {}
    for m in fam.tensor_maps(spec):
        parts = [theirs[k].detach() for k in m.theirs]
        parts = [p.t() if m.transpose and p.ndim == 2 else p for p in parts]
        t = torch.cat(parts, dim=0) + m.offset
        if m.rows is not None:  # back to our row order
            t = t[torch.tensor(m.rows).argsort()]
        state[m.ours] = t
    model = Transformer(spec)
    _load_strict(model, state)
    return model.eval()
