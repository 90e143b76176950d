#!/usr/bin/env bash
# One device call for the wide-head path (issue 21, head dims above 256): the GPU tests (default slabs, then
# every call cut into many slabs with SDPA_WIDE_SLAB_MB=1), unfused's tests (its softmax now takes slabs),
# compute-sanitizer memcheck and racecheck on small calls, then sdpa-cuda/dev/wide_bench.py against PyTorch,
# ending in a short table. Run from the repository root with the bundle at $B (default target-wide/gpu-bundle,
# this script and wide_bench.py copied into it):
#
#     WIDE_SWEEP=32,256,1024 bash target-wide/gpu-bundle/wide_run.sh
#
# Logs go to $OUT: tests.log, san.log, bench.log, wide_bench.json, wide-records.json.
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
run_test "wide_heads" 120 "$B/tests/wide_heads" --test-threads 2
run_test "wide_heads SLAB_MB=1" 90 env SDPA_WIDE_SLAB_MB=1 "$B/tests/wide_heads" --test-threads 2 --skip a_large_call
run_test "gpu_kernels unfused" 60 "$B/tests/gpu_kernels" unfused
run_test "gpu_kernels nan_under_masked" 60 "$B/tests/gpu_kernels" nan_under_masked_keys
run_test "variant_kernels unfused" 60 "$B/tests/variant_kernels" unfused
echo "tests: $(( $(date +%s) - t0 )) s"

san() { # tool, env, sdpa run flags
  local tool=$1 envs=$2; shift 2
  local log rc
  env $envs "$B/sdpa" run --backend cuda "$@" --warmup 0 --reps 1 > /dev/null 2>&1
  log="$(env $envs timeout 60 compute-sanitizer --tool "$tool" --error-exitcode 3 "$B/sdpa" run --backend cuda "$@" \
    --warmup 0 --reps 1 --check 2>&1)"; rc=$?
  { echo "== $tool $envs $* (rc=$rc)"; echo "$log"; } >> "$OUT/san.log"
  table+=("$(printf '%-9s %-58s rc=%-3d %s' "$tool" "$envs ${*:3:6}" "$rc" \
    "$(echo "$log" | grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' | tail -1)")")
}
for tool in memcheck racecheck; do
  san $tool "" --kernel auto --dtype bf16 --shape 1,4,2,77,130,512 --mask causal-br
  san $tool "" --kernel auto --dtype f16 --shape 2,16,1,1,1000,576,512 --mask none
  san $tool "" --kernel unfused --dtype bf16 --shape 1,4,2,77,130,64 --mask causal
done
san memcheck SDPA_WIDE_SLAB_MB=1 --kernel auto --dtype bf16 --shape 2,4,2,300,1500,1024 --mask causal
echo "sanitizers: $(( $(date +%s) - t0 )) s"

timeout "${BENCH_LIMIT:-150}" python3 "$B/wide_bench.py" --bench "$B/cuda_kernels" --out "$OUT" \
  --slab-sweep "${WIDE_SWEEP:-}" ${WIDE_BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
echo "bench rc=$? after $(( $(date +%s) - t0 )) s"
grep -E "^slab|CEILINGS" "$OUT/bench.log"
sed -n '/^tag /,$p' "$OUT/bench.log"
printf '%s\n' "${table[@]}"
