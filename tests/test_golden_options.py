"""Golden outputs of the option machinery: `ablate inspect --dtype bf16 --json` for every option of every axis
and each arch preset, and `ablate axes --json`, frozen in tests/golden/. A refactor of how options
are declared, counted or listed must leave these byte for byte unchanged.

A deliberate change (a new built-in option, a new key in the report) regenerates them:

    .venv/bin/python tests/test_golden_options.py --write

then review `git diff tests/golden/` before committing: every changed number is a behaviour change.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "golden"
INSPECT = GOLDEN / "inspect.json"
AXES = GOLDEN / "axes.json"
# The cases frozen on 2026-11-24: every option of every axis, the presets, a few mixes (fixed here, not
# read from the registry, so a lost option fails instead of silently dropping its case).
CASES = [
    "norm=layernorm", "norm=rmsnorm", "norm=dyt",
    "norm_pos=pre", "norm_pos=post", "norm_pos=sandwich", "norm_pos=reordered",
    "act=relu", "act=gelu", "act=silu", "act=swiglu", "act=geglu", "act=reglu",
    "pos=learned", "pos=sinusoidal", "pos=rope", "pos=alibi", "pos=nope",
    "attn=mha", "attn=gqa", "attn=mqa", "attn=mla",
    "ffn=dense", "ffn=moe",
    "tie=tied", "tie=untied",
    "bias=on", "bias=off",
    "dropout=off", "dropout=on",
    "qk_norm=off", "qk_norm=on",
    "param=sp", "param=mup", "param=completep",
    "arch=gpt2", "arch=llama", "arch=vaswani", "arch=deepseek_dense",
    # options interact in the counts: a few mixed variants (space-separated overrides)
    "model.parallel_block=true act=geglu", "model.mtp_heads=2 norm=rmsnorm", "norm_pos=post tie=untied",
    "norm_pos=sandwich bias=off qk_norm=on attn=mqa", "arch=llama model.d_model=256 model.n_heads=8",
    "param=mup model.d_model=256 model.base_width=64 arch=llama",
    "param=completep model.n_layers=8 model.base_depth=2 model.base_width=64",
    "arch=llama ffn=moe ffn.experts=4 ffn.top_k=1 ffn.dense_first=1 param=mup model.base_width=64",
    "attn=mla pos=rope attn.q_rank=32 attn.kv_rank=48 attn.rope_dim=8", "arch=deepseek_dense param=mup model.d_model=256 model.base_width=128",
    # sliding windows (added 2026-11-29): the presets and local:global on the default block
    "arch=mistral", "arch=gemma3", "pos=rope attn.window=16 attn.global_every=2",
    # the trainer's axis (added 2026-11-29): the matrices each optimizer updates and their LRs
    "optim=muon act=swiglu attn=gqa", "optim=muon param=mup model.d_model=256 model.base_width=64 arch=llama",
    "optim=muon optim.adjust=original optim.adam_lr=0.003 train.lr=0.02",
    "optim=muon ffn=moe ffn.experts=4 attn=mla pos=rope act=swiglu",
    "arch=deepseek", "arch=llama ffn=moe ffn.router=sigmoid ffn.shared=2 ffn.capacity=1.25 ffn.aux_scope=sequence",
]


def cli(*args: str) -> str:
    """The CLI's stdout, in this process (the same code path as `ablate ...`, without a fork)."""
    from typer.testing import CliRunner

    from cli.main import app

    res = CliRunner().invoke(app, list(args))
    assert res.exit_code == 0, (args, res.output)
    return res.stdout


def produce() -> tuple[dict, list]:
    inspect = {case: json.loads(cli("inspect", *case.split(), "logger=none", "--dtype", "bf16", "--json")) for case in CASES}
    return inspect, json.loads(cli("axes", "--json"))


def test_inspect_and_axes_outputs_are_unchanged():
    inspect, axes = produce()
    golden = json.loads(INSPECT.read_text())
    assert list(golden) == CASES
    for case in CASES:
        assert inspect[case] == golden[case], f"`ablate inspect {case} --json` changed"
    assert axes == json.loads(AXES.read_text()), "`ablate axes --json` changed"


if __name__ == "__main__":
    if "--write" not in sys.argv:
        sys.exit("usage: python tests/test_golden_options.py --write  (rewrites tests/golden/)")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    inspect, axes = produce()
    GOLDEN.mkdir(exist_ok=True)
    INSPECT.write_text(json.dumps(inspect, indent=1) + "\n")
    AXES.write_text(json.dumps(axes, indent=1) + "\n")
    print(f"wrote {INSPECT} ({len(inspect)} cases) and {AXES}")
