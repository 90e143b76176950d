#!/usr/bin/env bash
# One device call for the fa1 work: builds the nvcc harness (dev/fa1_host.cu) in the background, runs the
# Rust GPU tests (gpu_kernels) of each binary set, the harness checks and timings against PyTorch, the
# Rust-path timings (cuda_kernels + dev/fa1_rust_bench.py) and compute-sanitizer on the small fa1 test,
# each under a time limit, and prints a short summary last. Binary sets come from target-fa1/carry/<SET>/
# (gpu_kernels and cuda_kernels, built by dev/fa1_build_sets.sh with one tile choice each).
#   OUT=... SETS="A B" [SAN_SETS="A"] sdpa-cuda/dev/fa1_run.sh [tests] [harness] [rust] [sanitize]   (none: all)
# Output under $OUT: run.log (everything), nvcc.log, fa1dev.json, fa1_rust_bench_<SET>.json.
set -uo pipefail
source "$(dirname "$0")/fa1_common.sh"
run_setup
stages="${*:-tests harness rust sanitize}"
want() { [[ " $stages " == *" $1 "* ]]; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv; nvcc --version | tail -1; } > "$LOG" 2>&1
if want harness; then
  (cd sdpa-cuda/dev && nvcc -O3 -std=c++17 -arch=sm_90 -shared -Xcompiler -fPIC -cudart static -Xptxas -v \
     -o /tmp/fa1dev.so fa1_host.cu > "$OUT/nvcc.log" 2>&1; echo "nvcc rc=$?" >> "$OUT/nvcc.log") &
  nvcc_pid=$!
fi
if want tests; then
  for set in $SETS; do
    export SDPA_CUDA_CACHE=/tmp/sdpa-cache-$set
    s=$(date +%s); echo "== tests $set" >> "$LOG"
    timeout 150 "$C/$set/gpu_kernels" >> "$LOG" 2>&1; rc=$?
    summary+=("tests $set rc=$rc $(($(date +%s) - s))s: $(grep -E '^test result' "$LOG" | tail -1)")
  done
  grep -E "cases,|FAILED|panicked" "$LOG" | head -30
fi
if want harness; then
  wait "$nvcc_pid"; tail -1 "$OUT/nvcc.log"
  s=$(date +%s); echo "== harness" >> "$LOG"
  timeout 200 python3 sdpa-cuda/dev/fa1_bench.py --lib /tmp/fa1dev.so --check --bench --out "$OUT" > /tmp/harness.log 2>&1; rc=$?
  cat /tmp/harness.log >> "$LOG"
  summary+=("harness rc=$rc $(($(date +%s) - s))s: $(grep CHECKS /tmp/harness.log)")
  grep -E "FAIL|GEMM|^f32|^bf16|Error|error" /tmp/harness.log | head -40
fi
if want rust; then
  for set in $SETS; do
    export SDPA_CUDA_CACHE=/tmp/sdpa-cache-$set
    s=$(date +%s); echo "== rust bench $set" >> "$LOG"
    timeout 150 python3 sdpa-cuda/dev/fa1_rust_bench.py --bench "$C/$set/cuda_kernels" --label "$set" --out "$OUT" > /tmp/rb.log 2>&1; rc=$?
    cat /tmp/rb.log >> "$LOG"
    summary+=("rust bench $set rc=$rc $(($(date +%s) - s))s: $(tail -1 /tmp/rb.log)")
    echo "-- $set"; grep -E "^(f32|gqa)" /tmp/rb.log
  done
fi
if want sanitize; then
  for set in ${SAN_SETS:-$SETS}; do sanitize_set "$set" 120; done
fi
echo "== summary"; printf '%s\n' "${summary[@]}"
