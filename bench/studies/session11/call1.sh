#!/usr/bin/env bash
# Session 11's first device call: splitkv's new MLA path (576/512) on the GPU for the first time, and the
# merged review fixes, then MLA decoding timed against PyTorch and the copy bandwidth.
#   1. the GPU tests in $RUNS beside each other and compute-sanitizer on the small MLA calls
#      (bench/studies/session10/tests10.sh: logs in $OUT/tests10.tgz);
#   2. sdpa-cuda/dev/wide_bench.py --decode-only: MLA decoding (16 and 128 heads; B = 8, Sk = 4k and B = 1,
#      Sk = 32k) through `auto` (now splitkv's MLA path) against PyTorch's backends and the copy probe, after
#      the sweep points under the settings in $SWEEP (SDPA_SPLITKV_MLA=0 is the wide path it replaced).
# From the repository root with gpu-bundle carried:
#   DEADLINE=560 bash bench/studies/session11/call1.sh
set -uo pipefail
T0=$SECONDS; DEADLINE=${DEADLINE:-560}
left() { echo $((DEADLINE - (SECONDS - T0))); }
RUNS=${RUNS:-"splitkv_mla wide_heads fa2_kernels:splitkv backward_odd_head_dims fa3_ragged"}
SAN=${SAN:-"splitkv_mla:small_mla_calls_for_the_sanitizer"}
# SKIP_TESTS=1: the bench alone (call3.sh runs its own tests first).
if [ -z "${SKIP_TESTS:-}" ]; then
  RUNS="$RUNS" SAN="$SAN" SAN_S=${SAN_S:-70} DEADLINE=${TESTS_S:-250} bash bench/studies/session10/tests10.sh
  echo "tests done ($(left) s left)"
fi
export CUDA_HOME=/usr/local/cuda SDPA_REQUIRE_GPU=1 PYTHONUNBUFFERED=1 SDPA_CUDA_CACHE=/tmp/sdpa-cache10
mkdir -p "$OUT/mla"
PYTHONPATH="gpu-bundle:sdpa-cuda/dev" timeout $(( $(left) - 10 )) python3 sdpa-cuda/dev/wide_bench.py \
  --bench gpu-bundle/cuda_kernels --decode-only --out "$OUT/mla" \
  --sweep "${SWEEP:-SDPA_SPLITKV_MLA=0;SDPA_MLA_SPLITS=16,32,64,128;SDPA_MLA_TILE=tall}" > "$OUT/mla/bench.log" 2>&1
echo "mla bench rc=$? ($(left) s left)"
grep -E "^sweep|^tag|^decode_mla|CEILINGS" "$OUT/mla/bench.log" | cut -c1-170
