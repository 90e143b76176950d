#!/usr/bin/env bash
# The device call session 20 could not make (its device time went on failed starts), for the next session, from
# the repository root with gpu-bundle carried. Build the bundle from a tree with `half-diag.patch` applied
# (`git apply bench/studies/session20/half-diag.patch`: a causal warpgroup whose rows see only the first 64 keys
# of its last tile runs that tile's Q·Kᵀ at N = 64 and P·V over those keys; `SDPA_FA3_AB=full-diag` computes
# the whole tile; compiled by NVRTC for sm_90a in session 20, registers and spills unchanged, never run), then:
#   1. tests/fa3 and fa3_ragged whole, fa3_variants' dtype/layout test, fa3's reference test under full-diag,
#      tests/fa2_kernels' auto reference and kernel-report tests (`auto` takes fa3 for causal D <= 64 from 512
#      keys since 3f35d46), compute-sanitizer on fa3's small calls;
#   2. `sdpa run --kernel auto` at bf16 D = 64 causal S = 512 (B = 32, H = 32): the kernel that ran;
#   3. the fa2bench grid, S = 512..4k (F16=1: f16 too), the product against full-diag (the non-causal points are
#      the control: the switch changes nothing there), fa2, cuDNN and FLASH_ATTENTION;
#   4. (HT > 0) issue 21's head-dim grid (bf16, S = 1k and 4k) against direct-o (session 20's staged epilogue).
# If step 1 passes and step 3 shows the causal points faster, commit the patch as the product.
#   [T=200] [SAN_S=60] [BT=160] [F16=1] [HT=120] bash bench/studies/session20/next-call.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=/usr/local/cuda SDPA_CUDA_CACHE=/tmp/sdpa-cache21
export OUT=${OUT:-/tmp/out}; O=$OUT; mkdir -p "$O"
RUNS="fa3 fa3_ragged fa3_variants:in_both_dtypes fa3:fa3_matches_the_reference@SDPA_FA3_AB=full-diag fa2_kernels:auto_matches fa2_kernels:the_kernel_that_ran" \
SAN="fa3:small_calls_for_the_sanitizer" DEADLINE=${T:-200} SAN_S=${SAN_S:-60} bash bench/studies/session10/tests10.sh > /tmp/tests.txt 2>&1
for f in /tmp/w/tests10/*.rc; do echo "$(basename $f) $(cat $f)"; done
grep -h "test result\|panicked" /tmp/w/tests10/*.log | head -8
grep -v warm-up /tmp/w/tests10/san.txt
SDPA_REQUIRE_GPU=1 gpu-bundle/sdpa run --backend cuda --kernel auto --shape 32,32,32,512,512,64 --mask causal \
  --warmup 2 --reps 10 > "$O/auto.txt" 2>&1; echo "auto rc=$?"; grep -iE "kernel|fa3|fa2" "$O/auto.txt" | head -4
[ "${F16:-1}" = 1 ] && F16ARG=--f16 || F16ARG=
timeout ${BT:-160} python3 sdpa-cuda/dev/fa3_bench.py --bench gpu-bundle/cuda_kernels $F16ARG --seqs 512 1024 2048 4096 \
  --variants full:SDPA_FA3_AB=full-diag --out "$O" > "$O/bench.log" 2>&1
echo "fa3_bench rc=$?"; grep -vE "^(ENV|CEILINGS)" "$O/bench.log" | tail -42 | cut -c1-120
if [ "${HT:-120}" != 0 ]; then
  mkdir -p "$O/hd"
  timeout ${HT:-120} python3 sdpa-cuda/dev/fa3_bench.py --bench gpu-bundle/cuda_kernels --headdims --seqs 1024 4096 \
    --variants direct:SDPA_FA3_AB=direct-o --out "$O/hd" > "$O/hd/headdims.log" 2>&1
  echo "headdims rc=$?"; grep -vE "^(ENV|CEILINGS|bf16 )" "$O/hd/headdims.log" | tail -16 | cut -c1-120
fi
cp /tmp/tests.txt "$O/"; cd "$O" && tar czf raw.tgz --remove-files fa3_*_raw.json hd/fa3_*_raw.json tests.txt 2>/dev/null; ls "$O"
