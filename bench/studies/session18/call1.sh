#!/usr/bin/env bash
# Session 18's first device call, from the repository root with gpu-bundle carried:
#   1. tests: tests/fa3 whole (the product, with session 17's three consumers from 2k keys at D = 64 causal),
#      fa3's reference and NaN tests and the FP8 tests with every exponential on the FMA pipe
#      (`SDPA_FA3_AB=exp-fma=8`: the polynomial on every score, masked ones and NaN included), fa2_kernels' auto
#      test; `sdpa run --kernel auto` at bf16 D = 64 causal 1k, which must name an fa3 entry (session 17's rule);
#   2. bf16 fa3 against our fa2, cuDNN and FLASH_ATTENTION on the fa2bench grid at S = 512..4k and 16k, with 2, 3
#      and 4 eighths of the exponentials on the FMA pipe (exp-fma=k) as variants in the same run, and session
#      17's forced two-consumer tile at D = 64 2k/4k;
#   3. FP8 fa3 against bf16 with exp-fma=2 and 4 as variants.
#   bash bench/studies/session18/call1.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=/usr/local/cuda SDPA_CUDA_CACHE=/tmp/sdpa-cache18
export OUT=${OUT:-/tmp/out}; O=$OUT; mkdir -p "$O"
AB=SDPA_FA3_AB=exp-fma=8
RUNS="fa3 fa3:fa3_matches_the_reference@$AB fa3:fa3_keeps_a_nan_query_in_its_row@$AB fa3_fp8@$AB fa2_kernels:auto" \
  DEADLINE=${T:-150} SAN_S=0 bash bench/studies/session10/tests10.sh > /tmp/tests.txt 2>&1
cp /tmp/tests.txt "$O/"; sed -n '/== tests/,$p' /tmp/tests.txt | head -10
SDPA_REQUIRE_GPU=1 gpu-bundle/sdpa run --backend cuda --kernel auto --dtype bf16 --shape 16,32,32,1024,1024,64 \
  --mask causal --warmup 1 --reps 3 --check --json > "$O/auto.json" 2>&1
echo "auto rc=$? programs: $(grep -oE '"(fa3|fa2)[a-z0-9_]*"' "$O/auto.json" | sort -u | tr '\n' ' ')"
timeout ${BT:-230} python3 sdpa-cuda/dev/fa3_bench.py --bench gpu-bundle/cuda_kernels --seqs 512 1024 2048 4096 16384 \
  --variants e2:SDPA_FA3_AB=exp-fma=2 e3:SDPA_FA3_AB=exp-fma=3 e4:SDPA_FA3_AB=exp-fma=4 \
  --tiles 128,2,2@64 --tile-seqs 2048 4096 --out "$O" > "$O/bench.log" 2>&1
echo "fa3_bench rc=$?"
cp /tmp/fa3_*_raw.json fa3_tile_*_raw.json "$O"/ 2>/dev/null; rm -f fa3_tile_*_raw.json
grep -vE "^(ENV|CEILINGS)" "$O/bench.log" | tail -26
mkdir -p "$O/fp8"
timeout ${FT:-110} python3 sdpa-cuda/dev/fa3_fp8_bench.py --bench gpu-bundle/cuda_kernels --seqs 512 2048 8192 \
  --reps 10 --no-torch --variants e2:SDPA_FA3_AB=exp-fma=2 e4:SDPA_FA3_AB=exp-fma=4 --out "$O/fp8" > "$O/fp8.log" 2>&1
echo "fp8 rc=$?"; tail -20 "$O/fp8.log"
cd "$O" && tar czf raw.tgz --remove-files fa3_*_raw.json fp8 tests.txt 2>/dev/null; ls "$O"
