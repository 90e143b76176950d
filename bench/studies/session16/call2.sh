#!/usr/bin/env bash
# Session 16's second device call, right after the first on the same warm machine (gpu-bundle carried):
# fa3's key tile at the short lengths where it trails cuDNN most (issue 25: bf16 D = 64 causal 0.71-0.80x
# at S = 512..2k, D = 128 0.81-0.87x at 512..1k; bench/results/gpu/fa3.md, session 10). The table's tile is
# 128 keys, two stages; this times 64 keys four and three deep and 96 keys three deep at D = 64, and 64x4 and
# 96x3 at D = 128 (`SDPA_FA3_TILE`, through fa3_bench.py --tiles), each against the default tile, fa2 and
# PyTorch (flash, default = cuDNN) in the same run, every output checked. Then (session 17, NCU_S seconds
# kept for it) where the weakest point's time goes: ncu's stall sampling on one launch of the product tile at
# bf16 D = 64 causal, B = 32, H = 32, S = 512 (sdpa-cuda/dev/ncu_stalls.sh; the report travels in $OUT).
#   T=240 [NCU_S=90] bash bench/studies/session16/call2.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=/usr/local/cuda SDPA_CUDA_CACHE=/tmp/sdpa-cache15
command -v ncu > /dev/null || export PATH="$PATH:$CUDA_HOME/bin"
nvidia-smi -L
timeout "${T:-240}" python3 sdpa-cuda/dev/fa3_bench.py --bench gpu-bundle/cuda_kernels --seqs 512 1024 2048 \
  --variants --tiles 64,4@64 64,3@64 96,3@64 64,4@128 96,3@128 --tile-seqs 512 1024 2048 \
  --out "${OUT:-/tmp/out}" > /tmp/fa3tiles.log 2>&1
echo "fa3_bench rc=$?"
cp /tmp/fa3tiles.log "${OUT:-/tmp/out}/" 2>/dev/null
grep -vE "^(ENV|CEILINGS)" /tmp/fa3tiles.log | tail -40
if [ "${NCU_S:-90}" -gt 0 ]; then
  OUT=${OUT:-/tmp/out} timeout "${NCU_S:-90}" bash sdpa-cuda/dev/ncu_stalls.sh fa3-d64-causal-512 fa3 gpu-bundle/sdpa run \
    --backend cuda --kernel fa3 --dtype bf16 --shape 32,32,32,512,512,64 --mask causal --warmup 1 --reps 1 \
    > /tmp/ncu.txt 2>&1
  echo "ncu rc=$?"; cp /tmp/ncu.txt "${OUT:-/tmp/out}/" 2>/dev/null; head -40 /tmp/ncu.txt
fi
