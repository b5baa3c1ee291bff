#!/usr/bin/env bash
# The GPU measurements issues 14, 17 and 23 wait for, in six parts of under 10 minutes each (one
# `device` call per part; a device session has 30 minutes, so run them in this order of
# priority and issue each call right after the last: the machine is released when idle).
# Run on the GPU machine from the project root after `. .gpu-wheels/activate.sh`
# (../shared/scripts/offline-gpu-wheelhouse.sh builds it; name .gpu-wheels in the call's carry):
#
#   . .gpu-wheels/activate.sh; bash scripts/gpu-measure.sh tier  "$OUT"   # cuda test tier (14)
#   . .gpu-wheels/activate.sh; bash scripts/gpu-measure.sh bench "$OUT"   # throughput levers (14, 17)
#   . .gpu-wheels/activate.sh; bash scripts/gpu-measure.sh pack  "$OUT"   # small sweeps (17 goal 3)
#   . .gpu-wheels/activate.sh; bash scripts/gpu-measure.sh noise "$OUT"   # noise floor (14)
#   . .gpu-wheels/activate.sh; bash scripts/gpu-measure.sh transfer "$OUT" # LR grid, gpu ladder plan (23)
#   . .gpu-wheels/activate.sh; bash scripts/gpu-measure.sh twice "$OUT"    # the twice-the-tokens check (23)
#   . .gpu-wheels/activate.sh; bash scripts/gpu-measure.sh decode "$OUT"   # MHA vs GQA vs MQA decode cost (32)
#   . .gpu-wheels/activate.sh; bash scripts/gpu-measure.sh blocks "$OUT"   # window, MLA, MoE, Muon (44-47, 49)
#
# Each part writes its log (and JSON where there is one) to the folder given, so that what came
# back survives a part cut off at its limit. Every figure goes into README with the device and
# the date, next to the command that produced it (the commands are echoed into the log).
set -uo pipefail
part=${1:?tier, bench, noise, pack, transfer, twice, decode or blocks}
out=${2:-gpu-out}
mkdir -p "$out"
: "${ABLATE:=python3 -m cli.main}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/device.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$out/device.txt"
date -u +%F | tee -a "$out/device.txt"

say() { echo "+ $*" | tee -a "$out/$part.log"; }
run() { say "$*"; eval "$*" 2>&1 | tee -a "$out/$part.log"; }

# GPT-2-small dimensions, as issue 17's table: B=16, T=1024, bf16, compile.
SMALL="model=small tokenizer=gpt2 train=gpu train.batch_size=16 train.grad_accum=1 train.micro_batch=null"
SMALL4="$SMALL model.n_layers=4"  # every option timed at 4 layers (issue 14's table)
# The small ablation model of issue 17 goal 3: d=384, L=6, T=256, B=32.
ABL="train=gpu model.d_model=384 model.n_layers=6 model.n_heads=6 train.seq_len=256 train.batch_size=32 train.grad_accum=1"

case "$part" in
tier)
  run "python3 -m pytest -m cuda tests -q -p no:cacheprovider -n 0 --junitxml=$out/cuda-tier.xml"
  ;;
bench)
  run "$ABLATE bench $SMALL --reference --steps 30 --rounds 6 --warmup 3 --json > $out/reference.json; cat $out/reference.json | head -c 2000"
  run "$ABLATE bench $SMALL train.batch_size=32 --reference --steps 20 --rounds 4 --warmup 3"
  for v in train.fused_ce=true train.sdpa_backend=cudnn train.compile_mode=max-autotune-no-cudagraphs \
           train.compile_optimizer=true \
           train.deterministic=true "train.batch_size=32"; do
    run "$ABLATE bench $SMALL --vs '$v' --steps 20 --rounds 4 --warmup 3"
  done
  run "$ABLATE bench $SMALL4 --axes --steps 12 --rounds 4 --warmup 3 --json > $out/axes.json; tail -c 3000 $out/axes.json"
  ;;
noise)
  # run-to-run noise (same seed twice) next to seed noise (seeds 0..2), default-size GPU runs
  for name in a b; do
    run "$ABLATE run $ABL train.steps=400 logger=none train.progress=false hydra.run.dir=$out/noise/same_$name"
  done
  run "$ABLATE sweep $ABL train.steps=400 logger=none --seeds 3 hydra.sweep.dir=$out/noise/seeds"
  run "python3 - <<'PY'
import json, glob, statistics
same = [json.load(open(f'$out/noise/same_{n}/summary.json'))['val_loss'] for n in 'ab']
seeds = [json.load(open(p))['val_loss'] for p in sorted(glob.glob('$out/noise/seeds/*/summary.json'))]
print(f'same seed twice: |delta val_loss| = {abs(same[0] - same[1]):.5f}; seed std = {statistics.stdev(seeds):.5f} over {len(seeds)} seeds')
PY"
  ;;
pack)
  # goal 3 of issue 17: a small model's sweep filling the GPU; each candidate
  run "$ABLATE bench $ABL --jobs-per-device 1,2,4,8 --sweep-jobs 8 --steps 40 --json > $out/packing.json; cat $out/packing.json | head -c 3000"
  run "$ABLATE bench $ABL --vs train.compile_mode=reduce-overhead --steps 30 --rounds 6 --warmup 3"
  # the third candidate of goal 3: three seeds as one vmapped model (bit-identity and speed)
  run "python3 scripts/seed_batching.py --device cuda --bf16 $ABL --seeds 3"
  run "python3 scripts/seed_batching.py --device cuda $ABL --seeds 3"
  ;;
transfer)
  # issue 23 on a GPU: the QK-norm LR grid of docs/transfer.md at the small ablation model, with
  # the attention-logit diagnostics; the gpu ladder's plan (its full run takes hours: r3 is GPT-2
  # small on 20 tokens per parameter)
  run "$ABLATE sweep act=gelu,swiglu --ladder gpu --seeds 3 model=small train=gpu tokenizer=gpt2 --dry-run | head -8"
  run "$ABLATE sweep qk_norm=off,on --lr-grid 3e-4:3e-1:7 --seeds 3 $ABL train.steps=300 train.diagnostics_every=50 logger=none train.progress=false hydra.sweep.dir=$out/lr_qk"
  run "$ABLATE compare $out/lr_qk --json > $out/lr_qk.json; $ABLATE compare $out/lr_qk --plot $out/lr_qk.png"
  ;;
twice)
  # the twice-the-tokens check at the ratios and seeds 2 CPU cores cannot afford: the cpu ladder
  # at 40 vs 80 and 80 vs 160 tokens per parameter (docs/transfer.md). The GPU machine is offline
  # too, so this is the same 5 MB corpus: it cannot make the check pass on every rung (a rung that
  # repeats the corpus balances at its own ratio).
  run "$ABLATE sweep ladder.tokens_per_param=40,80 --ladder cpu --seeds 2 train.device=cuda logger=none train.progress=false hydra.sweep.dir=$out/ladder_2x_40"
  run "$ABLATE compare $out/ladder_2x_40 --json > $out/ladder_2x_40.json; $ABLATE compare $out/ladder_2x_40"
  run "$ABLATE sweep ladder.tokens_per_param=80,160 --ladder cpu --seeds 2 train.device=cuda logger=none train.progress=false hydra.sweep.dir=$out/ladder_2x"
  run "$ABLATE compare $out/ladder_2x --json > $out/ladder_2x.json; $ABLATE compare $out/ladder_2x"
  ;;
decode)
  # issue 32: what GQA and MQA buy when generating, each option against MHA in alternating rounds.
  # First the CPU run of docs/performance.md ("Decode cost: MHA, GQA and MQA") on the GPU (bf16
  # there: train.precision=auto; wall clock), then GPT-2-small dimensions, a prompt of 896 tokens
  # and 128 new ones (1,024 positions: the learned table's). Not run yet: written without a GPU.
  run "$ABLATE bench --decode --axes --only attn model.d_model=256 model.n_layers=4 model.n_heads=8 model.max_seq_len=2048 --batch 8,32 --context 1024 --new-tokens 64 --rounds 3 --warmup 1 train.device=cuda --json > $out/decode_cpu_run.json; tail -c 3000 $out/decode_cpu_run.json"
  run "$ABLATE bench --decode --axes --only attn $SMALL --batch 1,8,32,64 --new-tokens 128 --rounds 4 --warmup 1 --json > $out/decode_attn.json; tail -c 3000 $out/decode_attn.json"
  run "$ABLATE bench --decode $SMALL --batch 1,8,32,64 --new-tokens 128 --rounds 4 --warmup 1"
  ;;
blocks)
  # The blocks measured on CPU only (docs/sliding-window.md, mla.md, moe.md, optimizers.md). The
  # cuda tier (part tier) holds their correctness on the GPU: the flex band of a compiled
  # local:global window, MoE's grouped matmul, Muon in bf16. Here: what they cost and buy there.
  # Training step: a window of 256 at T=1024 (compiled flex band) and local:global, against full.
  run "$ABLATE bench $SMALL4 pos=rope --vs attn.window=256 --vs 'attn.window=256 attn.global_every=2' --steps 20 --rounds 4 --warmup 3"
  # MoE against dense, bf16 and compiled (torch._grouped_mm on CUDA), and the expert loop.
  run "$ABLATE bench $SMALL4 arch=llama --moe --steps 20 --rounds 4 --warmup 3 --json > $out/moe.json; tail -c 3000 $out/moe.json"
  # Muon's step against AdamW's (Newton-Schulz in bf16 per matrix, per expert for MoE banks).
  run "$ABLATE bench $SMALL4 --vs optim=muon --steps 20 --rounds 4 --warmup 3"
  run "$ABLATE bench $SMALL4 arch=llama ffn=moe --vs optim=muon --steps 20 --rounds 4 --warmup 3"
  # Decode at long contexts: a window of 1024 against full attention, MLA (absorbed, plain)
  # against MHA and GQA, each at the context where the KV cache dominates.
  for ctx in 1024 4096 16384; do
    run "$ABLATE bench --decode pos=rope model.d_model=768 model.n_layers=12 model.n_heads=12 model.max_seq_len=20000 train=gpu --vs attn.window=1024 --context $ctx --new-tokens 64 --batch 1,8 --rounds 3 --warmup 1"
    run "$ABLATE bench --decode arch=llama attn=mla model.d_model=768 model.n_layers=12 model.n_heads=12 model.max_seq_len=20000 train=gpu --vs attn=mha --vs attn=gqa --vs attn.decode=plain --context $ctx --new-tokens 64 --batch 1,8 --rounds 3 --warmup 1"
  done
  # The DeepSeek block trains compiled in bf16 (MLA + MoE with bias balancing), 200 steps.
  run "$ABLATE run arch=deepseek $ABL train.steps=200 logger=none train.progress=false hydra.run.dir=$out/deepseek"
  ;;
*) echo "unknown part '$part': tier, bench, noise, pack, transfer, twice, decode or blocks"; exit 2 ;;
esac
