#!/usr/bin/env bash
# Session 17's verification call for 553d4be (three consumers at bf16/f16 D = 64 causal from 2k keys instead
# of 4k; `auto` takes fa3 for causal calls up to D = 64 from 1k keys instead of 2k), from the repository root
# with gpu-bundle (of that commit) carried:
#   1. tests/fa3 whole, fa2_kernels' auto test (auto against the reference on the GPU, small calls), and
#      `sdpa run --kernel auto` at bf16 D = 64 causal 1k (16 x 32 heads), which must now report fa3;
#   2. the product against our fa2 and PyTorch (flash, default = cuDNN) on the fa2bench grid at S = 512..4k,
#      bf16 and f16, and the two-consumer tile forced (`128,2,2@64`) at 2k and 4k in the same run.
#   [SHORT=1] bash bench/studies/session17/call5.sh   (SHORT: bf16 only, S = 2k and 4k, tests cut at 110 s)
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=/usr/local/cuda SDPA_CUDA_CACHE=/tmp/sdpa-cache17
export OUT=${OUT:-/tmp/out}; O=$OUT; mkdir -p "$O"
if [ -n "${SHORT:-}" ]; then T=110 BT=90 F16= SEQS="2048 4096"; else T=140 BT=150 F16=--f16 SEQS="512 1024 2048 4096"; fi
RUNS="fa3 fa2_kernels:auto" DEADLINE=$T SAN_S=0 bash bench/studies/session10/tests10.sh > /tmp/tests.txt 2>&1
cp /tmp/tests.txt "$O/"; sed -n '/== tests/,$p' /tmp/tests.txt | head -8
SDPA_REQUIRE_GPU=1 gpu-bundle/sdpa run --backend cuda --kernel auto --dtype bf16 --shape 16,32,32,1024,1024,64 \
  --mask causal --warmup 1 --reps 3 --check --json > "$O/auto.json" 2>&1
echo "auto rc=$? programs: $(grep -oE '"(fa3|fa2)[a-z0-9_]*"' "$O/auto.json" | sort -u | tr '\n' ' ')"
timeout $BT python3 sdpa-cuda/dev/fa3_bench.py --bench gpu-bundle/cuda_kernels $F16 --seqs $SEQS \
  --variants --tiles 128,2,2@64 --tile-seqs 2048 4096 --out "$O" > "$O/bench.log" 2>&1
echo "fa3_bench rc=$?"
cp /tmp/fa3_*_raw.json "$O"/ 2>/dev/null  # the forced tile's records, kept even if the PyTorch stage timed out
grep -vE "^(ENV|CEILINGS)" "$O/bench.log" | tail -16
