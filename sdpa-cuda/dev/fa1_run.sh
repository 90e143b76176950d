#!/usr/bin/env bash
# One device call for the fa1 work: builds the nvcc harness (dev/fa1_host.cu) in the background, runs the
# Rust GPU tests (gpu_kernels), the harness checks and timings against PyTorch, the Rust-path timings
# (cuda_kernels + dev/fa1_rust_bench.py) and compute-sanitizer on the small fa1 test, each under a time
# limit, and prints a short summary last. Binaries come from target-fa1/carry (built here with
# CARGO_TARGET_DIR=target-fa1, then copied: gpu_kernels and cuda_kernels).
#   OUT=... sdpa-cuda/dev/fa1_run.sh [tests] [harness] [rust] [sanitize]      (none named: all)
set -uo pipefail
C=target-fa1/carry
OUT="${OUT:-/tmp/fa1-out}"
mkdir -p "$OUT"
export CUDA_HOME=/usr/local/cuda SDPA_REQUIRE_GPU=1 SDPA_CUDA_CACHE=/tmp/sdpa-cache PYTHONUNBUFFERED=1
stages="${*:-tests harness rust sanitize}"
want() { [[ " $stages " == *" $1 "* ]]; }
summary=()
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv; nvcc --version | tail -1; } > "$OUT/env.txt" 2>&1
if want harness; then
  (cd sdpa-cuda/dev && nvcc -O3 -std=c++17 -arch=sm_90 -shared -Xcompiler -fPIC -cudart static -Xptxas -v \
     -o /tmp/fa1dev.so fa1_host.cu > "$OUT/nvcc.log" 2>&1; echo "nvcc rc=$?" >> "$OUT/nvcc.log") &
  nvcc_pid=$!
fi
if want tests; then
  s=$(date +%s); timeout 200 "$C/gpu_kernels" > "$OUT/tests.log" 2>&1; rc=$?
  summary+=("tests rc=$rc $(($(date +%s) - s))s: $(grep -E '^test result' "$OUT/tests.log" | tail -1)")
  grep -E "cases|FAILED|panicked" "$OUT/tests.log" | head -20
fi
if want harness; then
  wait "$nvcc_pid"; tail -1 "$OUT/nvcc.log"
  grep -E "Compiling entry|Used [0-9]+ registers|spill" "$OUT/nvcc.log" | grep -B1 -A1 "spill stores" | grep -v "0 bytes spill" | head -20
  s=$(date +%s); timeout 200 python3 sdpa-cuda/dev/fa1_bench.py --lib /tmp/fa1dev.so --check --bench --out "$OUT" > "$OUT/harness.log" 2>&1; rc=$?
  summary+=("harness rc=$rc $(($(date +%s) - s))s: $(grep CHECKS "$OUT/harness.log")")
  grep -E "FAIL|GEMM|^f32|^bf16|Error|error" "$OUT/harness.log" | head -40
fi
if want rust; then
  s=$(date +%s); timeout 150 python3 sdpa-cuda/dev/fa1_rust_bench.py --bench "$C/cuda_kernels" --out "$OUT" > "$OUT/rust_bench.log" 2>&1; rc=$?
  summary+=("rust bench rc=$rc $(($(date +%s) - s))s")
  cat "$OUT/rust_bench.log" | tail -25
fi
if want sanitize; then
  for tool in memcheck racecheck; do
    s=$(date +%s)
    timeout 120 compute-sanitizer --tool $tool --error-exitcode 3 "$C/gpu_kernels" fa1_small_shapes_for_the_sanitizer \
      --exact --test-threads 1 > "$OUT/sanitize-$tool.log" 2>&1; rc=$?
    summary+=("$tool rc=$rc $(($(date +%s) - s))s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' "$OUT/sanitize-$tool.log" | tr '\n' ' ')")
  done
fi
echo "== summary"; printf '%s\n' "${summary[@]}"
