#!/usr/bin/env bash
# Session 18's third device call: the product with one add per wgmma descriptor step (fa3_wgmma.cuh fa3_desc),
# from the repository root with gpu-bundle (of that commit, with tests/fa3_variants) carried:
#   1. tests: fa3, fa3_fp8, fa3_ragged and fa3_variants whole (every class, FP8, ragged and variant entries take
#      the new descriptors), and fa3's reference test under the switch (`SDPA_FA3_AB=desc-fold`);
#   2. the fa2bench grid, bf16 and f16, S = 512..16k without 8k: the product against our fa2, cuDNN and
#      FLASH_ATTENTION, with the descriptors formed as before (`desc-fold`) as a variant in the same run;
#   3. FP8 against bf16 at S = 512, 2k, 8k with `desc-fold` as a variant.
#   bash bench/studies/session18/call3.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=/usr/local/cuda SDPA_CUDA_CACHE=/tmp/sdpa-cache18
export OUT=${OUT:-/tmp/out}; O=$OUT; mkdir -p "$O"
RUNS="fa3 fa3_fp8 fa3_ragged fa3_variants fa3:fa3_matches_the_reference@SDPA_FA3_AB=desc-fold" DEADLINE=${T:-200} \
  SAN_S=0 bash bench/studies/session10/tests10.sh > /tmp/tests.txt 2>&1
sed -n '/== tests/,$p' /tmp/tests.txt | head -8
timeout ${BT:-260} python3 sdpa-cuda/dev/fa3_bench.py --bench gpu-bundle/cuda_kernels --f16 \
  --seqs 512 1024 2048 4096 16384 --variants fold:SDPA_FA3_AB=desc-fold --out "$O" > "$O/bench.log" 2>&1
echo "fa3_bench rc=$?"
grep -vE "^(ENV|CEILINGS)" "$O/bench.log" | tail -22 | cut -c1-120
mkdir -p "$O/fp8"
timeout ${FT:-80} python3 sdpa-cuda/dev/fa3_fp8_bench.py --bench gpu-bundle/cuda_kernels --seqs 512 2048 8192 \
  --reps 10 --no-torch --variants fold:SDPA_FA3_AB=desc-fold --out "$O/fp8" > "$O/fp8.log" 2>&1
echo "fp8 rc=$?"; tail -3 "$O/fp8.log" | cut -c1-400
cp /tmp/tests.txt "$O/"
cd "$O" && tar czf raw.tgz --remove-files fa3_*_raw.json fp8 tests.txt 2>/dev/null; ls "$O"
