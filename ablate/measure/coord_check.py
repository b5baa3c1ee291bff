"""The coordinate check (`ablate coord-check`): is each activation's size independent of the
model's width (or depth)? The test of a parametrization of Yang et al. 2022 ("Tensor Programs V",
section 5) as the `mup` package runs it (mup/coord_check.py): build the model at several widths,
train each a few steps with the real optimizer at one learning rate, and record the mean |x| of
every module's output at steps 1..N (step 1: the forward pass at init). Under the standard
parametrization the sublayer outputs and the logits grow with width after the first update;
under muP they stay flat. The size of that growth is measured here as the log-log slope of mean
|x| against width, per seed, with its spread over seeds.

Differences from the `mup` package's check, each on purpose: the batches are the run's own
training batches in their paired order (batch step s at step s, the same for every width and
seed), not one batch repeated; the learning rate is train.lr with no warmup or decay, and there is
no gradient clipping (as there), so what moves the activations is the parametrization alone.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Optional, Sequence

from ablate.analysis.stats import mean_std
from ablate.errors import ConfigError
from ablate.model.component import sublayers
from ablate.names import LR
from ablate.train.threads import use_threads

MIN_SIZES = 3  # a slope through two points has no residual: a third says whether it is a line
DEFAULT_WIDTHS = (64, 128, 256, 512)
DEFAULT_STEPS = 5
DEFAULT_SEEDS = 3
# Before the user's overrides (which win): mean |x| averages batch x seq_len x width coordinates,
# so 4 x 64 tokens measure it to a few percent while the widest model's step stays ~1 s on a CPU
# core (the run's default 16 x 128 would take 8x as long).
SMALL_BATCH = ("train.batch_size=4", "train.seq_len=64")
FLAT = 0.15  # |slope| at most this: "flat" in the reading (the threshold muP is tested against)
TRANSIENT_STEPS = 3  # judged steps (2..4) that show whether a slope settles after the init's transient


class Sweep(str, Enum):
    WIDTH = "width"
    DEPTH = "depth"

    @property
    def key(self) -> str:
        return "model.d_model" if self is Sweep.WIDTH else "model.n_layers"

    @property
    def base_key(self) -> str:
        return "model.base_width" if self is Sweep.WIDTH else "model.base_depth"

    @property
    def flag(self) -> str:
        return f"--{self.value}s"


class Module(str, Enum):
    """What is measured; the value is the --json key."""

    EMBEDDING = "embedding"  # the input to block 0 (token and position embeddings, dropout)
    ATTN_LOGITS = "attn_logits"  # q.k x scale, causal entries, before soft-capping or position bias
    ATTN_OUT = "attn_out"  # the attention sublayer's output, before the residual add
    FFN_HIDDEN = "ffn_hidden"  # the FFN's hidden activation (an MoE's: over its experts' rows)
    FFN_OUT = "ffn_out"  # the FFN sublayer's output, before the residual add
    RESIDUAL = "residual"  # each block's output; its number is the last block's (see Trace.mean)
    LOGITS = "logits"  # the output logits

    @property
    def label(self) -> str:
        return LABELS[self]


LABELS = {Module.EMBEDDING: "embedding output", Module.ATTN_LOGITS: "attention logits",
          Module.ATTN_OUT: "attention output", Module.FFN_HIDDEN: "FFN hidden", Module.FFN_OUT: "FFN output",
          Module.RESIDUAL: "residual stream", Module.LOGITS: "output logits"}


@dataclass(frozen=True)
class Request:
    """What to measure: the sizes of one sweep, steps and seeds, on the config of `overrides`."""

    sweep: Sweep
    sizes: tuple[int, ...]
    steps: int
    seeds: int
    overrides: tuple[str, ...] = ()


EXAMPLE_SIZES = {"--widths": "64,128,256", "--depths": "2,4,8"}


def parse_sizes(text: str, flag: str) -> tuple[int, ...]:
    """"64,128,256" -> (64, 128, 256), ascending; ConfigError (one line) for anything else."""
    example = f"e.g. {flag} {EXAMPLE_SIZES.get(flag, '64,128,256')}"
    items = [t.strip() for t in text.split(",")]
    if not all(t.lstrip("-").isdigit() for t in items):
        raise ConfigError(f"{flag} takes whole numbers separated by commas, {example}; got '{text}'")
    sizes = [int(t) for t in items]
    if len(set(sizes)) != len(sizes):
        raise ConfigError(f"{flag} {text}: each size once")
    if len(sizes) < MIN_SIZES:
        raise ConfigError(f"{flag} {text}: give at least {MIN_SIZES} sizes (any two points fit a line: a "
                          f"third shows whether mean |x| follows a power law), {example}")
    bad = next((s for s in sizes if s < 1), None)
    if bad is not None:
        raise ConfigError(f"{flag} {text}: every size must be positive, got {bad}")
    return tuple(sorted(sizes))


def check_request(request: Request, n_heads: Optional[int]) -> None:
    """Refuse what cannot be measured, before anything is built or written (n_heads: the
    composed config's, once known)."""
    if request.steps < 1:
        raise ConfigError(f"--steps must be at least 1 (step 1 is the forward pass at init), got {request.steps}")
    if request.seeds < 1:
        raise ConfigError(f"--seeds must be at least 1, got {request.seeds}")
    if request.sweep is Sweep.WIDTH and n_heads is not None:
        bad = next((w for w in request.sizes if w % n_heads), None)
        if bad is not None:
            raise ConfigError(f"--widths: {bad} is not divisible by model.n_heads={n_heads} (the head count "
                              "stays fixed, so head_dim grows with the width); use multiples of it")
    for o in request.overrides:
        if o.lstrip("+~").split("=", 1)[0] == request.sweep.key:
            raise ConfigError(f"{o}: {request.sweep.flag} sets {request.sweep.key}; drop the override")


def size_overrides(request: Request, size: int, param: str, base_set: bool) -> list[str]:
    """The overrides of one size: coord-check's small batch, the user's, then the size, and under
    a parametrization with rules the smallest size as the base shape unless the user gave one
    (a model at its own base shape trains as sp: nothing would be checked)."""
    out = [*SMALL_BATCH, *request.overrides, f"{request.sweep.key}={size}"]
    if param != "sp" and not base_set:
        out.append(f"{request.sweep.base_key}={min(request.sizes)}")
    return out


# ---- the measurement ---------------------------------------------------------------------------

class Probe:
    """Within `with`: each module's mean |x| at every forward pass, one list per layer, read
    on the host once per step (`take`). The components record while it runs (Sublayer.record):
    an attention component reports its logits' mean |x| itself (MEAN_ABS_ATTN_LOGIT; the
    built-in one takes the explicit attention path, the same numbers as SDPA)."""

    def __init__(self, model):
        self.model = model
        self._handles: list = []
        self._now: dict[Module, list] = {}

    def __enter__(self) -> "Probe":
        blocks = self.model.blocks
        self._handles.append(blocks[0].register_forward_pre_hook(self._hook(Module.EMBEDDING, inputs=True)))
        for block in blocks:
            self._handles += [block.attn.register_forward_hook(self._hook(Module.ATTN_OUT)),
                              block.ffn.register_forward_hook(self._hook(Module.FFN_OUT)),
                              block.register_forward_hook(self._hook(Module.RESIDUAL))]
            for component in sublayers(block):
                component.record(True)
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        for block in self.model.blocks:
            for component in sublayers(block):
                component.record(False)

    def _hook(self, module: Module, inputs: bool = False):
        def hook(mod, args, output=None):
            x = args[0] if inputs else output
            self._now.setdefault(module, []).append(x.detach().float().abs().mean())
        return hook

    def take(self, logits) -> dict[Module, list[float]]:
        """This step's values (per layer; one for the embedding and the logits), then reset."""
        import torch

        from ablate.model.component import MEAN_ABS_ATTN_LOGIT, MEAN_ABS_FFN_HIDDEN

        now = self._now
        nan = torch.full((), float("nan"), device=logits.device)  # a component that does not report it
        now[Module.ATTN_LOGITS] = [b.attn.diag_stats().get(MEAN_ABS_ATTN_LOGIT, nan).float()
                                   for b in self.model.blocks]
        now[Module.FFN_HIDDEN] = [b.ffn.diag_stats().get(MEAN_ABS_FFN_HIDDEN, nan).float()
                                  for b in self.model.blocks]
        now[Module.LOGITS] = [logits.detach().float().abs().mean()]
        flat = torch.stack([v for m in Module for v in now[m]]).tolist()  # one host sync
        out, i = {}, 0
        for m in Module:
            out[m], i = flat[i:i + len(now[m])], i + len(now[m])
        self._now = {}
        return out


@dataclass
class Trace:
    """One model (a size and a seed) trained `steps` steps: values[module][step - 1] holds that
    step's mean |x| per layer."""

    size: int
    seed: int
    values: dict[Module, list[list[float]]] = field(default_factory=dict)
    loss: list[float] = field(default_factory=list)  # the training loss at each step

    def mean(self, module: Module, step: int) -> float:
        """The table's number at `step` (1-based): the layers' mean, but for the residual stream
        the last block's output, the final residual stream (as Dey et al. 2025 and nanoGPT-mup
        plot it). Block l of L carries l/L of the updates, so the mean over blocks would fall with
        depth as (L + 1) / 2L even where the final stream is flat (-0.21 from 2 to 8 layers)."""
        layers = self.values[module][step - 1]
        return layers[-1] if module is Module.RESIDUAL else sum(layers) / len(layers)


def train_trace(model, optimizer, batches, steps: int, autocast: Callable = nullcontext) -> Trace:
    """`steps` forward passes on batches 0..steps-1 with an update after each but the last (the
    `mup` package updates after the last too; nothing reads it)."""
    trace = Trace(size=0, seed=0)
    model.train()
    with Probe(model) as probe:
        for step in range(steps):
            x, y = batches.get(step)
            with autocast():
                out = model(x.to(_device(model)), y.to(_device(model)))
            for m, v in probe.take(out.logits).items():
                trace.values.setdefault(m, []).append(v)
            trace.loss.append(float(out.loss.detach()))
            if step < steps - 1:
                optimizer.zero_grad(set_to_none=True)
                out.loss.backward()
                optimizer.step()
    return trace


def _device(model):
    return next(model.parameters()).device


@dataclass(frozen=True)
class Setting:
    """What every size shares, read from the composed config of the smallest size."""

    param: str
    base: Optional[int]  # the base width (depth) of the sweep; None under sp
    lr: float
    batch_size: int
    seq_len: int
    device: str
    precision: str


def measure(request: Request, progress: Optional[Callable[[str], None]] = None) -> "CoordCheck":
    """Every size x seed, trained and recorded. ConfigError (one line) for bad input, before
    anything is built."""
    import torch

    from ablate.config.compose import compose_config
    from ablate.data.batches import Batches
    from ablate.model.spec import ModelSpec
    from ablate.model.transformer import build_model
    from ablate.train.launch import prepare_data, seed_everything
    from ablate.train.optimizer import build_optimizer
    from ablate.train.optimizers.optim_settings import OptimSpec
    from ablate.train.trainer import resolve_device, resolve_precision

    first = compose_config([*SMALL_BATCH, *request.overrides])
    check_request(request, int(first.model.n_heads))
    param = _param(first)
    base_given = first.model.get(request.sweep.base_key.split(".")[1]) is not None
    cfgs = [compose_config(size_overrides(request, s, param, base_given)) for s in request.sizes]
    use_threads(int(first.train.threads))  # ablate/train/threads.py
    device = resolve_device(str(first.train.device))
    precision = resolve_precision(str(first.train.precision), device)
    tok, data = prepare_data(first, progress=False)
    batches = Batches(data.train, int(first.train.seq_len), int(first.train.batch_size), data_seed=int(first.data_seed))
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if precision == "bf16" else nullcontext
    traces = []
    for size, cfg in zip(request.sizes, cfgs):
        spec = ModelSpec.from_config(cfg, tokenizer_vocab=tok.vocab_size)
        for seed in range(request.seeds):
            if progress:
                progress(f"{request.sweep.value} {size}, seed {seed}")
            seed_everything(seed)
            model = build_model(spec, seed=seed).to(device)
            optimizer = build_optimizer(model, cfg.train, device, OptimSpec.from_config(cfg))  # optim=muon too
            trace = train_trace(model, optimizer, batches, request.steps, autocast)
            trace.size, trace.seed = size, seed
            traces.append(trace)
    base = cfgs[0].model.get(request.sweep.base_key.split(".")[1]) if param != "sp" else None
    setting = Setting(param, base, float(first.train.lr), int(first.train.batch_size), int(first.train.seq_len),
                      str(device), precision)
    return CoordCheck(request, setting, traces)


def _param(cfg: Any) -> str:
    node = cfg.get("param")
    return "sp" if node is None else str(node.name)


# ---- slopes ------------------------------------------------------------------------------------

def loglog_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope of log y against log x (the exponent of a power law y ~ x^b);
    nan when a y is not positive and finite (a diverged model)."""
    if any(not (math.isfinite(y) and y > 0) for y in ys):
        return math.nan
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


@dataclass(frozen=True)
class Slope:
    module: Module
    step: int
    per_seed: tuple[float, ...]
    mean: float
    spread: Optional[float]  # the sample standard deviation over seeds; None with one seed


def slope_of(traces: list[Trace], module: Module, step: int) -> Slope:
    seeds = sorted({t.seed for t in traces})
    per_seed = []
    for seed in seeds:
        own = sorted((t for t in traces if t.seed == seed), key=lambda t: t.size)
        per_seed.append(loglog_slope([t.size for t in own], [t.mean(module, step) for t in own]))
    mean, spread = mean_std(per_seed)
    return Slope(module, step, tuple(per_seed), mean, spread)


@dataclass
class CoordCheck:
    """The result: every trace and, per module and step, the slope against the swept size."""

    request: Request
    setting: Setting
    traces: list[Trace]
    slopes: list[Slope] = field(init=False)

    def __post_init__(self) -> None:
        self.slopes = [slope_of(self.traces, m, step) for m in Module for step in range(1, self.request.steps + 1)]

    def slope(self, module: Module, step: int) -> Slope:
        return next(s for s in self.slopes if s.module is module and s.step == step)

    def judged_steps(self) -> list[int]:
        """Steps 2..N, after an update (the reading's): a parametrization's rules act through the
        updates, and at init only the init differs. Step 1 alone when it is all there is."""
        return list(range(2, self.request.steps + 1)) or [1]

    def reading(self) -> str:
        """One line, from the numbers: which modules grow, shrink or stay flat with the size."""
        steps = self.judged_steps()
        groups: dict[tuple[Trend, int], list[tuple[str, list[float]]]] = {}
        for m in Module:
            means = [self.slope(m, s).mean for s in steps]
            groups.setdefault(_trend(steps, means), []).append((m.label, means))
        where = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
        sizes = self.request.sizes
        parts = [f"{', '.join(label for label, _ in items)} {_trend_words(key, steps, items, self.request.sweep)}"
                 for key, items in sorted(groups.items(), key=lambda kv: (list(Trend).index(kv[0][0]), kv[0][1]))]
        return (f"{self.setting.param}, {self.request.sweep.value} {sizes[0]}-{sizes[-1]}, {where}: " + "; ".join(parts)
                + "".join(f" ({caution})" for caution in self.cautions()))

    def cautions(self) -> list[str]:
        """What the reading cannot tell from these settings: a parametrization's first steps
        after init (its transient) alone; a base shape outside the sizes swept."""
        s, r, out = self.setting, self.request, []
        if s.param != "sp" and len(self.judged_steps()) < TRANSIENT_STEPS:
            out.append(f"under {s.param} the steps right after init are a transient of the init, which "
                       f"shrinks the logits by design: judge from --steps {TRANSIENT_STEPS + 1} or more "
                       "(docs/parametrization.md)")
        if s.base is not None and not min(r.sizes) <= s.base <= max(r.sizes):
            out.append(f"{r.sweep.base_key}={s.base} is outside the {r.sweep.value}s {min(r.sizes)}-{max(r.sizes)}: "
                       f"no model here is at its base shape")
        return out

    def to_json(self) -> dict:
        """The --json record (keys in docs/parametrization.md)."""
        r, s = self.request, self.setting
        return {
            "sweep": r.sweep.value, "sizes": list(r.sizes), "steps": r.steps, "seeds": r.seeds,
            "overrides": list(r.overrides), "param": s.param, "base": s.base, LR: s.lr,
            "batch_size": s.batch_size, "seq_len": s.seq_len, "device": s.device, "precision": s.precision,
            "modules": [m.value for m in Module],
            "values": [{"size": t.size, "seed": t.seed, "step": i + 1, "module": m.value,
                        "mean": _finite(t.mean(m, i + 1)), "layers": [_finite(v) for v in t.values[m][i]]}
                       for t in self.traces for m in Module for i in range(r.steps)],
            "loss": [{"size": t.size, "seed": t.seed, "step": i + 1, "loss": _finite(v)}
                     for t in self.traces for i, v in enumerate(t.loss)],
            "slopes": [{"module": sl.module.value, "step": sl.step, "mean": _finite(sl.mean),
                        "spread": _finite(sl.spread), "per_seed": [_finite(v) for v in sl.per_seed]}
                       for sl in self.slopes],
            "reading": self.reading(),
        }


class Trend(Enum):
    """A module's slopes over the judged steps, in the reading's order."""

    GROWS = "grow"
    SHRINKS = "shrink"
    SETTLES = "flat from a later step"  # the first steps' slopes beyond FLAT, the last two or more within
    FLAT = "flat"
    UNMEASURED = "unmeasured"


def _trend(steps: list[int], means: list[float]) -> tuple[Trend, int]:
    """(trend, the step from which every slope is within +-FLAT; 0 when there is none)."""
    if any(math.isnan(x) for x in means):
        return Trend.UNMEASURED, 0
    within = next((i for i in range(len(means)) if all(abs(x) <= FLAT for x in means[i:])), len(means))
    if within == 0:
        return Trend.FLAT, steps[0]
    if len(means) - within >= 2:
        return Trend.SETTLES, steps[within]
    return (Trend.GROWS if sum(means) > 0 else Trend.SHRINKS), 0


def _trend_words(key: tuple[Trend, int], steps: list[int], items, sweep: Sweep) -> str:
    trend, flat_from = key
    if trend is Trend.UNMEASURED:
        return "not measured (a non-finite activation: the model diverged)"
    cut = steps.index(flat_from) if flat_from else len(steps)
    before = [x for _, means in items for x in means[:cut]]
    after = [abs(x) for _, means in items for x in means[cut:]]
    if trend is Trend.FLAT:
        return f"flat (|slope| <= {max(after):.2f})"
    if trend is Trend.SETTLES:
        return f"flat from step {flat_from} (|slope| <= {max(after):.2f}; {_span(before)} before)"
    return f"{trend.value} with {sweep.value} (slope {_span(before)})"


def _span(values: list[float]) -> str:
    lo, hi = f"{min(values):.2f}", f"{max(values):.2f}"
    return lo if lo == hi else f"{lo} to {hi}"


def _finite(x: Optional[float]) -> Optional[float]:
    return None if x is None or not math.isfinite(x) else x
