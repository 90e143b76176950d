#!/usr/bin/env bash
# Session 20, device call 3 (call 2's bundle: O staged through shared memory):
#   1. issue 25's whole fa2bench grid, bf16 and f16, S = 512..16k: the product against SDPA_FA3_AB=direct-o,
#      fa2, cuDNN and FLASH_ATTENTION in the same run;
#   2. ncu with per-instruction stall samples on the product at D = 64 causal S = 512 (B = 32, H = 32), the
#      grid's lowest point; the SASS source page kept;
#   3. (CPU=1) session 19's K/V staging of sdpa-cpu on the host's Xeon: the AVX2 prefill grid against PyTorch
#      on AVX2, staged and unstaged, two pinned threads, GPU idle (target-cpu19/cpu_bench carried).
#   [BT=260] [CPU=1] bash bench/studies/session20/call3.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=/usr/local/cuda SDPA_CUDA_CACHE=/tmp/sdpa-cache20
export OUT=${OUT:-/tmp/out}; O=$OUT; mkdir -p "$O"
timeout ${BT:-260} python3 sdpa-cuda/dev/fa3_bench.py --bench gpu-bundle/cuda_kernels --f16 \
  --seqs 512 1024 2048 4096 8192 16384 --variants direct:SDPA_FA3_AB=direct-o --out "$O" > "$O/bench.log" 2>&1
echo "fa3_bench rc=$?"
grep -vE "^(ENV|CEILINGS)" "$O/bench.log" | tail -14 | cut -c1-120
OUT=$O timeout 130 bash sdpa-cuda/dev/ncu_stalls.sh d64c-512 fa3_ gpu-bundle/sdpa run --backend cuda --kernel fa3 \
  --shape 32,32,32,512,512,64 --mask causal --warmup 1 --reps 1 > "$O/ncu.txt" 2>&1
echo "ncu rc=$?"; head -16 "$O/ncu.txt" | cut -c1-150
gzip -c /tmp/source-d64c-512.csv > "$O/source-d64c-512.csv.gz" 2>/dev/null; gzip -f "$O/d64c-512.ncu-rep" 2>/dev/null
if [ "${CPU:-1}" = 1 ]; then
  taskset -c 0,1 timeout 180 python3 bench/cpu/pytorch_cpu_sdpa.py --ours target-cpu19/cpu_bench --simd avx2 \
    --preset prefill --rounds 2 --reps 3 --threads 2 --torch-kernels fused --no-read-bw \
    --ours-variant unstaged:SDPA_CPU_STAGE=0 --out "$O/avx2-prefill-staged-xeon.json" > "$O/cpu.log" 2>&1
  echo "cpu rc=$?"; grep "^|" "$O/cpu.log" | cut -c1-160
fi
cd "$O" && tar czf raw.tgz --remove-files fa3_*_raw.json 2>/dev/null; ls "$O"
