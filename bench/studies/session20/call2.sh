#!/usr/bin/env bash
# Session 20, device call 2 (bundle of the tree with O staged through shared memory, Fa3Smem::O_STAGED):
#   1. tests/fa3, fa3_fp8 and fa3_ragged whole, fa3_variants' dtype/layout and non-finite tests (the variant
#      reference test passed whole in call 1; the epilogue is the same code for every entry), the reference
#      test under SDPA_FA3_AB=direct-o; compute-sanitizer memcheck, racecheck and synccheck on fa3's and
#      fa3_fp8's small calls (staged classes 40, 64, 80, 128, 192/128 and unstaged 160, 224);
#   2. the fa2bench grid (bf16, S = 512..8k): the product against direct-o, fa2, cuDNN and FLASH_ATTENTION;
#   3. FP8 at S = 512, 2k, 8k against direct-o; the head-dim grid's other staged classes (96, 192/128) at 1k, 4k.
#   [T=270] [SAN_S=90] [BT=140] bash bench/studies/session20/call2.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=/usr/local/cuda SDPA_CUDA_CACHE=/tmp/sdpa-cache20
export OUT=${OUT:-/tmp/out}; O=$OUT; mkdir -p "$O"
RUNS="fa3 fa3_fp8 fa3_ragged fa3_variants:in_both_dtypes fa3_variants:nonfinite fa3:fa3_matches_the_reference@SDPA_FA3_AB=direct-o" \
SAN="fa3:small_calls_for_the_sanitizer fa3_fp8:small_calls_for_the_sanitizer" \
  DEADLINE=${T:-270} SAN_S=${SAN_S:-90} bash bench/studies/session10/tests10.sh > /tmp/tests.txt 2>&1
for f in /tmp/w/tests10/*.rc; do echo "$(basename $f) $(cat $f)"; done
grep -h "test result\|panicked\|FAILED" /tmp/w/tests10/*.log | head -14
cat /tmp/w/tests10/san.txt | grep -v warm-up
timeout ${BT:-140} python3 sdpa-cuda/dev/fa3_bench.py --bench gpu-bundle/cuda_kernels --seqs 512 1024 2048 4096 8192 \
  --variants direct:SDPA_FA3_AB=direct-o --out "$O" > "$O/bench.log" 2>&1
echo "fa3_bench rc=$?"
grep -vE "^(ENV|CEILINGS)" "$O/bench.log" | tail -26 | cut -c1-120
mkdir -p "$O/fp8" "$O/hd"
timeout 60 python3 sdpa-cuda/dev/fa3_fp8_bench.py --bench gpu-bundle/cuda_kernels --seqs 512 2048 8192 --no-torch \
  --variants direct:SDPA_FA3_AB=direct-o --out "$O/fp8" > "$O/fp8/fp8.log" 2>&1
echo "fp8 rc=$?"; grep -vE "^(ENV|CEILINGS)" "$O/fp8/fp8.log" | tail -16 | cut -c1-120
timeout 70 python3 sdpa-cuda/dev/fa3_bench.py --bench gpu-bundle/cuda_kernels --headdims --dims 96 192/128 --seqs 1024 4096 \
  --variants direct:SDPA_FA3_AB=direct-o --out "$O/hd" > "$O/hd/hd.log" 2>&1
echo "hd rc=$?"; grep -vE "^(ENV|CEILINGS)" "$O/hd/hd.log" | tail -12 | cut -c1-120
cp /tmp/tests.txt "$O/"
cd "$O" && tar czf raw.tgz --remove-files fa3_*_raw.json fp8/*_raw.json hd/*_raw.json tests.txt 2>/dev/null; ls -R "$O" | head -20
