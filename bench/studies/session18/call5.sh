#!/usr/bin/env bash
# Session 18's fifth device call: the lazy row maximum (kernels/fa3.cu FA3_MAX_SLACK), bundle of b14c0d0, from the
# repository root with gpu-bundle carried:
#   1. tests/fa3, fa3_fp8 and fa3_ragged whole and fa3_variants' reference and non-finite tests (every entry
#      kind takes the new rule; the variant tests include large scales and softcap / ALiBi scores);
#   2. the fa2bench grid in bf16 at S = 512..4k: the product against the old rule (`SDPA_FA3_AB=eager-max`),
#      our fa2, cuDNN and FLASH_ATTENTION in the same run.
#   [T=150] [BT=100] [SEQS="512 1024 2048 4096"] bash bench/studies/session18/call5.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=/usr/local/cuda SDPA_CUDA_CACHE=/tmp/sdpa-cache18
export OUT=${OUT:-/tmp/out}; O=$OUT; mkdir -p "$O"
RUNS="fa3 fa3_fp8 fa3_ragged fa3_variants:fa3_variants_match_the_reference \
fa3_variants:fa3_nonfinite_values_outside_the_window_stay_outside" DEADLINE=${T:-150} SAN_S=0 \
  bash bench/studies/session10/tests10.sh > /tmp/tests.txt 2>&1
sed -n '/== tests/,$p' /tmp/tests.txt | head -8
timeout ${BT:-100} python3 sdpa-cuda/dev/fa3_bench.py --bench gpu-bundle/cuda_kernels --seqs ${SEQS:-512 1024 2048 4096} \
  --variants eager:SDPA_FA3_AB=eager-max --out "$O" > "$O/bench.log" 2>&1
echo "fa3_bench rc=$?"
grep -vE "^(ENV|CEILINGS)" "$O/bench.log" | tail -24 | cut -c1-120
cp /tmp/tests.txt "$O/"
cd "$O" && tar czf raw.tgz --remove-files fa3_*_raw.json tests.txt 2>/dev/null; ls "$O"
