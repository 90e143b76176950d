#!/usr/bin/env bash
# Builds the GPU test and bench binaries once per fa1 tile choice ("binary sets"), from the committed tree
# (git archive HEAD) with this checkout's fa1 files on top, so other helpers' unfinished files stay out.
# Each set rewrites the two lines marked `fa1-choice` (kernels/fa1.cu, src/kernels/fa1.rs): the f32 head dims that
# take the narrow shape (TX = 8). Output: target-fa1/carry/<SET>/{gpu_kernels,cuda_kernels}, stripped.
#   sdpa-cuda/dev/fa1_build_sets.sh "A:" "B1:64" "B2:128" "C:64 128"
set -euo pipefail
source "$(dirname "$0")/fa1_common.sh"
sets_prepare sdpa-cuda/kernels/fa1.cu sdpa-cuda/src/kernels/fa1.rs sdpa-cuda/tests/gpu_kernels.rs
for spec in "$@"; do
  set_name="${spec%%:*}"; dims="${spec#*:}"
  cu="false"
  if [[ -n "$dims" ]]; then
    cu="sizeof(T) == 4 \\&\\& ($(for d in $dims; do printf 'HD == %s || ' "$d"; done | sed 's/ || $//'))"
  fi
  rs="$(echo $dims | sed 's/ /, /g')"
  sed -i "s/static constexpr bool NARROW = .*;  \/\/ fa1-choice/static constexpr bool NARROW = $cu;  \/\/ fa1-choice/" "$W/sdpa-cuda/kernels/fa1.cu"
  sed -i "s/const NARROW_F32_DIMS: .*; \/\/ fa1-choice/const NARROW_F32_DIMS: \&[usize] = \&[$rs]; \/\/ fa1-choice/" "$W/sdpa-cuda/src/kernels/fa1.rs"
  grep -h "fa1-choice" "$W/sdpa-cuda/kernels/fa1.cu" "$W/sdpa-cuda/src/kernels/fa1.rs"
  sets_build "$set_name" fa1-choice 2
done
