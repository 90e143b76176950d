#!/usr/bin/env bash
# Session 8's last device call for issue 25 (engineer A), from /work/main's root on one H100, bundle in
# target-fa3s/gpu-bundle (this script, fa3_bench.py and sdpa_dev.py copied into it):
#   bash target-fa3s/gpu-bundle/final.sh
# 1. The fa2bench grid, bf16 and f16, fa3 and fa2 against PyTorch cuDNN and FLASH in the same call (first, on
#    an idle GPU). 2. The whole GPU suite (`run-gpu.sh tests`: every test binary, tests/fa3 among them, with
#    `auto` sending sm_90 prefill to fa3), with compute-sanitizer memcheck, racecheck and synccheck on
#    tests/fa3's small calls (two persistent blocks) running beside it; both stopped at the deadline, the
#    binaries that finished reported. Everything is packed into $OUT/call3.tgz.
set -uo pipefail
B=target-fa3s/gpu-bundle
O=/tmp/w/call3; mkdir -p "$O"
T0=$SECONDS; DEADLINE=${DEADLINE:-295}
left() { echo $((DEADLINE - (SECONDS - T0))); }
pack() { tar czf "$OUT/call3.tgz" -C /tmp/w call3; }
trap pack EXIT
export CUDA_HOME=/usr/local/cuda SDPA_REQUIRE_GPU=1 PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
command -v compute-sanitizer > /dev/null || export PATH="$PATH:$CUDA_HOME/bin"
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; } > "$O/env.txt" 2>&1
PYTHONPATH="$B:sdpa-cuda/dev" timeout "${GRID_S:-150}" python3 "$B/fa3_bench.py" --bench "$B/cuda_kernels" --out "$O/grid" \
  --f16 --variants > "$O/grid.log" 2>&1
echo "grid rc=$? ($(left) s left)"
( OUT="$O/suite" timeout $(( $(left) - 8 )) bash "$B/run-gpu.sh" tests > "$O/suite.log" 2>&1; echo "suite rc=$?" > "$O/suite.rc" ) &
SUITE=$!
(
  export SDPA_CUDA_LINEINFO=1 SDPA_FA3_GRID=2,1 SDPA_CUDA_CACHE=/tmp/sdpa-san-cache
  san=("$B/tests/fa3" small_calls_for_the_sanitizer --exact)
  "${san[@]}" > "$O/san-warm.log" 2>&1
  echo "sanitizer calls rc=$?"
  for tool in memcheck racecheck synccheck; do
    timeout 60 compute-sanitizer --tool "$tool" --error-exitcode 3 "${san[@]}" > "$O/san-$tool.log" 2>&1
    echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' "$O/san-$tool.log" | tail -2 | tr '\n' ' ')"
  done
) > "$O/san.txt" 2>&1
wait $SUITE
cat "$O/san.txt" "$O/suite.rc" 2>/dev/null
echo "== suite binaries (rc seconds, result):"
for f in "$O"/suite/tests/*.rc; do
  n=$(basename "$f" .rc); echo "$n: $(cat "$f") $(grep -E '^test result:' "$O/suite/tests/$n.log" | tail -1)"
done
for l in "$O"/suite/tests/*.log; do [ -f "${l%.log}.rc" ] || echo "$(basename "$l" .log): unfinished at the deadline"; done
grep -vE "^(timing|ENV|CEILINGS)|UserWarning|fn = lambda|torch (flash|default) failed" "$O/grid.log" | tail -62
