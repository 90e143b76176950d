#!/usr/bin/env bash
# Builds the GPU test and bench binaries once per tensor-core fa1 tile choice ("binary sets"), from the
# committed tree (git archive HEAD) with this checkout's fa1 files on top, so other helpers' unfinished files
# stay out. A set rewrites the line marked `fa1m-choice-<D>` in src/kernels/fa1.rs (the table the launcher plans
# with and writes the kernel's instantiation line from) with the tile BM,BN,WM,WN,STAGES,MINB for head dim D. Output: target-fa1/carry/<SET>/{gpu_kernels,cuda_kernels}.
#   sdpa-cuda/dev/fa1_mma_sets.sh "A:64=64,64,1,4,2,2:128=128,64,4,2,2,1" "B:64=128,128,4,2,2,1"
set -euo pipefail
source "$(dirname "$0")/fa1_common.sh"
sets_prepare sdpa-cuda/kernels/fa1.cu sdpa-cuda/kernels/fa1_mma.cu sdpa-cuda/src/kernels/fa1.rs sdpa-cuda/src/sys/modules.rs \
  sdpa-cuda/tests/gpu_kernels.rs
for spec in "$@"; do
  set_name="${spec%%:*}"
  cp "$ROOT/sdpa-cuda/src/kernels/fa1.rs" "$W/sdpa-cuda/src/kernels/fa1.rs"
  IFS=':' read -ra parts <<< "${spec#*:}"
  for part in "${parts[@]}"; do
    d="${part%%=*}"; IFS=',' read -r bm bn wm wn st minb <<< "${part#*=}"
    sed -i "s/$d => t([0-9, ]*), *\/\/ fa1m-choice-$d/$d => t($bm, $bn, $wm, $wn, $st, $minb), \/\/ fa1m-choice-$d/" "$W/sdpa-cuda/src/kernels/fa1.rs"
  done
  grep -h "fa1m-choice" "$W/sdpa-cuda/src/kernels/fa1.rs"
  sets_build "$set_name" fa1m-choice 4
done
