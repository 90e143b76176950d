#!/usr/bin/env bash
# Builds the GPU test and bench binaries once per tensor-core fa1 tile choice ("binary sets"), from the
# committed tree (git archive HEAD) with this checkout's fa1 files on top, so other helpers' unfinished files
# stay out. A set rewrites the two lines marked `fa1m-choice-<D>` (kernels/fa1_mma.cu and src/fa1.rs) with
# the tile BM,BN,WM,WN,STAGES,MINB for head dim D. Output: target-fa1/carry/<SET>/{gpu_kernels,cuda_kernels}.
#   sdpa-cuda/dev/fa1_mma_sets.sh "A:64=64,64,1,4,2,2:128=128,64,4,2,2,1" "B:64=128,128,4,2,2,1"
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
export CARGO_TARGET_DIR="$ROOT/target-fa1"
W=/tmp/fa1-sets-src
rm -rf "$W" && mkdir -p "$W"
git -C "$ROOT" archive HEAD | tar -x -C "$W"
for f in sdpa-cuda/kernels/fa1.cu sdpa-cuda/kernels/fa1_mma.cu sdpa-cuda/src/fa1.rs sdpa-cuda/src/modules.rs \
         sdpa-cuda/tests/gpu_kernels.rs; do cp "$ROOT/$f" "$W/$f"; done
for spec in "$@"; do
  set_name="${spec%%:*}"
  cp "$ROOT/sdpa-cuda/kernels/fa1_mma.cu" "$ROOT/sdpa-cuda/src/fa1.rs" /tmp/
  cp /tmp/fa1_mma.cu "$W/sdpa-cuda/kernels/fa1_mma.cu"; cp /tmp/fa1.rs "$W/sdpa-cuda/src/fa1.rs"
  IFS=':' read -ra parts <<< "${spec#*:}"
  for part in "${parts[@]}"; do
    d="${part%%=*}"; IFS=',' read -r bm bn wm wn st minb <<< "${part#*=}"
    sed -i "s/FA1M_ENTRIES_FOR(TNAME, T, $d, [0-9, ]*) *\/\* fa1m-choice-$d \*\//FA1M_ENTRIES_FOR(TNAME, T, $d, $bm, $bn, $wm, $wn, $st, $minb) \/* fa1m-choice-$d *\//" \
      "$W/sdpa-cuda/kernels/fa1_mma.cu"
    sed -i "s/$d => t([0-9, ]*), *\/\/ fa1m-choice-$d/$d => t($bm, $bn, $wm, $wn, $st), \/\/ fa1m-choice-$d/" "$W/sdpa-cuda/src/fa1.rs"
  done
  grep -h "fa1m-choice" "$W/sdpa-cuda/kernels/fa1_mma.cu" "$W/sdpa-cuda/src/fa1.rs"
  (cd "$W" && cargo test --release -p sdpa-cuda --test gpu_kernels --no-run 2>&1 | grep -E "^error|Executable")
  (cd "$W" && cargo bench -p sdpa-cuda --bench cuda_kernels --no-run 2>&1 | grep -E "^error|Executable")
  out="$ROOT/target-fa1/carry/$set_name"; mkdir -p "$out"
  gk=$(ls -t "$CARGO_TARGET_DIR"/release/deps/gpu_kernels-* | grep -v '\.d$' | head -1)
  ck=$(ls -t "$CARGO_TARGET_DIR"/release/deps/cuda_kernels-* | grep -v '\.d$' | head -1)
  cp "$gk" "$out/gpu_kernels"; cp "$ck" "$out/cuda_kernels"; strip "$out/gpu_kernels" "$out/cuda_kernels"
  echo "$set_name: $(strings "$out/gpu_kernels" | grep -c 'fa1m-choice') choice lines embedded"
  strings "$out/gpu_kernels" | grep "fa1m-choice" | head -4
done
