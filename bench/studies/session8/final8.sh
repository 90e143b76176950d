#!/usr/bin/env bash
# Session 8's verification call on one H100, run from the repository root after merging the session's seven
# branches (fa3 dynamic scheduler, FP8 fa3, decoding on TMA at every class, any head dim 1..256 with the
# pad-copy path, head dims above 256, the CPU AMX/AVX2 changes):
#   1. the whole GPU suite (`run-gpu.sh tests`: every sdpa-cuda test binary in parallel, `auto` taking fa3 on
#      sm_90), with compute-sanitizer memcheck, racecheck and synccheck on the small calls of tests/fa3 and
#      tests/fa3_fp8 (two persistent blocks) running beside it;
#   2. sdpa-cpu's amx, lib and correctness suites on the host's AMX tiles (SDPA_REQUIRE_AMX=1);
#   3. with what is left, the odd-head-dim timing (pad-copy against the narrow path, PyTorch in the same run).
# Every stage has a deadline so that the tables always come back; everything is packed into $OUT/final8.tgz.
#   DEADLINE=440 bash bench/studies/session8/final8.sh
set -uo pipefail
B=gpu-bundle
O=/tmp/w/final8; mkdir -p "$O"
T0=$SECONDS; DEADLINE=${DEADLINE:-440}
left() { echo $((DEADLINE - (SECONDS - T0))); }
pack() { tar czf "$OUT/final8.tgz" -C /tmp/w final8; }
trap pack EXIT
export CUDA_HOME=/usr/local/cuda SDPA_REQUIRE_GPU=1 PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
command -v compute-sanitizer > /dev/null || export PATH="$PATH:$CUDA_HOME/bin"
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; lscpu | grep -E "Model name|Flags" | cut -c1-300; } > "$O/env.txt" 2>&1
head -3 "$O/env.txt"

# 1. The suite, and the sanitizers beside it.
( OUT="$O/suite" timeout $(( $(left) - 110 )) bash "$B/run-gpu.sh" tests > "$O/suite.log" 2>&1; echo "suite rc=$?" > "$O/suite.rc" ) &
SUITE=$!
(
  export SDPA_CUDA_LINEINFO=1 SDPA_FA3_GRID=2,1 SDPA_CUDA_CACHE=/tmp/sdpa-san-cache
  for bin in fa3 fa3_fp8; do
    san=("$B/tests/$bin" small_calls_for_the_sanitizer --exact)
    "${san[@]}" > "$O/san-warm-$bin.log" 2>&1
    echo "$bin sanitizer calls rc=$?"
    for tool in memcheck racecheck synccheck; do
      timeout 50 compute-sanitizer --tool "$tool" --error-exitcode 3 "${san[@]}" > "$O/san-$bin-$tool.log" 2>&1
      echo "$bin $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' "$O/san-$bin-$tool.log" | tail -2 | tr '\n' ' ')"
    done
  done
) > "$O/san.txt" 2>&1
wait $SUITE

# 2. AMX (the 256-row items F2 made the default at few threads ran only in emulation before).
( for t in amx sdpa_cpu correctness; do
    SDPA_REQUIRE_AMX=1 SDPA_CPU_SIMD=amx timeout 40 "$B/cpu-tests/$t" --test-threads 16 > "$O/amx-$t.log" 2>&1
    echo "$t rc=$? $(grep -E 'test result' "$O/amx-$t.log" | tail -1)"
  done ) > "$O/amx.txt" 2>&1

# 3. The odd head dims: pad-copy (auto, by its rule) against the narrow path and PyTorch.
l=$(left)
if [ "$l" -gt 45 ]; then
  PYTHONPATH="sdpa-cuda/dev:bench/gpu" timeout $(( l - 8 )) python3 sdpa-cuda/dev/fa2_rust_bench.py --bench "$B/cuda_kernels" \
    --odd --out "$O/odd" > "$O/odd.log" 2>&1
  echo "odd bench rc=$?" > "$O/odd.rc"
fi

echo "== sanitizers"; cat "$O/san.txt"
echo "== $(cat "$O/suite.rc" 2>/dev/null)"
for f in "$O"/suite/tests/*.rc; do
  n=$(basename "$f" .rc); echo "$n: $(cat "$f") $(grep -E '^test result:' "$O/suite/tests/$n.log" | tail -1)"
done
for l in "$O"/suite/tests/*.log; do [ -f "${l%.log}.rc" ] || echo "$(basename "$l" .log): unfinished at the deadline"; done
grep -hE "panicked|FAILED|failed:" "$O"/suite/tests/*.log 2>/dev/null | head -20 | cut -c1-300
echo "== AMX"; cat "$O/amx.txt"
echo "== odd head dims ($(cat "$O/odd.rc" 2>/dev/null))"; sed -n '/^  D c     S ran/,$p' "$O/odd.log" 2>/dev/null | head -16
tail -5 "$O/odd.log" 2>/dev/null
