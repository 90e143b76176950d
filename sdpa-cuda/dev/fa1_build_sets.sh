#!/usr/bin/env bash
# Builds the GPU test and bench binaries once per fa1 tile choice ("binary sets"), from the committed tree
# (git archive HEAD) with this checkout's fa1 files on top, so other helpers' unfinished files stay out.
# Each set rewrites the two lines marked `fa1-choice` (kernels/fa1.cu, src/fa1.rs): the f32 head dims that
# take the narrow shape (TX = 8). Output: target-fa1/carry/<SET>/{gpu_kernels,cuda_kernels}, stripped.
#   sdpa-cuda/dev/fa1_build_sets.sh "A:" "B1:64" "B2:128" "C:64 128"
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
export CARGO_TARGET_DIR="$ROOT/target-fa1"
W=/tmp/fa1-sets-src
rm -rf "$W" && mkdir -p "$W"
git -C "$ROOT" archive HEAD | tar -x -C "$W"
for f in sdpa-cuda/kernels/fa1.cu sdpa-cuda/src/fa1.rs sdpa-cuda/tests/gpu_kernels.rs; do cp "$ROOT/$f" "$W/$f"; done
for spec in "$@"; do
  set_name="${spec%%:*}"; dims="${spec#*:}"
  cu="false"
  if [[ -n "$dims" ]]; then
    cu="sizeof(T) == 4 \\&\\& ($(for d in $dims; do printf 'HD == %s || ' "$d"; done | sed 's/ || $//'))"
  fi
  rs="$(echo $dims | sed 's/ /, /g')"
  sed -i "s/static constexpr bool NARROW = .*;  \/\/ fa1-choice/static constexpr bool NARROW = $cu;  \/\/ fa1-choice/" "$W/sdpa-cuda/kernels/fa1.cu"
  sed -i "s/const NARROW_F32_DIMS: .*; \/\/ fa1-choice/const NARROW_F32_DIMS: \&[usize] = \&[$rs]; \/\/ fa1-choice/" "$W/sdpa-cuda/src/fa1.rs"
  grep -h "fa1-choice" "$W/sdpa-cuda/kernels/fa1.cu" "$W/sdpa-cuda/src/fa1.rs"
  (cd "$W" && cargo test --release -p sdpa-cuda --test gpu_kernels --no-run 2>&1 | grep -E "^error|Executable" ) 
  (cd "$W" && cargo bench -p sdpa-cuda --bench cuda_kernels --no-run 2>&1 | grep -E "^error|Executable" )
  out="$ROOT/target-fa1/carry/$set_name"; mkdir -p "$out"
  gk=$(ls -t "$CARGO_TARGET_DIR"/release/deps/gpu_kernels-* | grep -v '\.d$' | head -1)
  ck=$(ls -t "$CARGO_TARGET_DIR"/release/deps/cuda_kernels-* | grep -v '\.d$' | head -1)
  cp "$gk" "$out/gpu_kernels"; cp "$ck" "$out/cuda_kernels"; strip "$out/gpu_kernels" "$out/cuda_kernels"
  echo "$set_name: $(strings "$out/gpu_kernels" | grep -c 'fa1-choice') choice lines embedded"
  strings "$out/gpu_kernels" | grep "fa1-choice" | head -2
done
