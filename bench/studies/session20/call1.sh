#!/usr/bin/env bash
# Session 20, device call 1 (bundle of the tree where fa3.cu's variant entries take the lazy row maximum too):
#   1. tests/fa3_variants and tests/fa3 whole (session 19's next-call.sh step 1);
#   2. the fa2bench grid with the 8k column, bf16, the product against SDPA_FA3_AB=eager-max, fa2, cuDNN and
#      FLASH_ATTENTION in the same run (step 2);
#   3. ncu with per-instruction stall samples on one fa3 launch at D = 128 non-causal S = 512 (B = 32, H = 16),
#      where fa3 stood at 0.81x cuDNN; the whole SASS source page kept (source-d128-512.csv.gz) to study here.
#   [T=230] [BT=140] bash bench/studies/session20/call1.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=/usr/local/cuda SDPA_CUDA_CACHE=/tmp/sdpa-cache20
export OUT=${OUT:-/tmp/out}; O=$OUT; mkdir -p "$O"
RUNS="fa3_variants fa3" DEADLINE=${T:-230} SAN_S=0 bash bench/studies/session10/tests10.sh > /tmp/tests.txt 2>&1
sed -n '/== tests/,$p' /tmp/tests.txt | head -8
for f in /tmp/w/tests10/*.rc; do echo "$(basename $f) $(cat $f)"; done
grep -h "test result\|panicked\|FAILED" /tmp/w/tests10/*.log | head -12
timeout ${BT:-140} python3 sdpa-cuda/dev/fa3_bench.py --bench gpu-bundle/cuda_kernels --seqs 512 1024 2048 4096 8192 \
  --variants eager:SDPA_FA3_AB=eager-max --out "$O" > "$O/bench.log" 2>&1
echo "fa3_bench rc=$?"
grep -vE "^(ENV|CEILINGS)" "$O/bench.log" | tail -24 | cut -c1-120
OUT=$O timeout 150 bash sdpa-cuda/dev/ncu_stalls.sh d128-512 fa3_ gpu-bundle/sdpa run --backend cuda --kernel fa3 \
  --shape 32,16,16,512,512,128 --warmup 1 --reps 1 > "$O/ncu.txt" 2>&1
echo "ncu rc=$?"; head -60 "$O/ncu.txt" | cut -c1-150
gzip -c /tmp/source-d128-512.csv > "$O/source-d128-512.csv.gz" 2>/dev/null
cp /tmp/tests.txt "$O/"
cd "$O" && tar czf raw.tgz --remove-files fa3_*_raw.json tests.txt 2>/dev/null; ls "$O"
