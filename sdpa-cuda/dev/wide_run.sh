#!/usr/bin/env bash
# One device call for the wide-head path (issue 21, head dims above 256): the GPU tests (default slabs, then
# every call cut into many slabs with SDPA_WIDE_SLAB_MB=1), unfused's tests (its softmax now takes slabs),
# compute-sanitizer memcheck and racecheck on small calls until SAN_DEADLINE seconds into the call, then
# sdpa-cuda/dev/wide_bench.py against PyTorch in what is left of CALL_LIMIT seconds, ending in a short table.
# Run from the repository root with the bundle at $B (default target-wide/gpu-bundle; this script,
# wide_bench.py and sdpa_dev.py copied into it):
#
#     WIDE_SWEEP="SDPA_WIDE_SLAB_MB=64,1024;SDPA_WIDE_PV_PARTS=1" bash target-wide/gpu-bundle/wide_run.sh
#
# Logs go to $OUT: tests.log, san.log, bench.log, wide_raw.json (ours alone), wide_bench.json, wide-records.json.
set -u
B=${B:-target-wide/gpu-bundle}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export SDPA_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
table=()
nvidia-smi -L

t0=$(date +%s)
run_test() { # name, timeout, command...
  local name=$1 limit=$2; shift 2
  local log rc
  log="$(timeout "$limit" "$@" 2>&1)"; rc=$?
  { echo "== $name (rc=$rc)"; echo "$log"; } >> "$OUT/tests.log"
  table+=("$(printf '%-34s rc=%-3d %s' "$name" "$rc" "$(echo "$log" | grep -E '^test result|wide:' | tr '\n' ' ' | cut -c1-150)")")
}
run_test "wide_heads" 90 "$B/tests/wide_heads" --test-threads 4
[ -n "${WIDE_QUICK:-}" ] || {
  run_test "wide_heads SLAB_MB=1" 50 env SDPA_WIDE_SLAB_MB=1 "$B/tests/wide_heads" --test-threads 4 --skip a_large_call
  run_test "gpu_kernels unfused" 60 "$B/tests/gpu_kernels" unfused_
  run_test "gpu_kernels nan_under_masked" 30 "$B/tests/gpu_kernels" nan_under_masked_keys
  run_test "variant_kernels unfused" 30 "$B/tests/variant_kernels" unfused
}
for t in ${WIDE_EXTRA_TESTS:-}; do run_test "$t" 40 "$B/tests/${t%%:*}" "${t#*:}"; done
echo "tests: $(( $(date +%s) - t0 )) s"


san() { # tool, env, sdpa run flags; skipped once the call's time is nearly spent
  local tool=$1 envs=$2; shift 2
  local log rc
  if (( $(date +%s) - t0 > ${SAN_DEADLINE:-110} )); then table+=("$tool $envs $*: skipped (no time left)"); return; fi
  env $envs "$B/sdpa" run --backend cuda "$@" --warmup 0 --reps 1 > /dev/null 2>&1 < /dev/null
  log="$(env $envs timeout 30 compute-sanitizer --tool "$tool" --error-exitcode 3 "$B/sdpa" run --backend cuda "$@" \
    --warmup 0 --reps 1 --check 2>&1 < /dev/null)"; rc=$?
  { echo "== $tool $envs $* (rc=$rc)"; echo "$log"; } >> "$OUT/san.log"
  table+=("$(printf '%-9s %-70s rc=%-3d %s' "$tool" "$envs ${*:3}" "$rc" \
    "$(echo "$log" | grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' | tail -1)")")
}
while read -r kernel dtype shape mask; do
  for tool in memcheck racecheck; do
    san $tool "" --kernel "$kernel" --dtype "$dtype" --shape "$shape" --mask "$mask"
  done
done <<'SHAPES'
auto bf16 1,4,2,77,130,512 causal-br
auto f16 2,16,1,1,1000,576,512 none
unfused bf16 1,4,2,77,130,64 causal
SHAPES
san memcheck SDPA_WIDE_SLAB_MB=1 --kernel auto --dtype bf16 --shape 2,4,2,300,1500,1024 --mask causal
echo "sanitizers: $(( $(date +%s) - t0 )) s"

# The benchmark takes what is left of the call (CALL_LIMIT seconds from the start of the tests).
timeout "$(( ${CALL_LIMIT:-255} - ($(date +%s) - t0) ))" python3 "$B/wide_bench.py" --bench "$B/cuda_kernels" \
  --out "$OUT" --sweep "${WIDE_SWEEP:-}" ${WIDE_BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
echo "bench rc=$? after $(( $(date +%s) - t0 )) s"
grep -E "^sweep|CEILINGS" "$OUT/bench.log"
sed -n '/^tag /,$p' "$OUT/bench.log"
printf '%s\n' "${table[@]}"
