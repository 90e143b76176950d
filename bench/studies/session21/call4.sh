#!/usr/bin/env bash
# Session 21, device call 4, from the repository root with gpu-bundle carried (bundle of the tree where `wide`
# runs a banded slab's products in blocks of rows, each over the keys its rows see; SDPA_WIDE_BLOCK_ROWS=0
# runs each slab whole, as before):
#   1. side by side: tests/wide_heads whole, once more under SDPA_WIDE_BLOCK_ROWS=16 (every causal and windowed
#      case of it in ragged blocks), and fa2_kernels' auto reference test (`auto` has taken fa3 for causal
#      D <= 64 from 512 keys since 3f35d46; it ran out of call 1's deadline);
#   2. the block rows swept at causal D = 512 1k / 4k / 16k and D = 1024 1k, then the product at those points
#      against PyTorch's default, efficient and math backends;
#   3. three consumers at D = 64 causal 512 / 1k / 2k against the product's two (session 17: 0.883 / 0.925 /
#      1.042x, before the staged epilogue and the lazy maximum), bf16.
#   [RUNS=...] [T=170] [WT=150] [TT=90 (0: skip step 3)] bash bench/studies/session21/call4.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=/usr/local/cuda SDPA_CUDA_CACHE=/tmp/sdpa-cache21
export OUT=${OUT:-/tmp/out}; O=$OUT; mkdir -p "$O/wide" "$O/tiles"
RUNS="${RUNS:-wide_heads wide_heads@SDPA_WIDE_BLOCK_ROWS=16 fa2_kernels:auto_matches}" SAN="" DEADLINE=${T:-170} \
  bash bench/studies/session10/tests10.sh > /tmp/tests.txt 2>&1
for f in /tmp/w/tests10/*.rc; do echo "$(basename $f) $(cat $f)"; done
grep -h "test result\|panicked" /tmp/w/tests10/*.log | head -6
timeout ${WT:-150} python3 sdpa-cuda/dev/wide_bench.py --bench gpu-bundle/cuda_kernels --reps 20 \
  --sweep-at 512:1024,512:4096,512:16384,1024:1024 --sweep 'SDPA_WIDE_BLOCK_ROWS=0,128,256,512' \
  --only 512:1024,512:4096,1024:1024 --out "$O/wide" > "$O/wide/wide.log" 2>&1
echo "wide rc=$?"; grep -E "^sweep|^wide|^tag" "$O/wide/wide.log" | cut -c1-150 | tail -30
[ "${TT:-90}" != 0 ] && timeout ${TT:-90} python3 sdpa-cuda/dev/fa3_bench.py --bench gpu-bundle/cuda_kernels --seqs 512 1024 2048 --variants \
  --tiles 128,2,3@64 --tile-seqs 512 1024 2048 --out "$O/tiles" > "$O/tiles/tiles.log" 2>&1
echo "tiles rc=$?"; grep -iE "tile|^bf16  64 1" "$O/tiles/tiles.log" | tail -8 | cut -c1-120
cp /tmp/tests.txt "$O/"; cd "$O" && tar czf raw.tgz --remove-files wide/wide_*.json tiles/fa3_*_raw.json tests.txt 2>/dev/null; ls "$O" "$O/wide"
