#!/usr/bin/env bash
# Session 8's device calls for issue 25 (engineer A, fa3's speed), run from /work/main's root on one H100 with the
# bundle in target-fa3s/gpu-bundle (this script, fa3_run.sh and fa3_bench.py copied into it):
#   bash target-fa3s/gpu-bundle/call.sh NAME [fa3_bench.py arguments]
# fa3_run.sh: the fa3 test binary (f64 reference; FA3_TEST_ENV reruns the reference test under each setting),
# compute-sanitizer memcheck, racecheck and synccheck on small calls of every class with two persistent blocks
# (so the work-tile ring, the counter and the K/V and Q barriers change phase across tiles), then fa3_bench.py
# against PyTorch cuDNN / FLASH and our fa2 in the same call. SUITE=1 also runs `run-gpu.sh tests` (auto sends
# sm_90 prefill to fa3) with what is left of DEADLINE. Everything is packed into $OUT/NAME.tgz.
set -uo pipefail
B=target-fa3s/gpu-bundle
NAME="$1"; shift
O="/tmp/w/$NAME"; mkdir -p "$O"  # packed into $OUT/NAME.tgz (a call brings back at most 8 files)
T0=$SECONDS; DEADLINE=${DEADLINE:-290}
left() { echo $((DEADLINE - (SECONDS - T0))); }
pack() { tar czf "$OUT/$NAME.tgz" -C /tmp/w "$NAME"; }
trap pack EXIT
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
# The first bench gets what the second bench (BENCH2_S), ncu (NCU_S) and the suite (SUITE_S) leave.
BENCH_BUDGET=${BENCH_BUDGET:-$(( $(left) - ${SUITE_S:-0} - ${BENCH2_S:-0} - ${NCU_S:-0} - 5 ))}
OUT="$O" B=$B BUDGET=$BENCH_BUDGET TEST_TIMEOUT=${TEST_TIMEOUT:-110} timeout $(( BENCH_BUDGET + 5 )) \
  bash $B/fa3_run.sh "$@" > "$O/fa3-run.log" 2>&1
echo "== fa3_run rc=$?"; grep -E "rc=|test result|SUMMARY|^fa3" "$O/fa3-run.log" | head -24
grep -vE "^(timing|ENV|CEILINGS)|UserWarning|fn = lambda|torch (flash|default) failed" "$O/fa3/bench.log" 2>/dev/null | tail -70
# BENCH2="fa3_bench.py arguments": a second grid (e.g. the head-dim points), in what is left before the suite.
if [ -n "${BENCH2:-}" ]; then
  l=$(( $(left) - ${SUITE_S:-0} - ${NCU_S:-0} )); echo "== bench2 ($l s)"
  PYTHONPATH="$B:sdpa-cuda/dev" timeout "$l" python3 "$B/fa3_bench.py" --bench "$B/cuda_kernels" --out "$O/bench2" \
    $BENCH2 > "$O/bench2.log" 2>&1
  echo "bench2 rc=$?"
  grep -vE "^(timing|ENV|CEILINGS)|UserWarning|fn = lambda|torch (flash|default) failed" "$O/bench2.log" | tail -40
fi
# NCU="S D causal(0/1)": one fa3 launch (bf16, 16k tokens, hidden 2048) under `ncu --set full`: the details
# page and the source counters' summary land in the pack.
if [ -n "${NCU:-}" ]; then
  read -r S D C <<< "$NCU"
  PYTHONPATH="$B:sdpa-cuda/dev" python3 -c "
import json, sys
from sdpa_dev import point
json.dump([point('ncu', 16384 // $S, 2048 // $D, 2048 // $D, $S, $S, $D, 'bf16', $C == 1, 'fa3')], open('/tmp/ncu_points.json', 'w'))"
  NCUB=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  timeout $(( $(left) - ${SUITE_S:-0} - 3 )) "$NCUB" --set full -k regex:fa3_ -c 1 -o "$O/ncu" \
    "$B/cuda_kernels" --points /tmp/ncu_points.json --out /tmp/ncu_out.json --warmup 0 --reps 1 > "$O/ncu-run.log" 2>&1
  echo "ncu rc=$? ($(left) s left)"; tail -3 "$O/ncu-run.log"
  "$NCUB" --import "$O/ncu.ncu-rep" --page details > "$O/ncu-details.txt" 2>&1
  grep -E "Duration|Registers Per|Achieved Occupancy|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Stall|L2 Hit|DRAM Throughput|Tensor|One or More Eligible" "$O/ncu-details.txt" | head -30
fi
if [ -n "${SUITE:-}" ]; then
  l=$(left); echo "== GPU suite ($l s left)"
  OUT="$O/suite" timeout $(( l - 5 )) bash $B/run-gpu.sh tests > "$O/suite.log" 2>&1
  echo "suite rc=$?"; tail -25 "$O/suite.log"
fi
