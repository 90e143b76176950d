#!/usr/bin/env bash
# Session 20, device call 4 (bundle of the tree where `auto` takes fa3 for causal calls at D <= 64 from 512 keys,
# policy.rs; the kernels are call 2's):
#   1. `sdpa run --kernel auto` at bf16 D = 64 causal S = 512 (B = 32, H = 32): the kernel that ran;
#   2. tests/fa2_kernels' auto reference test and its kernel-report test;
#   3. issue 21's head-dim grid (bf16, D = 32..256 and 192/128, S = 1k and 4k): the product against direct-o,
#      fa2, cuDNN and FLASH_ATTENTION.
#   [BT=260] bash bench/studies/session20/call4.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=/usr/local/cuda SDPA_CUDA_CACHE=/tmp/sdpa-cache20 SDPA_REQUIRE_GPU=1
export OUT=${OUT:-/tmp/out}; O=$OUT; mkdir -p "$O"
gpu-bundle/sdpa run --backend cuda --kernel auto --shape 32,32,32,512,512,64 --mask causal --warmup 2 --reps 10 \
  > "$O/auto.txt" 2>&1; echo "auto rc=$?"; grep -iE "kernel|ms|check" "$O/auto.txt" | head -8
RUNS="fa2_kernels:auto_matches fa2_kernels:the_kernel_that_ran" DEADLINE=150 SAN_S=0 \
  bash bench/studies/session10/tests10.sh > /tmp/tests.txt 2>&1
for f in /tmp/w/tests10/*.rc; do echo "$(basename $f) $(cat $f)"; done
grep -h "test result\|panicked" /tmp/w/tests10/*.log | head -6
timeout ${BT:-260} python3 sdpa-cuda/dev/fa3_bench.py --bench gpu-bundle/cuda_kernels --headdims --seqs 1024 4096 \
  --variants direct:SDPA_FA3_AB=direct-o --out "$O" > "$O/headdims.log" 2>&1
echo "headdims rc=$?"; grep -vE "^(ENV|CEILINGS|bf16 )" "$O/headdims.log" | tail -16 | cut -c1-120
cp /tmp/tests.txt "$O/"; cd "$O" && tar czf raw.tgz --remove-files fa3_*_raw.json tests.txt 2>/dev/null; ls "$O"
