"""`ablate bench --decode`: what generating with the configured model costs, per batch size.

The model is built as a run builds it, with random weights (decode cost does not depend on
training), in the run's compute dtype (train.precision resolved for the device: weights,
activations and KV cache alike), eager. Each timed round is one whole generation: a fresh KV
cache (ablate/model/kv_cache.py) with room for context + new_tokens positions, a random prompt
of `context` tokens per sequence prefilled into it, the first token picked (greedy), then
`new_tokens` decode steps of one token per sequence. Per batch size, the medians of the rounds:

  prefill tokens/s            batch x context / prefill time
  time to first token         the prefill and the first token's pick
  decode tokens/s aggregate   batch x new_tokens / decode time (every stream together)
  decode tokens/s per stream  new_tokens / decode time (what one sequence sees)
  KV cache bytes              measured from the cache tensors (KVCache.bytes()), and per token
  peak memory                 CUDA: max_memory_allocated; CPU: KV cache + weights and buffers

with each phase's round times and their spread (ablate/measure/rounds.py: the half-width of the
median's interval over the median; above SPREAD_LIMIT the rounds disagree and the table marks the figure).
Variants (--axes, --only, --vs) alternate with the baseline round by round at each batch size,
with the training bench's machinery (ablate/measure/bench.py: Contender, alternate, the per-round
ratios), and the ratio's rounds have a spread of their own (`ratio_spread`).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional

import torch

from ablate.errors import ConfigError
from ablate.measure.bench import Contender, alternate, device_label, memory_start, speed_ratios, sync, tick_clock
from ablate.measure.rounds import SPREAD_LIMIT, spread
from ablate.train.threads import use_threads

@dataclass
class DecodeModel:
    """The configured model, built for generating: random init, eval mode, compute dtype."""

    model: Any
    spec: Any
    device: torch.device
    precision: str  # bf16 | fp32
    setup: Callable[[], Any]  # re-applies the config's backend settings (models alternate in one process)

    @property
    def params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @property
    def weights_bytes(self) -> int:
        """Parameters and buffers (a RoPE or sinusoid table), at their dtype."""
        tensors = [*self.model.parameters(), *self.model.buffers()]
        return sum(t.numel() * t.element_size() for t in tensors)


def build_decode_model(cfg: Any, positions: int) -> DecodeModel:
    """ConfigError when `positions` (context + new tokens) are past the model's reach (a learned
    position table's rows)."""
    from ablate.model.spec import ModelSpec
    from ablate.model.transformer import build_model
    from ablate.train.backends import configure_backends
    from ablate.train.trainer import resolve_device, resolve_precision

    device = resolve_device(str(cfg.train.device))
    precision = resolve_precision(str(cfg.train.precision), device)
    spec = ModelSpec.from_config(cfg)
    model = build_model(spec, seed=int(cfg.seed))
    limit = model.pos.max_positions
    if limit is not None and positions > limit:
        raise ConfigError(f"--context + --new-tokens = {positions} positions, past the {limit} of "
                          f"pos={spec.pos} (model.max_seq_len); raise model.max_seq_len or shorten --context")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    model = model.to(device=device, dtype=dtype).eval()
    return DecodeModel(model, spec, device, precision, lambda: configure_backends(cfg.train, device.type))


class Generation:
    """One model generating for one batch: each call is one round (a fresh cache, the prefill,
    the first token, `new_tokens` decode steps), its phases timed by `clock`."""

    def __init__(self, label: str, dm: DecodeModel, batch: int, context: int, new_tokens: int,
                 clock: Callable[[], float], seed: int = 0):
        self.label, self.dm, self.batch, self.context, self.new_tokens, self.clock = (
            label, dm, batch, context, new_tokens, clock)
        gen = torch.Generator().manual_seed(seed)  # the same prompts for every model
        self.prompt = torch.randint(0, dm.spec.vocab_size, (batch, context), generator=gen).to(dm.device)
        self.prefill_s: list[float] = []
        self.decode_s: list[float] = []
        self.cache = None

    def __call__(self, _step: int = 0) -> torch.Tensor:
        from ablate.model.kv_cache import KVCache

        model, device = self.dm.model, self.dm.device
        self.cache = None  # the last round's cache is freed before the next is allocated
        cache = KVCache.for_model(model, batch=self.batch, capacity=self.context + self.new_tokens)
        with torch.inference_mode():
            sync(device)
            t0 = self.clock()
            token = model.decode(self.prompt, cache, last=True).argmax(-1)  # (B, 1)
            sync(device)
            t1 = self.clock()
            for _ in range(self.new_tokens):
                token = model.decode(token, cache).argmax(-1)  # one new token per sequence
            sync(device)
            t2 = self.clock()
        self.prefill_s.append(t1 - t0)
        self.decode_s.append(t2 - t1)
        self.cache = cache
        return token

    def contender(self) -> Contender:
        return Contender(self.label, self, self.batch * self.new_tokens, self.dm.device, self.dm.params,
                         clock=self.clock, setup=self.dm.setup)

    def forget(self) -> None:
        """Drop the warm-up rounds' times."""
        self.prefill_s, self.decode_s = [], []

    def phase(self, name: str) -> Contender:
        """This generation's rounds of one phase (prefill | decode) as a Contender of their own,
        for the per-round ratios of ablate/measure/bench.py."""
        times = list(self.prefill_s if name == "prefill" else self.decode_s)
        return Contender(self.label, self, 0, self.dm.device, times=times, steps_timed=len(times))


@dataclass
class DecodeSpeed:
    """One model at one batch size: the medians over the timed rounds, each phase's round times
    and their spread (None with one round)."""

    batch: int
    prefill_tokens_per_s: float
    time_to_first_token_ms: float
    decode_tokens_per_s_aggregate: float
    decode_tokens_per_s_per_stream: float
    decode_ms_per_step: float
    kv_cache_bytes: int  # measured from the cache tensors: batch x (context + new_tokens) positions
    kv_cache_bytes_per_token: int  # over those positions (a sliding layer keeps at most its window's)
    prefill_ms_per_round: list[float]
    decode_ms_per_round: list[float]
    prefill_spread: Optional[float]  # the half-width of the median's interval over the median (rounds.py)
    decode_spread: Optional[float]

    @classmethod
    def of(cls, g: Generation) -> "DecodeSpeed":
        prefill, decode = statistics.median(g.prefill_s), statistics.median(g.decode_s)
        kv = g.cache.bytes()
        return cls(g.batch, g.batch * g.context / prefill, 1e3 * prefill, g.batch * g.new_tokens / decode,
                   g.new_tokens / decode, 1e3 * decode / g.new_tokens, kv,
                   round(kv / (g.batch * (g.context + g.new_tokens))), [1e3 * t for t in g.prefill_s],
                   [1e3 * t for t in g.decode_s], spread(g.prefill_s).relative, spread(g.decode_s).relative)


def _timed(gens: list[Generation], rounds: int, warmup: int) -> None:
    """Warm-up rounds (untimed), then `rounds` rounds alternating the generations (ABBA...)."""
    contenders = [g.contender() for g in gens]
    for c in contenders:
        c.run(0, max(warmup, 1))
    for g in gens:
        g.forget()
    alternate(contenders, rounds, 1, 0)


def bench_decode(cfg: Any, batches: list[int], context: int, new_tokens: int, rounds: int = 5,
                 warmup: int = 1, clock: str = "wall",
                 progress: Optional[Callable[[str], None]] = None) -> dict:
    """The configured model's generation at each batch size (module docstring)."""
    from ablate.measure.inspect import DTYPE_BYTES
    from ablate.model.sliding import describe
    from ablate.model.spec import kv_cache_bytes_per_token

    use_threads(cfg.train.threads)  # ablate/train/threads.py
    dm = build_decode_model(cfg, context + new_tokens)
    tick = tick_clock(clock, dm.device)
    rows = []
    for batch in batches:
        if progress:
            progress(f"batch {batch}")
        memory_start(dm.device)  # CUDA: resets the peak; what is allocated now (the weights) stays in it
        gen = Generation("ablate", dm, batch, context, new_tokens, tick, seed=int(cfg.data_seed))
        _timed([gen], rounds, warmup)
        speed = DecodeSpeed.of(gen)
        peak = (torch.cuda.max_memory_allocated(dm.device) if dm.device.type == "cuda"
                else speed.kv_cache_bytes + dm.weights_bytes)
        rows.append({**asdict(speed), "peak_memory_bytes": peak})
        del gen  # its cache, before the next batch's
    return {"mode": "decode", "device": device_label(dm.device), "precision": dm.precision, "compile": False,
            "threads": torch.get_num_threads(), "context": context, "new_tokens": new_tokens,
            "rounds": rounds, "warmup": max(warmup, 1), "clock": clock, "spread_limit": SPREAD_LIMIT,
            "params": dm.params,
            "weights_bytes": dm.weights_bytes,
            "kv_cache_formula_bytes_per_token": kv_cache_bytes_per_token(dm.spec, DTYPE_BYTES[dm.precision],
                                                                         context + new_tokens),
            "attention_layers": describe(dm.spec),
            "peak_memory_kind": _memory_kind(dm.device), "rows": rows}


def _memory_kind(device: torch.device) -> str:
    if device.type == "cuda":
        return "cuda max_memory_allocated (weights, KV cache and activations)"
    return "CPU: KV cache + weights and buffers (activations and the allocator not counted)"


def bench_decode_variants(base_overrides: list[str], variants: list[tuple[str, list[str]]], batches: list[int],
                          context: int, new_tokens: int, rounds: int = 5, warmup: int = 1, clock: str = "wall",
                          progress: Optional[Callable[[str], None]] = None) -> dict:
    """Each variant against the baseline at each batch size, in alternating rounds; ratio:
    the variant's decode tokens/s over the baseline's (median of the per-round ratios)."""
    from ablate.config.compose import compose_config

    base_cfg = compose_config(base_overrides)
    use_threads(base_cfg.train.threads)  # ablate/train/threads.py
    base = build_decode_model(base_cfg, context + new_tokens)
    tick = tick_clock(clock, base.device)
    rows = []
    for label, extra in variants:
        try:
            dm = build_decode_model(compose_config(base_overrides + extra), context + new_tokens)
        except ConfigError as e:  # an option that cannot combine with these dims or positions
            rows.append({"variant": label, "error": str(e)})
            continue
        for batch in batches:
            if progress:
                progress(f"{label}, batch {batch}")
            rows.append(_pair(label, extra, base, dm, batch, context, new_tokens, rounds, warmup, tick,
                              int(base_cfg.data_seed)))
        del dm
    return {"mode": "decode", "baseline": {"overrides": base_overrides, "params": base.params},
            "rows": rows, "device": device_label(base.device), "precision": base.precision,
            "context": context, "new_tokens": new_tokens, "batches": batches, "rounds": rounds,
            "warmup": max(warmup, 1), "clock": clock, "spread_limit": SPREAD_LIMIT}


def _pair(label: str, extra: list[str], base: DecodeModel, dm: DecodeModel, batch: int, context: int,
          new_tokens: int, rounds: int, warmup: int, tick: Callable[[], float], seed: int) -> dict:
    """The variant and the baseline at one batch size, alternating rounds."""
    b = Generation("baseline", base, batch, context, new_tokens, tick, seed)
    v = Generation(label, dm, batch, context, new_tokens, tick, seed)
    _timed([b, v], rounds, warmup)
    bs, vs = DecodeSpeed.of(b), DecodeSpeed.of(v)
    decode, prefill = speed_ratios(v.phase("decode"), b.phase("decode")), speed_ratios(v.phase("prefill"), b.phase("prefill"))
    return {"variant": label, "overrides": extra, "params": dm.params, **asdict(vs),
            "baseline": asdict(bs), "ratio": decode["ratio"], "ratio_best": decode["ratio_best"],
            "round_ratios": decode["round_ratios"], "ratio_spread": spread(decode["round_ratios"]).relative,
            "prefill_ratio": prefill["ratio"],
            "kv_cache_ratio": bs.kv_cache_bytes / vs.kv_cache_bytes}
