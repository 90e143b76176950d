#!/usr/bin/env bash
# Issue 21's head dims that are not multiples of 8, in one device call (bench/results/gpu/headdims.md, "Head
# dims that are not multiples of 8"): the timings first (idle GPU), then the affected test binaries in
# parallel while compute-sanitizer memcheck and racecheck run one call per new load path. Run from the
# repository root with the bundle B (`cargo xtask gpu-bundle`) holding this script's Python files in B/odd:
#   OUT=... sdpa-cuda/dev/odd_head_dims_run.sh B
# Each stage has a time cap so that the table at the end always prints.
set -uo pipefail
B="${1:?bundle directory}"
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT/logs"
export SDPA_REQUIRE_GPU=1 SDPA_CUDA_CACHE=/tmp/sdpa-cuda-cache CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$B/odd"
table=()
nvidia-smi -L

# 1. Speed: D = 33, 65, 100, 127 (auto: fa2's pad-copy path by its rule) against the same calls with
# SDPA_FA2_PAD_COPY=0 (the narrow path), fa2 at 40, 72, 104, 128 and PyTorch, same run.
s=$(date +%s)
timeout "${BENCH_S:-150}" python3 "$B/odd/fa2_rust_bench.py" --bench "$B/cuda_kernels" --odd --out "$OUT" \
  > "$OUT/logs/bench.log" 2>&1
table+=("bench rc=$? $(( $(date +%s) - s )) s")
[[ -f "$OUT/fa2_rust_bench.json" ]] && python3 "$B/odd/to_records.py" "$OUT/fa2_rust_bench.json" \
  "$OUT/odd-headdims-records.json" >> "$OUT/logs/bench.log" 2>&1

# 2. Tests, in parallel with the sanitizers below (correctness only; each compiles what it needs, the disk
# cache is shared).
# The whole of the binaries the change reaches most (odd_head_dims, fa2_kernels, tf32_kernels, the unit tests);
# of the others the tests that run padded instantiations or the changed refusals.
names=(odd_head_dims odd_head_dims_pad_copy fa2_kernels tf32_kernels unit_sdpa_cuda "gpu_kernels unsupported_requests_say_so"
       "variant_kernels fa2_honours_variants_in_every_head_dim_class splitkv_decodes_long_keys"
       "ragged_prefill every_head_dim_class refusals_name" "paged_decode every_head_dim_class"
       "backward f32_and_paged_caches_are_refused_with_a_reason")
for n in "${names[@]}"; do
  read -r bin filter <<< "$n"
  (
    s=$(date +%s)
    timeout "${TEST_S:-140}" "$B/tests/$bin" $filter > "$OUT/logs/test-$bin.log" 2>&1
    echo "$? $(( $(date +%s) - s ))" > "$OUT/logs/test-$bin.rc"
  ) &
done
# 3. Sanitizers: fa2 and splitkv at 8-, 4- and 2-byte rows and a misaligned view (the test's small calls),
# and the pad-copy path's copies and aligned launches (odd_head_dims_pad_copy's small calls), compiled with
# line info outside the sanitizer first.
export SDPA_CUDA_LINEINFO=1
sanitized=("odd_head_dims small_calls_for_the_sanitizer" "odd_head_dims_pad_copy small_pad_copy_calls_for_the_sanitizer")
for n in "${sanitized[@]}"; do
  read -r bin filter <<< "$n"
  "$B/tests/$bin" "$filter" > /dev/null 2>&1
  for tool in memcheck racecheck; do
    s=$(date +%s)
    timeout "${SAN_S:-40}" compute-sanitizer --tool "$tool" --error-exitcode 3 "$B/tests/$bin" "$filter" \
      > "$OUT/logs/$tool-$bin.log" 2>&1
    rc=$?
    res="$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' "$OUT/logs/$tool-$bin.log" | tail -2 | tr '\n' ' ')"
    table+=("$tool $bin rc=$rc $(( $(date +%s) - s )) s $res")
  done
done
unset SDPA_CUDA_LINEINFO

wait
for n in "${names[@]}"; do
  read -r bin filter <<< "$n"
  read -r rc secs < "$OUT/logs/test-$bin.rc"
  res="$(grep -E '^test result:' "$OUT/logs/test-$bin.log" | tail -1)"
  table+=("test $bin rc=$rc ${secs} s $res")
done

grep -E "odd head dims|cases," "$OUT"/logs/test-*.log | cut -c1-200
sed -n '/^  D c     S ran/,$p' "$OUT/logs/bench.log" | head -14
tar czf "$OUT/odd-logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
printf '%s\n' "${table[@]}"
