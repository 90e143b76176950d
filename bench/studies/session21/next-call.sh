#!/usr/bin/env bash
# The device call session 21 could not make (its device time went on failed starts), for the next session, from
# the repository root with gpu-bundle carried (keep fa2_kernels, fa3, machinery and wide_heads in
# gpu-bundle/tests). It runs what this session changed and never ran on a GPU:
#   1. side by side: wide_heads whole (the variants test's MLA shape now has 144 rows on its kv head, 2dfcead),
#      machinery (the warm-up test asks for fa2's deep tile by name beside the auto call, ab357d2) and
#      fa2_kernels' auto reference test (not passed since 3f35d46: it needs more than 120 s with a cold cache);
#   2. three consumers at D = 64 causal 512 / 1k / 2k against the product's two (session 17: 0.883 / 0.925 /
#      1.042x, before the staged epilogue, the lazy maximum and the half diagonal), bf16.
#   [T=300] [TT=90] bash bench/studies/session21/next-call.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=/usr/local/cuda SDPA_CUDA_CACHE=/tmp/sdpa-cache22
export OUT=${OUT:-/tmp/out}; O=$OUT; mkdir -p "$O/tiles"
RUNS="wide_heads machinery fa2_kernels:auto_matches" SAN="" DEADLINE=${T:-300} \
  bash bench/studies/session10/tests10.sh > /tmp/tests.txt 2>&1
for f in /tmp/w/tests10/*.rc; do echo "$(basename $f) $(cat $f)"; done
grep -h "test result\|panicked" /tmp/w/tests10/*.log | head -6
[ "${TT:-90}" != 0 ] && timeout ${TT:-90} python3 sdpa-cuda/dev/fa3_bench.py --bench gpu-bundle/cuda_kernels \
  --seqs 512 1024 2048 --variants --tiles 128,2,3@64 --tile-seqs 512 1024 2048 --out "$O/tiles" > "$O/tiles/tiles.log" 2>&1
echo "tiles rc=$?"; grep -iE "tile|^bf16  64 1" "$O/tiles/tiles.log" | tail -8 | cut -c1-120
cp /tmp/tests.txt "$O/"; cd "$O" && tar czf raw.tgz --remove-files tiles/fa3_*_raw.json tests.txt 2>/dev/null; ls "$O"
