"""What a Mixture-of-Experts FFN is, without torch: its settings and their checks, its experts'
width by the fair rule, and its parameter counts (total and active), which the `ffn=moe`
declaration, `ablate inspect` and the ladders read. The module is ablate/model/moe.py.

Counts, per MoE layer, with d = d_model, h = the expert width (`d_expert`), E experts, k chosen,
S shared experts:
  one expert   n_in * (d*h + b*h) + h*d + b*d      (n_in = 2 for a GLU act, 1 otherwise; b = bias;
                                                    the dense FFN's count at width h)
  router       E * d                                (no bias: no HF router has one)
  shared       one FFN of width S*h (S experts side by side; none when S = 0)
  total        router + E * expert + shared
  active       router + k * expert + shared         (the parameters one token uses)
The dense layers of `dense_first` count as the dense FFN does.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum
from typing import Any, Mapping, Optional

from ablate.errors import ConfigError


class Balance(str, Enum):
    """How the experts' load is balanced."""

    AUX = "aux"  # the auxiliary loss (Switch Transformer; OLMo-core's normalization, 1 when balanced)
    BIAS = "bias"  # a per-expert bias on the scores for the choice only, moved after each step (DeepSeek-V3)
    NONE = "none"


class RouterKind(str, Enum):
    """How the router scores the experts."""

    SOFTMAX = "softmax"  # a softmax over the experts' logits
    SIGMOID = "sigmoid"  # each logit's sigmoid (DeepSeek-V3)


class AuxScope(str, Enum):
    """Over what the balancing loss's f_i and P_i are taken."""

    BATCH = "batch"  # the forward pass's tokens
    SEQUENCE = "sequence"  # each sequence's tokens, the loss averaged over sequences (DeepSeek-V3)


# The settings each balancing form reads: one form's settings moved from their defaults while
# another form balances are refused (they would do nothing).
FORM_SETTINGS = {Balance.AUX.value: ("aux_coef", "aux_scope"), Balance.BIAS.value: ("bias_rate",)}
# with ffn.capacity, the fraction of a training forward's token-expert assignments dropped
# (stat/moe_dropped on every row, the mean over MoE layers)
DROPPED = "moe_dropped"
DEFAULT_BIAS_RATE = 0.001  # DeepSeek-V3's bias update speed (its gamma) while it balances


@dataclass(frozen=True)
class MoESettings:
    """The `ffn=moe` settings (`ffn.<key>`); the defaults are OLMoE's recipe at 8 experts, top-2:
    softmax scores, gates not renormalized, auxiliary loss 0.01, router z-loss 0.001, dropless.

    experts:     E, experts per MoE layer
    top_k:       k, experts each token is routed to
    d_expert:    an expert's hidden width; None: the fair width (`fair_d_expert`)
    renorm:      the k chosen gates renormalized to sum to 1 (Mixtral, Qwen3-MoE's norm_topk_prob)
    balance:     `aux` (the balancing loss), `bias` (a choice bias moved by the loads) or `none`
    aux_coef:    the balancing loss's weight in the objective (balance=aux)
    z_coef:      the router z-loss's weight (ST-MoE: mean over tokens of logsumexp(logits)^2)
    dense_first: the first n layers keep the dense FFN (Qwen3-MoE's mlp_only_layers)
    router:      `softmax` or `sigmoid` (DeepSeek-V3's scores)
    shared:      S shared experts every token uses, ungated, each d_expert wide (DeepSeek's)
    aux_scope:   `batch` or `sequence`: over what the balancing loss is taken (balance=aux)
    bias_rate:   the choice bias's step, gamma (balance=bias); None: DEFAULT_BIAS_RATE
    capacity:    each expert keeps at most ceil(capacity * k * tokens / E) of a training forward's
                 tokens (the lowest gates dropped); None: dropless
    """

    experts: int = 8
    top_k: int = 2
    d_expert: Optional[int] = None
    renorm: bool = False
    balance: str = Balance.AUX.value
    aux_coef: float = 0.01
    z_coef: float = 0.001
    dense_first: int = 0
    router: str = RouterKind.SOFTMAX.value
    shared: int = 0
    aux_scope: str = AuxScope.BATCH.value
    bias_rate: Optional[float] = None
    capacity: Optional[float] = None

    @property
    def rate(self) -> float:
        """The choice bias's step under balance=bias."""
        return DEFAULT_BIAS_RATE if self.bias_rate is None else self.bias_rate

    @property
    def has_choice_bias(self) -> bool:
        """Whether its layers hold a choice bias: balance=bias moves it; a sigmoid router keeps one
        (zero unless moved) so it holds what DeepSeek-V3's `e_score_correction_bias` holds."""
        return self.balance == Balance.BIAS.value or self.router == RouterKind.SIGMOID.value

    @classmethod
    def of(cls, settings: Any) -> "MoESettings":
        """From a mapping of settings or anything with these attributes (the spec's typed config)."""
        if isinstance(settings, cls):
            return settings
        get = settings.get if isinstance(settings, Mapping) else lambda k, d: getattr(settings, k, d)
        return cls(**{f.name: get(f.name, f.default) for f in fields(cls)})

    def check(self, n_layers: int) -> None:
        """ConfigError, one line naming the key, for settings no model can have."""
        for key in ("experts", "top_k", "d_expert", "dense_first", "shared"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"ffn.{key} must be an integer, got {value!r}")
        if self.experts < 1:
            raise ConfigError(f"ffn.experts must be >= 1, got {self.experts}")
        if not 1 <= self.top_k <= self.experts:
            raise ConfigError(f"ffn.top_k must be between 1 and ffn.experts={self.experts}, got {self.top_k}")
        if self.d_expert is not None and self.d_expert < 1:
            raise ConfigError(f"ffn.d_expert must be >= 1 or null (the fair width), got {self.d_expert}")
        if not 0 <= self.dense_first < n_layers:
            raise ConfigError(f"ffn.dense_first={self.dense_first} must be >= 0 and below model.n_layers="
                              f"{n_layers} (at least one MoE layer); use ffn=dense for a dense model")
        for key, enum in (("balance", Balance), ("router", RouterKind), ("aux_scope", AuxScope)):
            if getattr(self, key) not in {e.value for e in enum}:
                raise ConfigError(f"ffn.{key}={getattr(self, key)!r} is not one of "
                                  f"{', '.join(e.value for e in enum)}")
        for key in ("aux_coef", "z_coef"):
            if not getattr(self, key) >= 0:
                raise ConfigError(f"ffn.{key} must be >= 0, got {getattr(self, key)}")
        if self.shared < 0:
            raise ConfigError(f"ffn.shared must be >= 0 (shared experts every token uses), got {self.shared}")
        if self.capacity is not None and not self.capacity > 0:
            raise ConfigError(f"ffn.capacity must be > 0 (a multiple of an expert's fair share k*tokens/E) "
                              f"or null (dropless), got {self.capacity}")
        if self.bias_rate is not None and not self.bias_rate > 0:
            raise ConfigError(f"ffn.bias_rate must be > 0 (the choice bias's step per optimizer step), "
                              f"got {self.bias_rate}; use ffn.balance=none for no balancing")
        for form, keys in FORM_SETTINGS.items():
            moved = [k for k in keys if getattr(self, k) != self.__dataclass_fields__[k].default]
            if moved and self.balance != form:
                raise ConfigError(f"ffn.{moved[0]}={getattr(self, moved[0])!r} is a setting of ffn.balance={form}, "
                                  f"not of ffn.balance={self.balance}: drop it or set ffn.balance={form}")

    def is_moe(self, layer: int) -> bool:
        return layer >= self.dense_first


def expert_params(d_model: int, width: int, gated: bool, bias: bool) -> int:
    """One FFN of hidden width `width` (an expert, or the dense FFN: options.ffn_layer_params):
    2 (plain) or 3 (gated) matrices, plus biases with bias=on."""
    n_in, b = (2 if gated else 1), (1 if bias else 0)
    return n_in * (d_model * width + b * width) + width * d_model + b * d_model


def shared_params(d_model: int, width: int, gated: bool, bias: bool, shared: int) -> int:
    """The shared experts of one layer: one FFN of width shared * width (none when shared = 0)."""
    return expert_params(d_model, shared * width, gated, bias) if shared else 0


def fair_d_expert(d_model: int, dense_d_ff: int, gated: bool, bias: bool, top_k: int, multiple: int,
                  shared: int = 0) -> int:
    """The multiple of `multiple` whose k routed experts' and the shared experts' parameters are
    nearest the dense FFN's (the router not counted); a tie goes to the smaller width, as the GLU
    width rule's does."""
    def used(w: int) -> int:  # the expert parameters a token uses at width w
        return top_k * expert_params(d_model, w, gated, bias) + shared_params(d_model, w, gated, bias, shared)

    target = expert_params(d_model, dense_d_ff, gated, bias)
    exact = (target - used(0)) / (used(1) - used(0))  # used() is linear in w: used(exact) = target
    low = max(multiple, int(exact) // multiple * multiple)
    candidates = [w for w in (low - multiple, low, low + multiple) if w >= multiple]
    return min(candidates, key=lambda w: (abs(used(w) - target), w))


def expert_width(spec: Any, settings: MoESettings) -> int:
    """The expert width of a spec's MoE layers: ffn.d_expert, or the fair width from the spec's
    dense FFN (so a muP base model, at its own d_ff, gets its own fair width)."""
    if settings.d_expert is not None:
        return settings.d_expert
    return fair_d_expert(spec.d_model, spec.d_ff, spec.gated, spec.bias, settings.top_k, spec.ffn_multiple_of,
                         settings.shared)


def layer_params(spec: Any, layer: int, active: bool = False) -> int:
    """ffn=moe's parameters in one layer (active: the ones one token uses); a dense_first layer
    has the dense FFN's."""
    s = MoESettings.of(spec.ffn)
    if not s.is_moe(layer):
        return expert_params(spec.d_model, spec.d_ff, spec.gated, spec.bias)
    h = expert_width(spec, s)
    n = s.top_k if active else s.experts
    return (router_params(spec.d_model, s.experts) + n * expert_params(spec.d_model, h, spec.gated, spec.bias)
            + shared_params(spec.d_model, h, spec.gated, spec.bias, s.shared))


def is_moe_layer(spec: Any, layer: int) -> bool:
    """Whether the spec's layer `layer` routes its tokens (ffn=moe, past dense_first)."""
    return spec.ffn == "moe" and MoESettings.of(spec.ffn).is_moe(layer)


def check_spec(spec: Any) -> None:
    """ffn=moe's settings against the spec (ModelSpec.check calls it)."""
    MoESettings.of(spec.ffn).check(spec.n_layers)


def router_params(d_model: int, experts: int) -> int:
    return experts * d_model


def moe_layer_params(d_model: int, d_expert: int, gated: bool, bias: bool, experts: int) -> int:
    return router_params(d_model, experts) + experts * expert_params(d_model, d_expert, gated, bias)


def moe_active_params(d_model: int, d_expert: int, gated: bool, bias: bool, experts: int, top_k: int) -> int:
    return router_params(d_model, experts) + top_k * expert_params(d_model, d_expert, gated, bias)
