#!/usr/bin/env bash
# One device call for the tensor-core fa1 work: per binary set (target-fa1/carry/<SET>/, built by
# dev/fa1_mma_sets.sh) the GPU tests, then compute-sanitizer memcheck + racecheck on the small fa1 shapes,
# then the issue's fa1-vs-unfused points through the Rust path (dev/fa1_mma_bench.py), each under a time
# limit; a short summary last. Output under $OUT: run.log and fa1_mma_bench_<SET>.json.
#   OUT=... SETS="A B" TEST_FILTER=fa1 SAN_SETS=A BENCH_KERNELS="unfused,fa1,fa2" sdpa-cuda/dev/fa1_mma_run.sh
set -uo pipefail
source "$(dirname "$0")/fa1_common.sh"
run_setup
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv; } > "$LOG" 2>&1
first=1
for set in $SETS; do
  export SDPA_CUDA_CACHE=/tmp/sdpa-cache-$set
  filter="${TEST_FILTER:-}"; [[ $first == 1 ]] && filter="${FIRST_TEST_FILTER:-$filter}"
  s=$(date +%s); echo "== tests $set ($filter)" >> "$LOG"
  timeout "${TEST_TIMEOUT:-200}" "$C/$set/gpu_kernels" $filter --test-threads 1 >> "$LOG" 2>&1; rc=$?
  summary+=("tests $set rc=$rc $(($(date +%s) - s))s: $(grep -E '^test result' "$LOG" | tail -1)")
  kernels="${BENCH_KERNELS:-unfused,fa1,fa2}"; [[ $first == 0 ]] && kernels="${LATER_KERNELS:-fa1}"
  s=$(date +%s); echo "== bench $set" >> "$LOG"
  timeout 240 python3 sdpa-cuda/dev/fa1_mma_bench.py --bench "$C/$set/cuda_kernels" --label "$set" --out "$OUT" \
    --kernels "$kernels" > /tmp/b.log 2>&1; rc=$?
  cat /tmp/b.log >> "$LOG"
  summary+=("bench $set rc=$rc $(($(date +%s) - s))s: $(tail -1 /tmp/b.log)")
  first=0
done
for set in ${SAN_SETS:-}; do sanitize_set "$set" 150; done
grep -E "cases,|FAILED|panicked|^(A|B|C|D|E)[0-9]*: D=|failed:" "$LOG" | head -60
echo "== summary"; printf '%s\n' "${summary[@]}"
