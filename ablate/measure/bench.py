"""`ablate bench`: time full training steps of the configured model on synthetic batches.

What is timed is the trainer's own step (Trainer.train_step + Trainer.apply_update: forward,
backward, clip, optimizer), never a separate loop, so a speed-up measured here is a speed-up
of every run and sweep. Machine noise (other processes on a shared CPU) hits back-to-back
measurements alike, so comparisons alternate contenders in short rounds (ABAB...) inside one
process and report the median of the per-round ratios.

Three modes:
  bench(cfg)                   tokens/s, ms/step, peak memory, FLOPs/token, MFU
  bench(cfg, reference=True)   ... and a minimal plain-PyTorch GPT of the same dimensions
  bench_variants(overrides, variants)   each variant (e.g. every axis option) vs the baseline
"""

from __future__ import annotations

import math
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ablate.config.axes import preset_axes
from ablate.measure.bench_args import CLOCKS
from ablate.names import MFU, TOKENS, TOKENS_PER_S
from ablate.train.threads import use_threads

# ---- device peak FLOP/s: ablate/train/peak.py (the trainer's MFU uses it too) ---------------
from ablate.train.peak import GPU_PEAKS, Peak, device_peak, gpu_peak, mfu  # noqa: F401,E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_rss_bytes() -> int:
    """The process's peak resident set size (ru_maxrss: KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


# ---- contenders: something that does one full training step ---------------------------------


@dataclass
class Contender:
    name: str
    step: Callable[[int], Any]  # one full training step; returns the loss tensor
    tokens_per_step: int
    device: torch.device
    params: int = 0
    times: list[float] = field(default_factory=list)  # seconds per timed round
    steps_timed: int = 0
    last_loss: Optional[torch.Tensor] = None
    clock: Callable[[], float] = time.perf_counter
    # Re-applies the process-wide torch settings this contender was built with (TF32, SDPA
    # kernel, deterministic mode): the contenders of one bench alternate in one process.
    setup: Optional[Callable[[], Any]] = None

    def run(self, first_step: int, n: int) -> float:
        if self.setup is not None:
            self.setup()
        sync(self.device)
        t0 = self.clock()
        for i in range(n):
            self.last_loss = self.step(first_step + i)
        sync(self.device)
        return self.clock() - t0

    def round(self, first_step: int, n: int) -> None:
        self.times.append(self.run(first_step, n))
        self.steps_timed += n

    @property
    def step_s(self) -> float:
        """Median seconds per step over the timed rounds."""
        return statistics.median(t / (self.steps_timed / len(self.times)) for t in self.times)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s


def alternate(contenders: list[Contender], rounds: int, steps_per_round: int, start: int) -> None:
    """ABAB...: each round times every contender for steps_per_round steps, back to back."""
    for r in range(rounds):
        order = contenders if r % 2 == 0 else contenders[::-1]  # no one always goes first
        for c in order:
            c.round(start + r * steps_per_round, steps_per_round)


def round_ratios(a: Contender, b: Contender) -> list[float]:
    """Per-round tokens/s ratio a/b (a faster: > 1)."""
    return [tb / ta for ta, tb in zip(a.times, b.times)]


def speed_ratios(a: Contender, b: Contender) -> dict:
    """tokens/s of a relative to b: the median of the paired rounds (robust to slow drifts in
    machine load) and the ratio of the best rounds (robust to bursts)."""
    per_round = round_ratios(a, b)
    return {"ratio": statistics.median(per_round), "ratio_best": min(b.times) / min(a.times),
            "round_ratios": per_round}


# ---- our trainer ---------------------------------------------------------------------------

def synthetic_data(vocab: int, n_tokens: int, seed: int = 0):
    """Uniform random token ids in a TokenData, so the trainer's own batch code runs unchanged."""
    from ablate.data.cache import TokenData

    dtype = np.uint16 if vocab <= 2 ** 16 else np.uint32
    rng = np.random.default_rng(seed)
    train = rng.integers(0, vocab, size=n_tokens, dtype=dtype)
    val = rng.integers(0, vocab, size=4096, dtype=dtype)
    meta = {"source": "synthetic", "tokenizer": "synthetic", "vocab_size": vocab, "dtype": str(np.dtype(dtype)),
            "tokens": {"train": n_tokens, "val": len(val)}}
    return TokenData(train=train, val=val, meta=meta, path=Path("."))


def synthetic_tokens_needed(cfg: Any) -> int:
    t = cfg.train
    return max(1 << 20, 8 * t.batch_size * (t.seq_len + 1))


def build_trainer(cfg: Any, data=None):
    """The configured model inside the real Trainer, built as a run builds it (no sinks, no run
    directory writes), on synthetic tokens unless `data` is given. Returns (trainer, spec, params)."""
    from ablate.data.tokenizers import TOKENIZERS
    from ablate.model.spec import count_params
    from ablate.train import launch

    tok_vocab = TOKENIZERS.get(cfg.tokenizer.name).vocab_size
    if data is None:
        data = synthetic_data(tok_vocab, synthetic_tokens_needed(cfg), seed=cfg.data_seed)
    trainer, spec = launch.build_trainer(cfg, data, tok_vocab)
    trainer.train_model.train()
    return trainer, spec, count_params(spec)["total"]


def trainer_contender(name: str, trainer, params: int) -> Contender:
    def step(s: int) -> torch.Tensor:
        lm_loss, _, _ = trainer.train_step(s)
        trainer.apply_update()
        trainer.finish_diagnostics(updated=True)  # as fit does: the update ratios after the step
        return lm_loss

    from ablate.train.backends import configure_backends

    return Contender(name, step, trainer.tokens_per_step, trainer.device, params,
                     setup=lambda: configure_backends(trainer.cfg, trainer.device.type))


# ---- the reference: a minimal plain-PyTorch GPT ----------------------------------------------

class RefBlock(nn.Module):
    """nanoGPT's block: pre-LayerNorm, fused qkv, SDPA causal, GELU (tanh) MLP, biases."""

    def __init__(self, d: int, n_heads: int, d_ff: int):
        super().__init__()
        self.n_heads = n_heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, d_ff), nn.Linear(d_ff, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)  # (B, H, T, hd)
        k = k.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
        v = v.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, hd)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class RefGPT(nn.Module):
    """GPT-2: learned positions, tied embedding / head, final LayerNorm."""

    def __init__(self, vocab: int, d: int, n_layers: int, n_heads: int, d_ff: int, max_seq_len: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(max_seq_len, d)
        self.h = nn.ModuleList(RefBlock(d, n_heads, d_ff) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)  # (B, T, d)
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # (B, T, V), tied
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


# The reference's architecture on every axis (nanoGPT's is arch=gpt2): a ratio is like for like
# only where ours matches.
REFERENCE_AXES = preset_axes("gpt2")


def reference_differences(cfg: Any) -> list[str]:
    from ablate.config.schema import axis_values

    return [f"{k}={v}" for k, v in axis_values(cfg).items() if REFERENCE_AXES.get(k, v) != v]


def reference_contender(cfg: Any, spec, trainer, data) -> Contender:
    """The reference with our dims, precision, compile setting, AdamW settings and batch size,
    fed nanoGPT-style batches (random windows of the same token array)."""
    t = cfg.train
    device = trainer.device
    torch.manual_seed(cfg.seed)
    model = RefGPT(spec.vocab_size, spec.d_model, spec.n_layers, spec.n_heads, spec.d_ff,
                   spec.max_seq_len).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=t.lr, betas=(t.beta1, t.beta2), fused=(device.type == "cuda") or None)
    fwd = torch.compile(model) if trainer.train_model is not trainer.model else model
    bf16 = trainer.precision == "bf16"
    tokens = torch.from_numpy(data.train.astype(np.int64))
    B, T, accum = trainer.micro_batch, t.seq_len, trainer.grad_accum  # ours' cut of the global batch
    max_norm = t.grad_clip if t.grad_clip > 0 else float("inf")
    params = list(model.parameters())

    def get_batch():
        ix = torch.randint(len(tokens) - T - 1, (B,))
        x = torch.stack([tokens[i:i + T] for i in ix])
        y = torch.stack([tokens[i + 1:i + 1 + T] for i in ix])
        if device.type == "cuda":
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x, y

    def step(s: int) -> torch.Tensor:
        for _ in range(accum):
            x, y = get_batch()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = fwd(x, y)
            (loss / accum).backward()
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    n = sum(p.numel() for p in model.parameters())
    from ablate.train.backends import configure_backends

    return Contender("reference", step, B * T * accum, device, n,  # under ours' settings
                     setup=lambda: configure_backends(t, device.type))


# ---- the benchmarks --------------------------------------------------------------------------

def memory_start(device: torch.device) -> int:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    return 0


def _memory_peak(device: torch.device, start: int) -> tuple[int, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) - start, "cuda max_memory_allocated"
    return peak_rss_bytes(), "process peak RSS"


def _finite(c: Contender) -> bool:
    return c.last_loss is not None and bool(torch.isfinite(c.last_loss).all())


def tick_clock(name: str, device: torch.device) -> Callable[[], float]:
    from ablate.errors import ConfigError

    if name == "cpu" and device.type != "cpu":
        raise ConfigError("--clock cpu measures CPU time: use it on CPU only (GPUs run asynchronously)")
    return CLOCKS[name]


def bench(cfg: Any, steps: int = 20, warmup: int = 3, rounds: int = 5, reference: bool = False,
          clock: str = "wall") -> dict:
    """Time our trainer's step (and optionally the reference's, alternating). Returns a dict
    with tokens_per_s, step_ms, mfu, peak_flops, flops_per_token, and more."""
    from ablate.model.spec import flops_per_token

    use_threads(cfg.train.threads)  # ablate/train/threads.py
    t_build = time.perf_counter()
    trainer, spec, params = build_trainer(cfg)
    device = trainer.device
    mem0 = memory_start(device)
    ours = trainer_contender("ablate", trainer, params)
    ours.clock = tick_clock(clock, device)
    ours.run(0, max(warmup, 1))  # compile, allocator and optimizer state warm-up
    memory, memory_kind = _memory_peak(device, mem0)
    warm_s = time.perf_counter() - t_build
    contenders = [ours]
    ref = None
    if reference:
        ref_mem0 = memory_start(device)
        ref = reference_contender(cfg, spec, trainer, trainer.data)
        ref.clock = ours.clock
        ref.run(0, max(warmup, 1))
        ref_memory = _memory_peak(device, ref_mem0)[0] if device.type == "cuda" else None
        contenders.append(ref)
    rounds = min(rounds, steps)
    alternate(contenders, rounds, max(1, steps // rounds), warmup)
    fpt = flops_per_token(spec, cfg.train.seq_len)
    peak = device_peak(device, trainer.precision)
    tps = ours.tokens_per_s
    result = {
        TOKENS_PER_S: tps, "step_ms": ours.step_s * 1e3,
        MFU: mfu(tps, fpt, peak),
        "peak_flops": peak.flops, "peak_flops_source": peak.source,
        "flops_per_token": fpt, "achieved_flops": tps * fpt,
        "peak_memory_bytes": memory, "peak_memory_kind": memory_kind,
        "params": params, "tokens_per_step": ours.tokens_per_step,
        "steps": ours.steps_timed, "rounds": len(ours.times), "warmup": max(warmup, 1),
        "warmup_s": warm_s, "device": device_label(device), "precision": trainer.precision,
        "compile": trainer.train_model is not trainer.model, "threads": torch.get_num_threads(),
        "batch_size": cfg.train.batch_size, "seq_len": cfg.train.seq_len,
        "grad_accum": cfg.train.grad_accum, "loss_finite": _finite(ours), "clock": clock,
    }
    if ref is not None:
        result["reference"] = {
            TOKENS_PER_S: ref.tokens_per_s, "step_ms": ref.step_s * 1e3, "params": ref.params,
            MFU: mfu(ref.tokens_per_s, fpt, peak),
            "peak_memory_bytes": ref_memory, "loss_finite": _finite(ref),
            "differs_on": reference_differences(cfg),  # empty: the same model (arch=gpt2)
        }
        result.update(speed_ratios(ours, ref))  # ours / reference tokens/s: > 1, we are faster
    return result


def device_label(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def axis_variants(base_overrides: list[str]) -> list[tuple[str, list[str]]]:
    """(label, overrides) for every axis option other than the baseline's, then every arch
    preset other than the baseline's; each changes one thing relative to the baseline."""
    from ablate.config.axes import list_axes
    from ablate.config.compose import compose_config

    base = compose_config(base_overrides)
    out = []
    for row in list_axes():
        group = row["group"]
        if not row["axis"] and group != "arch":
            continue
        current = base[group].name if row["axis"] else _given(base_overrides, "arch", row["default"])
        for option in row["options"]:
            if option != current:
                out.append((f"{group}={option}", [f"{group}={option}"]))
    return out


def _given(overrides: list[str], key: str, default: str) -> str:
    for o in overrides:
        if o.split("=", 1)[0] == key:
            return o.split("=", 1)[1]
    return default


# `ablate bench --moe`: the MoE FFN against the dense one (the baseline's) at equal active
# parameters (the fair expert width), and the grouped products against a loop over the experts:
# (label, overrides, prepare(trainer) or None).
MOE_VARIANTS = [
    ("ffn=moe ffn.experts=8 ffn.top_k=2", ["ffn=moe", "ffn.experts=8", "ffn.top_k=2"], None),
    ("ffn=moe ffn.experts=32 ffn.top_k=8", ["ffn=moe", "ffn.experts=32", "ffn.top_k=8"], None),
    ("ffn=moe ffn.experts=32 ffn.top_k=8 (loop over experts)", ["ffn=moe", "ffn.experts=32", "ffn.top_k=8"],
     lambda trainer: expert_path(trainer.model, "loop")),
]


def expert_path(model, path: str) -> None:
    """Every MoE layer's expert products: "grouped" (the model's) or "loop" (the reference)."""
    from ablate.model.moe import MoE

    for m in model.modules():
        if isinstance(m, MoE):
            m.path = path


def _speed_row(variant, base, flops: float, base_flops: float) -> dict:
    """A variant's tokens/s against the baseline's in the same rounds, and what its FLOPs explain."""
    ratios = speed_ratios(variant, base)
    # At equal MFU a variant's tokens/s ratio is the inverse ratio of FLOPs/token: what its
    # extra math explains. Below that, its kernels are less efficient than the baseline's.
    flops_ratio = base_flops / flops
    return {TOKENS_PER_S: variant.tokens_per_s, "baseline_tokens_per_s": base.tokens_per_s, **ratios,
            "flops_per_token": flops, "flops_ratio": flops_ratio, "efficiency": ratios["ratio"] / flops_ratio}


def bench_variants(base_overrides: list[str], variants: list[tuple], steps: int = 10,
                   warmup: int = 2, rounds: int = 5, progress: Optional[Callable[[str], None]] = None,
                   clock: str = "wall") -> dict:
    """Each variant (extra overrides on top of the baseline's; a third element, prepare(trainer),
    changes how the built trainer runs) alternating with the baseline, one variant at a time;
    ratio = variant tokens/s / baseline tokens/s (median of rounds).

    Building a variant's Trainer resets torch.compile's state (every model compiles afresh,
    so the 9th variant does not run eagerly past dynamo's recompile limit); the baseline
    recompiles and is warmed up again before each pair is timed. A row says
    compile_fallback: true if dynamo gave up on a function anyway while it was timed."""
    from ablate.config.compose import compose_config
    from ablate.errors import ConfigError
    from ablate.model.spec import active_params
    from ablate.train.backends import RecompileWatch, graphs_compiled

    base_cfg = compose_config(base_overrides)
    use_threads(base_cfg.train.threads)  # ablate/train/threads.py
    trainer, spec, params = build_trainer(base_cfg)
    base = trainer_contender("baseline", trainer, params)
    base.clock = tick_clock(clock, trainer.device)
    base.run(0, max(warmup, 1))
    rows = []
    rounds = min(rounds, steps)
    steps_per_round = max(1, steps // rounds)
    for label, extra, *prepare in variants:
        if progress:
            progress(label)
        try:
            cfg = compose_config(base_overrides + extra)
        except ConfigError as e:  # an option that cannot combine with these dims
            rows.append({"variant": label, "error": str(e)})
            continue
        with RecompileWatch() as watch:
            v_trainer, v_spec, v_params = build_trainer(cfg, data=trainer.data)  # resets compile state
            if prepare and prepare[0] is not None:
                prepare[0](v_trainer)
            variant = trainer_contender(label, v_trainer, v_params)
            variant.clock = base.clock
            graphs = graphs_compiled()
            variant.run(0, max(warmup, 1))
            if v_trainer.compiled:  # dynamo skips code it gave up on before, without a warning
                watch.check_compiled(graphs)
            base.run(0, max(warmup, 1))  # the baseline's compiled code went with the reset
            base.times, base.steps_timed = [], 0
            alternate([base, variant], rounds, steps_per_round, warmup)
        rows.append({"variant": label, "overrides": extra, "params": v_params, "active_params": active_params(v_spec),
                     **_speed_row(variant, base, v_trainer.flops_per_token, trainer.flops_per_token),
                     "compile_fallback": bool(watch.hits),
                     **({"compile_fallback_reason": watch.reason} if watch.hits else {})})
        del v_trainer, variant
    return {"baseline": {"overrides": base_overrides, "params": params, "active_params": active_params(spec),
                         "flops_per_token": trainer.flops_per_token}, "rows": rows,
            "compile_fallbacks": sum(bool(r.get("compile_fallback")) for r in rows),
            "device": device_label(trainer.device), "tokens_per_step": base.tokens_per_step,
            "steps_per_round": steps_per_round, "rounds": rounds, "clock": clock}


# ---- several jobs per device: `ablate bench --jobs-per-device 1,2,4,8` ----------------------
# The same small sweep (n identical jobs: build, warm up, train `steps` steps) run with k jobs
# at once on one device, for each k: what `ablate sweep --jobs-per-gpu K` buys. Each job is its
# own process (python -m ablate.measure.bench --pack-worker), as a sweep job is; it imports torch and
# the model code, not Hydra: the parent hands it the composed config as plain JSON.

def pack_job(config: dict, steps: int, warmup: int) -> dict:
    """One job of the packed sweep, in its own process: time its trainer's steps."""
    from omegaconf import OmegaConf

    t_start = time.time()
    cfg = OmegaConf.create(config)
    if cfg.train.threads > 0:
        torch.set_num_threads(cfg.train.threads)
    trainer, _, params = build_trainer(cfg)
    job = trainer_contender("job", trainer, params)
    job.run(0, max(warmup, 1))
    t0 = time.time()
    seconds = job.run(max(warmup, 1), steps)
    return {TOKENS_PER_S: steps * job.tokens_per_step / seconds, "tokens_per_step": job.tokens_per_step,
            "steps": steps, "started": t_start, "timed_from": t0, "timed_to": time.time(),
            "threads": torch.get_num_threads(), "device": device_label(trainer.device),
            "loss_finite": _finite(job), "hydra_imported": "hydra" in sys.modules}


def _worker_main(argv: list[str]) -> None:
    """`python -m ablate.measure.bench --pack-worker`: a JSON spec on stdin, one JSON line on stdout;
    on failure one `error: ...` line on stderr and exit 1."""
    import json

    try:
        spec = json.loads(sys.stdin.read())
        out = pack_job(spec["config"], int(spec["steps"]), int(spec["warmup"]))
    except Exception as e:  # noqa: BLE001 - the parent reports it in one line
        text = str(e).strip().splitlines()
        print(f"error: {type(e).__name__}: {text[0] if text else ''}", file=sys.stderr)
        raise SystemExit(1)
    print(json.dumps(out), flush=True)


def _pool(specs: list[str], k: int, env: dict) -> tuple[float, list[dict]]:
    """Run the jobs `k` at a time (a new one starts as soon as one ends, as a launcher with k
    slots does); (wall seconds from the first start to the last end, each job's result)."""
    import json
    import subprocess
    import tempfile

    from ablate.errors import AblateError

    results: list[Optional[dict]] = [None] * len(specs)
    pending, running = list(range(len(specs))), {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ablate-bench-") as tmp:
        try:
            while pending or running:
                while pending and len(running) < k:
                    i = pending.pop(0)
                    out, err = open(f"{tmp}/{i}.out", "w+"), open(f"{tmp}/{i}.err", "w+")
                    p = subprocess.Popen([sys.executable, "-m", "ablate.measure.bench", "--pack-worker"],
                                         stdin=subprocess.PIPE, stdout=out, stderr=err, env=env, text=True)
                    p.stdin.write(specs[i])
                    p.stdin.close()
                    running[i] = (p, out, err)
                for i, (p, out, err) in list(running.items()):
                    if p.poll() is None:
                        continue
                    del running[i]
                    out.seek(0), err.seek(0)
                    lines = out.read().strip().splitlines()
                    if p.returncode != 0 or not lines:
                        errors = [ln for ln in err.read().strip().splitlines() if ln.strip()]
                        why = errors[-1] if errors else f"exit code {p.returncode}"
                        raise AblateError(f"bench job #{i} at {k} jobs per device failed: {why}")
                    results[i] = json.loads(lines[-1])
                time.sleep(0.005)
        finally:
            for p, _, _ in running.values():  # an error above: stop the others
                p.kill()
                p.wait()
    return time.perf_counter() - t0, results  # type: ignore[return-value]


def bench_packing(cfg: Any, jobs_per_device: list[int], jobs: int = 8, steps: int = 20, warmup: int = 3,
                  progress: Optional[Callable[[str], None]] = None) -> dict:
    """`jobs` identical jobs of cfg's model, k at a time on one device, for each k. Per k: the
    wall time of all jobs (process start, imports, build and warm-up included, as a sweep pays
    them), aggregate tokens/s = timed tokens of all jobs / that wall time, speedup vs the first
    k, and each job's own tokens/s over its timed steps; training_tokens_per_s: timed tokens over
    the time any job was in its timed steps (the device's throughput without start-up).
    Threads: cfg's train.threads if set, else the cores split between the k jobs."""
    import json
    import os

    from omegaconf import OmegaConf

    from ablate.sweep import usable_cores

    config = OmegaConf.to_container(cfg, resolve=True)
    config.pop("hydra", None)
    cores = usable_cores()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[2])] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    rows = []
    for k in jobs_per_device:
        threads = int(cfg.train.threads) or max(1, cores // k)
        config["train"]["threads"] = threads
        env["OMP_NUM_THREADS"] = str(threads)  # so no process spins up a thread per core first
        if progress:
            progress(f"{jobs} jobs, {k} at a time, {threads} threads each")
        spec = json.dumps({"config": config, "steps": steps, "warmup": warmup})
        wall, results = _pool([spec] * jobs, k, env)
        tokens = sum(r["steps"] * r["tokens_per_step"] for r in results)
        training_s = _union(results)
        rows.append({"jobs_per_device": k, "threads_per_job": threads, "wall_s": wall, TOKENS: tokens,
                     TOKENS_PER_S: tokens / wall, "training_s": training_s,
                     "training_tokens_per_s": tokens / training_s,
                     "job_tokens_per_s": statistics.median(r[TOKENS_PER_S] for r in results),
                     "max_overlap": _max_overlap(results), "loss_finite": all(r["loss_finite"] for r in results),
                     "jobs": results})
    for row in rows:
        row["speedup"] = rows[0]["wall_s"] / row["wall_s"]
    first = rows[0]["jobs"][0]
    return {"mode": "jobs_per_device", "device": first["device"], "jobs": jobs, "steps": steps,
            "warmup": max(warmup, 1), "tokens_per_step": first["tokens_per_step"], "cores": cores,
            "rows": rows}


def _union(results: list[dict]) -> float:
    """Seconds during which at least one job ran its timed steps: all jobs' timed tokens over
    this is the device's throughput while training, without process start-up."""
    total, end = 0.0, float("-inf")
    for a, b in sorted((r["timed_from"], r["timed_to"]) for r in results):
        total += max(0.0, b - max(a, end))
        end = max(end, b)
    return total


def _max_overlap(results: list[dict]) -> int:
    """The most jobs whose timed steps ran at the same moment (proof that k really ran at once)."""
    events = sorted([(r["timed_from"], 1) for r in results] + [(r["timed_to"], -1) for r in results],
                    key=lambda e: (e[0], e[1]))
    best = now = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


if __name__ == "__main__":
    if sys.argv[1:] == ["--pack-worker"]:
        _worker_main(sys.argv[1:])
    else:
        sys.exit("usage: python -m ablate.measure.bench --pack-worker  (a JSON spec on stdin; used by ablate bench)")
