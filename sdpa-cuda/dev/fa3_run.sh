#!/usr/bin/env bash
# fa3_run.sh: issue 25's device run, from a bundle built by `cargo xtask gpu-bundle --out DIR` (B=DIR; run from the
# repository root, where sdpa-cuda/dev/sdpa_dev.py lives): the fa3 test binary (correctness against the f64
# reference; TEST_TIMEOUT seconds, default 120), compute-sanitizer memcheck, racecheck and synccheck on small calls
# of every head-dim class, then fa3_bench.py (fa3 with and without ping-pong, fa2, PyTorch's cuDNN and
# FLASH_ATTENTION on the fa2bench grid, or issue 21's head-dim grid).
# Everything lands in $OUT/fa3 and is packed into $OUT/fa3-run.tgz; the last lines printed are the tables. The
# stages share a budget of $BUDGET seconds (default 285, inside a 5-minute device call): the bench gets what the
# tests and the sanitizer left. Extra arguments go to fa3_bench.py (e.g. --tiles 128,3 176,2, or --headdims).
#   B=path/to/bundle OUT=dir bash sdpa-cuda/dev/fa3_run.sh [--tiles ...]
set -uo pipefail
B="${B:-target-fa3/gpu-bundle}"
BUDGET="${BUDGET:-285}"
OUT="${OUT:-$PWD/gpu-out}"
R="$OUT/fa3"
mkdir -p "$R"
export SDPA_REQUIRE_GPU=1 SDPA_CUDA_CACHE=/tmp/sdpa-fa3-cache CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" PYTHONUNBUFFERED=1
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
command -v compute-sanitizer > /dev/null || export PATH="$PATH:$CUDA_HOME/bin"
pack() { tar czf "$OUT/fa3-run.tgz" -C "$OUT" fa3; }
trap pack EXIT
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv;
  python3 -c 'import torch; print("torch", torch.__version__)'; } > "$R/env.txt" 2>&1
head -3 "$R/env.txt"

timeout "${TEST_TIMEOUT:-120}" "$B/tests/fa3" --test-threads 2 --nocapture > "$R/tests.log" 2>&1
rc=$?
echo "tests rc=$rc"
grep -E "^test |test result|^fa3[ :]|panicked" "$R/tests.log" | head -20
grep -E "failed|error" "$R/tests.log" | head -12
[ $rc -eq 124 ] && { echo "the tests timed out (a hang?): stopping"; exit 1; }
# The opt-in variants against the reference too (FA3_TEST_ENV="VAR=value ...": each runs the reference test).
for v in ${FA3_TEST_ENV:-}; do
  env "$v" timeout 60 "$B/tests/fa3" fa3_matches_the_reference --nocapture > "$R/tests-$v.log" 2>&1
  echo "tests with $v rc=$? $(grep -E '^fa3:|test result' "$R/tests-$v.log" | tr '\n' ' ')"
done

export SDPA_CUDA_LINEINFO=1
# tests/fa3.rs `small_calls_for_the_sanitizer`: D = 128 bf16 causal, D = 64 f16 causal-br (BSHD), D = 64 bf16 GQA
# with a second block of two rows, and one call per other head-dim class (most padded); warmed (compiled) outside
# the sanitizer first. Two persistent blocks and one head per section (SDPA_FA3_GRID, default 2,1): each block
# walks several tiles, so the ring and Q barriers change phase across tiles under the checkers.
# FA3_SAN_TILES="bn,stages,consumers ...": the same calls again with each forced tile (e.g. three consumers).
# FA3_SKIP_SAN=1 skips this stage (a run whose kernel code the sanitizers already saw).
export SDPA_FA3_GRID="${FA3_SAN_GRID:-2,1}"
san=("$B/tests/fa3" small_calls_for_the_sanitizer --exact)
san_tiles="default ${FA3_SAN_TILES:-}"
[ -n "${FA3_SKIP_SAN:-}" ] && { san_tiles=""; echo "sanitizers skipped (FA3_SKIP_SAN)"; }
for tile in $san_tiles; do
  if [ "$tile" = default ]; then unset SDPA_FA3_TILE; else export SDPA_FA3_TILE="$tile"; fi
  "${san[@]}" > "$R/san-warm-$tile.log" 2>&1
  echo "sanitizer calls (tile $tile) rc=$?"
  for tool in memcheck racecheck synccheck; do
    timeout 60 compute-sanitizer --tool "$tool" --error-exitcode 3 "${san[@]}" > "$R/san-$tool-$tile.log" 2>&1
    rc=$?
    echo "$tool rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' "$R/san-$tool-$tile.log" | tail -2 | tr '\n' ' ')"
  done
done
unset SDPA_CUDA_LINEINFO SDPA_FA3_GRID SDPA_FA3_TILE

left=$((BUDGET - SECONDS))
echo "bench: $left s left"
PYTHONPATH="$B:sdpa-cuda/dev" timeout "$left" python3 "$B/fa3_bench.py" --bench "$B/cuda_kernels" --out "$R" "$@" > "$R/bench.log" 2>&1
echo "bench rc=$?"
grep -vE "^(timing|ENV|CEILINGS)" "$R/bench.log" | tail -75
