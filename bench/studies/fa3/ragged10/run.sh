#!/usr/bin/env bash
# Session 10's device call for fa3's ragged (varlen) batches, K/V packed or paged (FA3_ENTRY_SERVE), which
# were written on a machine without a GPU and have never run: this script is their first run. With SDPA_FA3_RAGGED=1 (the
# verification switch; without it fa3 refuses ragged calls and auto never picks fa3 for them):
#   1. small_ragged_calls_for_the_sanitizer alone with two persistent blocks (SDPA_FA3_GRID=2,1), under a
#      short timeout: a miscounted ring or turn deadlocks, and shows here first as rc 124;
#   2. side by side: tests/fa3_ragged whole, again with SDPA_FA3_GRID=3,2 (three blocks walking the tiles of
#      many sequences), tests/ragged_prefill (fa2's
#      ragged path, without the switch: its `auto` call expects fa2) and tests/fa3 (the dense entries: their
#      main loops keep main's instruction count, a few reordered; the epilogue and repair path changed),
#      and fa3's and the policy's unit tests;
#   3. compute-sanitizer memcheck, racecheck and synccheck on the small calls (SDPA_FA3_GRID=2,1);
#   4. with what is left, fa3 against fa2 on ragged batches (the serving study's 16-sequence batch, no mask
#      and causal; GQA chunked prefill, packed and in 16-slot pages; sdpa bench, ragged10-bench.json).
# Logs under /tmp/w/ragged10, packed into $OUT/ragged10.tgz; a short table at the end. Build the bundle
# first (`cargo xtask gpu-bundle`), then run on the device, carrying it:
#   DEADLINE=330 bash bench/studies/fa3/ragged10/run.sh
set -uo pipefail
B=gpu-bundle
S=bench/studies/fa3/ragged10
O=/tmp/w/ragged10; mkdir -p "$O"
T0=$SECONDS; DEADLINE=${DEADLINE:-330}
left() { echo $((DEADLINE - (SECONDS - T0))); }
cap() { local l; l=$(( $(left) - ${2:-20} )); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }  # min(want, left - margin)
pack() { tar czf "$OUT/ragged10.tgz" -C /tmp/w ragged10; }
trap pack EXIT
export CUDA_HOME=/usr/local/cuda SDPA_REQUIRE_GPU=1 PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0 SDPA_CUDA_CACHE=/tmp/sdpa-cache10r
export SDPA_FA3_RAGGED=1
command -v compute-sanitizer > /dev/null || export PATH="$PATH:$CUDA_HOME/bin"
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; git log --oneline -1 2>/dev/null; } > "$O/env.txt" 2>&1
cat "$O/env.txt"

# 1. The first run of the ragged entries: small calls, two blocks, a short timeout.
SDPA_FA3_GRID=2,1 timeout "$(cap 75)" "$B/tests/fa3_ragged" small_ragged_calls_for_the_sanitizer --exact \
  > "$O/first.log" 2>&1
echo "$? $((SECONDS - T0))" > "$O/first.rc"
echo "first small calls: rc $(cat "$O/first.rc") (124: timed out, a hang)"

# 2. The tests, side by side on the GPU.
runs=("fa3_ragged" "fa3_ragged-grid" "ragged_prefill" "fa3" "unit_sdpa_cuda fa3" "unit_sdpa_cuda policy")
for r in "${runs[@]}"; do
  read -r name filter <<< "$r"
  (
    s=$SECONDS; bin="$B/tests/${name%-*}"
    case "$name" in
      *-grid) env SDPA_FA3_GRID=3,2 timeout "$(cap ${TEST_S:-150} 110)" "$bin" $filter > "$O/$name.log" 2>&1 ;;
      unit_sdpa_cuda) timeout "$(cap ${TEST_S:-150} 110)" "$B/tests/$name" $filter > "$O/${name}_$filter.log" 2>&1 ;;
      # fa2's ragged tests as they run in CI: without the switch (with it, their `auto` call takes fa3).
      ragged_prefill) env -u SDPA_FA3_RAGGED timeout "$(cap ${TEST_S:-150} 110)" "$B/tests/$name" > "$O/$name.log" 2>&1 ;;
      *) timeout "$(cap ${TEST_S:-150} 110)" "$B/tests/$name" $filter > "$O/$name.log" 2>&1 ;;
    esac
    echo "$? $(( SECONDS - s ))" > "$O/${r// /_}.rc"
  ) &
done
wait

# 3. The sanitizers on the small calls (line info for their reports, a cache of their own).
(
  export SDPA_CUDA_LINEINFO=1 SDPA_FA3_GRID=2,1 SDPA_CUDA_CACHE=/tmp/sdpa-san-cache10r
  san=("$B/tests/fa3_ragged" small_ragged_calls_for_the_sanitizer --exact)
  "${san[@]}" > "$O/san-warm.log" 2>&1
  echo "warm-up rc=$?"
  for tool in memcheck racecheck synccheck; do
    [ "$(left)" -lt 35 ] && { echo "$tool: skipped (deadline)"; continue; }
    timeout "$(cap 60 20)" compute-sanitizer --tool "$tool" --error-exitcode 3 "${san[@]}" > "$O/san-$tool.log" 2>&1
    echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' "$O/san-$tool.log" | tail -2 | tr '\n' ' ')"
  done
) > "$O/san.txt" 2>&1

# 4. fa3 against fa2 on ragged batches, with what is left (TIMING=0 skips it: a call that runs other
#    tests beside this script, and times in a call of its own).
l=$(left)
if [ "${TIMING:-1}" = 1 ] && [ "$l" -gt 40 ]; then
  timeout $(( l - 10 )) "$B/sdpa" bench --spec "$S/ragged10-bench.json" --no-pytorch --check-rows 32 \
    --out "$O/bench.json" > "$O/bench.log" 2>&1
  echo "$?" > "$O/bench.rc"
fi

echo "== first small calls: rc $(cat "$O/first.rc")"; grep -E "^test |panicked" "$O/first.log" | head -5 | cut -c1-300
echo "== sanitizers"; cat "$O/san.txt"
echo "== tests"
for r in "${runs[@]}"; do
  log="$O/$(echo "$r" | sed 's/ /_/').log"
  echo "$r: rc/s $(cat "$O/${r// /_}.rc" 2>/dev/null) $(grep -E '^test result:' "$log" 2>/dev/null | tail -1)"
done
grep -hE "panicked|FAILED|cases failed" "$O"/*.log 2>/dev/null | head -16 | cut -c1-300
echo "== bench (rc $(cat "$O/bench.rc" 2>/dev/null))"; grep -vE "^(timing|ENV)" "$O/bench.log" 2>/dev/null | tail -24
