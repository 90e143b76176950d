#!/usr/bin/env bash
# Session 21, device call 2, from the repository root with gpu-bundle carried (bundle of the tree where the
# causal diagonal's P·V runs over the first 64 keys only; `SDPA_FA3_AB=full-diag` runs it whole):
#   1. tests/fa3 and fa3_ragged whole, fa3_variants' dtype/layout test, fa3's reference test under full-diag,
#      compute-sanitizer on fa3's small calls;
#   2. the fa2bench grid, S = 512..4k, bf16 and f16: the product against full-diag (the non-causal points are
#      the control), fa2, cuDNN and FLASH_ATTENTION.
#   [T=170] [SAN_S=60] [BT=170] bash bench/studies/session21/call2.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=/usr/local/cuda SDPA_CUDA_CACHE=/tmp/sdpa-cache21
export OUT=${OUT:-/tmp/out}; O=$OUT; mkdir -p "$O"
RUNS="fa3 fa3_ragged fa3_variants:in_both_dtypes fa3:fa3_matches_the_reference@SDPA_FA3_AB=full-diag" \
SAN="fa3:small_calls_for_the_sanitizer" DEADLINE=${T:-170} SAN_S=${SAN_S:-60} bash bench/studies/session10/tests10.sh > /tmp/tests.txt 2>&1
for f in /tmp/w/tests10/*.rc; do echo "$(basename $f) $(cat $f)"; done
grep -h "test result\|panicked" /tmp/w/tests10/*.log | head -8
grep -v warm-up /tmp/w/tests10/san.txt
timeout ${BT:-170} python3 sdpa-cuda/dev/fa3_bench.py --bench gpu-bundle/cuda_kernels --f16 --seqs 512 1024 2048 4096 \
  --variants full:SDPA_FA3_AB=full-diag --out "$O" > "$O/bench.log" 2>&1
echo "fa3_bench rc=$?"; grep -vE "^(ENV|CEILINGS)" "$O/bench.log" | tail -42 | cut -c1-120
cp /tmp/tests.txt "$O/"; cd "$O" && tar czf raw.tgz --remove-files fa3_*_raw.json tests.txt 2>/dev/null; ls "$O"
