#!/usr/bin/env bash
# Session 9's device call for fa3's windows, softcap and ALiBi (FA3_ENTRY_VAR), which were written on a
# machine without a GPU and have never run: this script is their first run. With SDPA_FA3_VARIANTS=1 (the
# verification switch; without it fa3 refuses variants and auto never picks fa3 for them):
#   1. small_variant_calls_for_the_sanitizer alone with two persistent blocks (SDPA_FA3_GRID=2,1), under a
#      short timeout: a miscounted ring or turn deadlocks, and shows here first as rc 124;
#   2. tests/fa3_variants whole, again with SDPA_FA3_GRID=3,2 (three blocks: dozens of work tiles each, key
#      ranges starting at different tiles), tests/fa3 (the plain entries; their cubins are byte-identical to
#      main's), fa3's and the policy's unit tests, and variant_kernels (auto may send its variant calls to
#      fa3 now);
#   3. compute-sanitizer memcheck, racecheck and synccheck on the small calls (SDPA_FA3_GRID=2,1);
#   4. with what is left, fa3 against fa2 on the same variant calls (bf16 B=1 H=16 D=128, S = 4k and 16k,
#      causal: plain, window 1024, softcap 30, ALiBi; sdpa bench, variants9-bench.json).
# Logs under /tmp/w/variants9, packed into $OUT/variants9.tgz; a short table at the end. Build the bundle
# first (`cargo xtask gpu-bundle`), then run on the device, carrying it:
#   DEADLINE=540 bash bench/studies/fa3/variants9/run.sh
set -uo pipefail
B=gpu-bundle
S=bench/studies/fa3/variants9
O=/tmp/w/variants9; mkdir -p "$O"
T0=$SECONDS; DEADLINE=${DEADLINE:-540}
left() { echo $((DEADLINE - (SECONDS - T0))); }
cap() { local l; l=$(( $(left) - ${2:-20} )); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }  # min(want, left - margin)
pack() { tar czf "$OUT/variants9.tgz" -C /tmp/w variants9; }
trap pack EXIT
export CUDA_HOME=/usr/local/cuda SDPA_REQUIRE_GPU=1 PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0 SDPA_CUDA_CACHE=/tmp/sdpa-cache9
export SDPA_FA3_VARIANTS=1
command -v compute-sanitizer > /dev/null || export PATH="$PATH:$CUDA_HOME/bin"
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; git log --oneline -1 2>/dev/null; } > "$O/env.txt" 2>&1
cat "$O/env.txt"

# 1. The first run of the variant entries: small calls, two blocks, a short timeout.
SDPA_FA3_GRID=2,1 timeout "$(cap 90)" "$B/tests/fa3_variants" small_variant_calls_for_the_sanitizer --exact \
  > "$O/first.log" 2>&1
echo "$? $((SECONDS - T0))" > "$O/first.rc"
echo "first small calls: rc $(cat "$O/first.rc") (124: timed out, a hang)"

# 2. The tests, side by side on the GPU.
runs=("fa3_variants" "fa3_variants-grid" "fa3" "unit_sdpa_cuda fa3" "variant_kernels")
for r in "${runs[@]}"; do
  read -r name filter <<< "$r"
  (
    s=$SECONDS; bin="$B/tests/${name%-grid}"
    case "$name" in
      *-grid) env SDPA_FA3_GRID=3,2 timeout "$(cap 300 60)" "$bin" $filter > "$O/$name.log" 2>&1 ;;
      *) timeout "$(cap 300 60)" "$bin" $filter > "$O/$name.log" 2>&1 ;;
    esac
    echo "$? $(( SECONDS - s ))" > "$O/${name// /_}.rc"
  ) &
done
wait

# 3. The sanitizers on the small calls (line info for their reports, a cache of their own).
(
  export SDPA_CUDA_LINEINFO=1 SDPA_FA3_GRID=2,1 SDPA_CUDA_CACHE=/tmp/sdpa-san-cache9
  san=("$B/tests/fa3_variants" small_variant_calls_for_the_sanitizer --exact)
  "${san[@]}" > "$O/san-warm.log" 2>&1
  echo "warm-up rc=$?"
  for tool in memcheck racecheck synccheck; do
    [ "$(left)" -lt 60 ] && { echo "$tool: skipped (deadline)"; continue; }
    timeout "$(cap 90 40)" compute-sanitizer --tool "$tool" --error-exitcode 3 "${san[@]}" > "$O/san-$tool.log" 2>&1
    echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' "$O/san-$tool.log" | tail -2 | tr '\n' ' ')"
  done
) > "$O/san.txt" 2>&1

# 4. fa3 against fa2 on the variant calls, with what is left.
l=$(left)
if [ "$l" -gt 60 ]; then
  timeout $(( l - 10 )) "$B/sdpa" bench --spec "$S/variants9-bench.json" --no-pytorch --check-rows 32 \
    --out "$O/bench.json" > "$O/bench.log" 2>&1
  echo "$?" > "$O/bench.rc"
fi

echo "== first small calls: rc $(cat "$O/first.rc")"; grep -E "^test |panicked" "$O/first.log" | head -5 | cut -c1-300
echo "== sanitizers"; cat "$O/san.txt"
echo "== tests"
for r in "${runs[@]}"; do
  read -r name filter <<< "$r"
  echo "$name: rc/s $(cat "$O/${name// /_}.rc" 2>/dev/null) $(grep -E '^test result:' "$O/$name.log" | tail -1)"
done
grep -hE "fa3 variants:|panicked|FAILED|cases failed" "$O"/*.log 2>/dev/null | head -16 | cut -c1-300
echo "== bench (rc $(cat "$O/bench.rc" 2>/dev/null))"; grep -vE "^(timing|ENV)" "$O/bench.log" 2>/dev/null | tail -30
