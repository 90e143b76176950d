#!/usr/bin/env bash
# One device call for the TF32 kernels: the dev harness (checks of every tile configuration, timing against
# PyTorch f32 SDPA and the ceilings, same run), the Rust test binary tests/tf32_kernels.rs, and
# compute-sanitizer memcheck + racecheck on its small cases. Built here beforehand into $C:
#   nvcc -O3 -std=c++17 -arch=sm_90 -shared -Xcompiler -fPIC -cudart static -o $C/tf32dev.so sdpa-cuda/dev/tf32_host.cu
#   CARGO_TARGET_DIR=target-tf32 cargo test --release -p sdpa-cuda --test tf32_kernels --no-run  (copied to $C/tf32_kernels)
# Usage (repository root, device machine): sdpa-cuda/dev/tf32_run.sh [dev] [tests] [testsb] [sanitize] [sanitizeb]
# (The `devswap` stage, which checked the first wgmma kernel's descriptors, went with dev/tf32_wg.cuh; see
# this script at dd5fbb7.)
C=${C:-target-tf32/carry}
OUT=${OUT:-/tmp/tf32-out}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH; export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} SDPA_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
stages="${*:-dev tests sanitize}"
want() { [[ " $stages " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > "$OUT/env.txt" 2>&1
table=()
if want dev; then
  python3 sdpa-cuda/dev/tf32_bench.py --lib "$C/tf32dev.so" --check --bench --out "$OUT" > "$OUT/dev.log" 2>&1
  table+=("dev rc=$?")
fi
if want tests; then
  "$C/tf32_kernels" --test-threads=1 --nocapture > "$OUT/tests.log" 2>&1
  table+=("tests rc=$? $(grep -E '^test result' "$OUT/tests.log" | tail -1)")
fi
if want testsb && [ -x "$C/tf32_kernels_b" ]; then
  # A second build of the same tests with another entry table (candidate tiles), so that either table can ship.
  "$C/tf32_kernels_b" --test-threads=1 --nocapture > "$OUT/tests_b.log" 2>&1
  table+=("tests_b rc=$? $(grep -E '^test result' "$OUT/tests_b.log" | tail -1)")
fi
if want sanitize; then
  bins=(tf32_kernels)
  want sanitizeb && [ -x "$C/tf32_kernels_b" ] && bins+=(tf32_kernels_b)
  for bin in "${bins[@]}"; do
    for tool in memcheck racecheck; do
      compute-sanitizer --tool $tool --error-exitcode 3 "$C/$bin" --exact sanitizer_small_cases \
        > "$OUT/sanitize-$bin-$tool.log" 2>&1
      table+=("$bin $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' "$OUT/sanitize-$bin-$tool.log" | tr '\n' ' ')")
    done
  done
fi
grep -E "CEILINGS|CHECKS|^FAIL" "$OUT/dev.log" 2>/dev/null | cut -c1-400 | head -20
sed -n '/^SUMMARY/,$p' "$OUT/dev.log" 2>/dev/null
grep -E "cases|rel_err .*tolerance|panicked|FAILED|failed" "$OUT/tests.log" 2>/dev/null | cut -c1-300 | head -30
grep -E "cases|panicked|FAILED|failed" "$OUT/tests_b.log" 2>/dev/null | cut -c1-300 | head -10
printf '%s\n' "${table[@]}"
