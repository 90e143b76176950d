#!/usr/bin/env bash
# fa3_fp8_run.sh: the FP8 device run of issue 25, from a bundle built by `cargo xtask gpu-bundle --out DIR` with
# fa3_fp8_bench.py copied into it (B=DIR; run from the repository root, where sdpa-cuda/dev/sdpa_dev.py lives):
# the fa3_fp8 test binary (correctness against the f64 reference, accuracy against bf16, refusals), the bf16 fa3
# reference test (the switch points in fa3.cu must leave bf16 alone), compute-sanitizer memcheck, racecheck and
# synccheck on small FP8 calls of every class, then fa3_fp8_bench.py (FP8 against bf16 fa3 and PyTorch's default
# on the fa2bench grid). Everything lands in $OUT/fp8 and is packed into $OUT/fp8-run.tgz; the last lines
# printed are the tables (logs and records under $WORK, default /tmp/fp8-work). The stages share $BUDGET seconds (default 280): the bench gets what is left.
#   B=path/to/bundle OUT=dir bash fa3_fp8_run.sh [bench args]
set -uo pipefail
B="${B:-target-fp8/gpu-bundle}"
BUDGET="${BUDGET:-280}"
OUT="${OUT:-$PWD/gpu-out}"
W="${WORK:-/tmp/fp8-work}"  # logs and records; only the packed archive goes to $OUT (few files come back)
R="$W/fp8"
mkdir -p "$R" "$OUT"
export SDPA_REQUIRE_GPU=1 SDPA_CUDA_CACHE=/tmp/sdpa-fp8-cache CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" PYTHONUNBUFFERED=1
command -v compute-sanitizer > /dev/null || export PATH="$PATH:$CUDA_HOME/bin"
pack() { tar czf "$OUT/fp8-run.tgz" -C "$W" fp8; }
trap pack EXIT
{ date -u; nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__)'; } > "$R/env.txt" 2>&1
head -2 "$R/env.txt"

timeout "${TEST_TIMEOUT:-100}" "$B/tests/fa3_fp8" --test-threads 2 --nocapture > "$R/tests.log" 2>&1
rc=$?
echo "fp8 tests rc=$rc"
grep -E "^test |test result|^fa3 fp8|panicked" "$R/tests.log" | head -24
grep -E "failed|error" "$R/tests.log" | head -12 | cut -c1-400
[ $rc -eq 124 ] && { echo "the tests timed out (a hang?): stopping"; exit 1; }
if [ -z "${SKIP_BF16:-}" ]; then
  timeout 60 "$B/tests/fa3" fa3_matches_the_reference --nocapture > "$R/tests-bf16.log" 2>&1
  echo "bf16 fa3 reference test rc=$? $(grep -E '^fa3:|test result' "$R/tests-bf16.log" | tr '\n' ' ')"
fi

export SDPA_CUDA_LINEINFO=1 SDPA_FA3_GRID=2,1
san=("$B/tests/fa3_fp8" small_calls_for_the_sanitizer --exact)
"${san[@]}" > "$R/san-warm.log" 2>&1
echo "sanitizer calls rc=$?"
for tool in memcheck racecheck synccheck; do
  timeout 50 compute-sanitizer --tool "$tool" --error-exitcode 3 "${san[@]}" > "$R/san-$tool.log" 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' "$R/san-$tool.log" | tail -2 | tr '\n' ' ')"
done
unset SDPA_CUDA_LINEINFO SDPA_FA3_GRID

left=$((BUDGET - SECONDS))
echo "bench: $left s left"
PYTHONPATH="$B:sdpa-cuda/dev" timeout "$left" python3 "$B/fa3_fp8_bench.py" --bench "$B/cuda_kernels" --out "$R" "$@" \
  > "$R/bench.log" 2>&1
echo "bench rc=$?"
grep -vE "^(timing|ENV)" "$R/bench.log" | tail -34
