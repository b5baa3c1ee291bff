"""Issue 17, goal 3: can the seeds of one variant train as one batched model?

The candidate: the K seeds' parameters stacked (torch.func.stack_module_state) and one
forward/backward through torch.func.vmap, the K models sharing each batch (seeds change the
init; data_seed, the batch order, is shared). The issue asks that it stay bit-identical in its
curves to separate runs. This script checks one training step's losses and gradients bit for
bit against K separate models and times both ways.

    python3 scripts/seed_batching.py                        # the default tiny model, CPU
    python3 scripts/seed_batching.py --device cuda --bf16 model.d_model=384 model.n_layers=6 \\
        model.n_heads=6 train.seq_len=256 train.batch_size=32 --seeds 3
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
import warnings
from contextlib import nullcontext
from pathlib import Path

import torch
from torch.func import functional_call, stack_module_state, vmap

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ablate.config.compose import compose_config  # noqa: E402
from ablate.model.spec import ModelSpec  # noqa: E402
from ablate.model.transformer import build_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (model.*, train.seq_len, train.batch_size)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast, as train.precision=bf16")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    cfg = compose_config(["logger=none", *args.overrides])
    dev = torch.device(args.device)
    spec = ModelSpec.from_config(cfg, tokenizer_vocab=256)
    models = [build_model(spec, seed=s).to(dev) for s in range(args.seeds)]
    base = copy.deepcopy(models[0]).to("meta")  # the structure functional_call runs the weights through
    params, buffers = stack_module_state(models)  # name -> (K, ...) leaf tensors
    g = torch.Generator().manual_seed(0)
    w = torch.randint(0, 256, (cfg.train.batch_size, cfg.train.seq_len + 1), generator=g).to(dev)
    x, y = w[:, :-1], w[:, 1:]  # (B, T) each, shared by every seed
    autocast = (lambda: torch.autocast(dev.type, dtype=torch.bfloat16)) if args.bf16 else nullcontext

    def one(p, b):
        return functional_call(base, (p, b), (x, y)).loss

    def separate():
        losses = []
        for m in models:
            m.zero_grad(set_to_none=True)
            with autocast():
                loss = m(x, y).loss
            loss.backward()
            losses.append(loss.detach())
        return torch.stack(losses)

    def batched():
        for p in params.values():
            p.grad = None
        with autocast():
            losses = vmap(one)(params, buffers)  # (K,)
        losses.sum().backward()  # each seed's gradient is its own loss's: the sum adds no term
        return losses.detach()

    def timed(fn):
        best = float("inf")
        for _ in range(args.repeats):
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t = time.perf_counter()
            fn()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            best = min(best, time.perf_counter() - t)
        return best

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # vmap's "no batching rule" performance warnings
        sep, bat = separate(), batched()
        diffs = {n: max((p.grad[k] - dict(m.named_parameters())[n].grad).abs().max().item()
                        for k, m in enumerate(models)) for n, p in params.items()}
        t_sep, t_bat = timed(separate), timed(batched)
    unequal = {n: d for n, d in diffs.items() if d != 0}
    tokens = args.seeds * x.numel()
    print(f"{args.seeds} seeds, {sum(p[0].numel() for p in params.values()):,} params each, "
          f"{dev.type}{' bf16' if args.bf16 else ''}, {tuple(x.shape)} tokens per model")
    print(f"losses bit-identical: {bool(torch.equal(sep, bat))} (max |diff| {(sep - bat).abs().max().item():.3g})")
    print(f"gradients bit-identical: {len(diffs) - len(unequal)} of {len(diffs)} tensors "
          f"(max |diff| {max(diffs.values()):.3g})")
    print(f"forward+backward, best of {args.repeats}: separate {t_sep * 1e3:.1f} ms "
          f"({tokens / t_sep:,.0f} tokens/s), batched {t_bat * 1e3:.1f} ms ({tokens / t_bat:,.0f} tokens/s): "
          f"{t_sep / t_bat:.2f}x")


if __name__ == "__main__":
    main()
