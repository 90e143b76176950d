#!/usr/bin/env bash
# Session 10's correctness call: the GPU test binaries named below side by side on one H100, then
# compute-sanitizer memcheck, racecheck and synccheck on the small calls named in SAN (SAN_S seconds kept
# for them, default 90), each stopped at the
# deadline; logs under /tmp/w/tests10, packed into $OUT/tests10.tgz; a short table at the end.
#   RUNS: space-separated `binary[:test filter][@VAR=value+VAR=value...]` (a binary of gpu-bundle/tests);
#   SAN:  space-separated `binary:exact test name[@VAR=value+...]`.
# From the repository root with gpu-bundle carried:
#   DEADLINE=300 RUNS="fa3 fa3_fp8 ..." SAN="fa3:small_calls_for_the_sanitizer ..." bash bench/studies/session10/tests10.sh
set -uo pipefail
B=gpu-bundle
O=/tmp/w/tests10; mkdir -p "$O"
T0=$SECONDS; DEADLINE=${DEADLINE:-300}
left() { echo $((DEADLINE - (SECONDS - T0))); }
pack() { tar czf "$OUT/tests10.tgz" -C /tmp/w tests10; }
trap pack EXIT
export CUDA_HOME=/usr/local/cuda SDPA_REQUIRE_GPU=1 PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0 SDPA_CUDA_CACHE=/tmp/sdpa-cache10
command -v compute-sanitizer > /dev/null || export PATH="$PATH:$CUDA_HOME/bin"
{ date -u; nvidia-smi -L; git log --oneline -1 2>/dev/null; } > "$O/env.txt" 2>&1
cat "$O/env.txt"

# `name[:filter][@A=1+B=2]` -> log name, binary, filter, env assignments.
split() {
  local spec=$1 envs="" filter=""
  [[ $spec == *@* ]] && { envs=${spec#*@}; spec=${spec%%@*}; }
  [[ $spec == *:* ]] && { filter=${spec#*:}; spec=${spec%%:*}; }
  echo "$spec|$filter|${envs//+/ }"
}
tag() { echo "$1" | tr -c 'A-Za-z0-9_=.-' '_' | cut -c1-80; }

# The sanitizers' warm-up (NVRTC compiles into their own cache) runs first, beside the tests.
# The sanitizers' share of the deadline, none when SAN names nothing (session 21's call 4 lost its tests to it).
KEEP=${SAN_S:-90}; [ -z "${SAN:-}" ] && KEEP=0
for r in ${RUNS:-}; do
  IFS='|' read -r bin filter envs <<< "$(split "$r")"
  t=$(tag "$r")
  ( s=$SECONDS; env $envs timeout $(( $(left) - KEEP )) "$B/tests/$bin" $filter > "$O/$t.log" 2>&1
    echo "$? $(( SECONDS - s ))" > "$O/$t.rc" ) &
done
(
  export SDPA_CUDA_LINEINFO=1 SDPA_FA3_GRID=2,1 SDPA_CUDA_CACHE=/tmp/sdpa-san-cache10
  for r in ${SAN:-}; do
    IFS='|' read -r bin filter envs <<< "$(split "$r")"
    t=$(tag "$r")
    env $envs "$B/tests/$bin" "$filter" --exact > "$O/san-warm-$t.log" 2>&1
    echo "$t warm-up rc=$?"
  done
) > "$O/san.txt" 2>&1
wait
(
  export SDPA_CUDA_LINEINFO=1 SDPA_FA3_GRID=2,1 SDPA_CUDA_CACHE=/tmp/sdpa-san-cache10
  for r in ${SAN:-}; do
    IFS='|' read -r bin filter envs <<< "$(split "$r")"
    t=$(tag "$r")
    for tool in memcheck racecheck synccheck; do
      [ "$(left)" -lt 25 ] && { echo "$t $tool: skipped (deadline)"; continue; }
      env $envs timeout $(( $(left) < 90 ? $(left) - 10 : 80 )) compute-sanitizer --tool "$tool" --error-exitcode 3 \
        "$B/tests/$bin" "$filter" --exact > "$O/san-$tool-$t.log" 2>&1
      echo "$t $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' "$O/san-$tool-$t.log" | tail -2 | tr '\n' ' ')"
    done
  done
) >> "$O/san.txt" 2>&1

echo "== tests (rc seconds, result)"
for r in ${RUNS:-}; do
  t=$(tag "$r"); echo "$r: $(cat "$O/$t.rc" 2>/dev/null || echo unfinished) $(grep -E '^test result:' "$O/$t.log" | tail -1)"
done
grep -hE "panicked|FAILED|cases failed" "$O"/*.log 2>/dev/null | head -16 | cut -c1-300
echo "== sanitizers"; cat "$O/san.txt"
