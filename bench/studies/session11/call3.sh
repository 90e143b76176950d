#!/usr/bin/env bash
# Session 11's third device call: the MLA path with independent Q·Kᵀ accumulator chains. Tests ($RUNS) and the
# sanitizers, ncu on one launch of each tile (sdpa-cuda/dev/ncu_stalls.sh; 16 heads at B = 8 takes the narrow
# tile, 128 heads the tall one), then the decode bench with the sweeps of $SWEEP, as call1.sh.
#   DEADLINE=560 bash bench/studies/session11/call3.sh
set -uo pipefail
T0=$SECONDS; DEADLINE=${DEADLINE:-560}
left() { echo $((DEADLINE - (SECONDS - T0))); }
RUNS=${RUNS:-"splitkv_mla machinery:--test-threads=1 fa2_kernels:auto"}
RUNS="$RUNS" SAN="splitkv_mla:small_mla_calls_for_the_sanitizer" SAN_S=50 DEADLINE=${TESTS_S:-200} \
  bash bench/studies/session10/tests10.sh
echo "tests done ($(left) s left)"
mkdir -p "$OUT/ncu"
for spec in "mla16 8,16,1,1,4096,576,512" "mla128 8,128,1,1,4096,576,512"; do
  set -- $spec
  OUT="$OUT/ncu" timeout 120 bash sdpa-cuda/dev/ncu_stalls.sh "$1" splitkv_mla_bf16 \
    gpu-bundle/sdpa run --backend cuda --kernel auto --dtype bf16 --shape "$2" --warmup 1 --reps 1 2>&1 | head -24
  echo "ncu $1 done ($(left) s left)"
done
rm -f "$OUT"/ncu/*.ncu-rep
SWEEP=${SWEEP:-"SDPA_MLA_SPLITS=32,64;SDPA_MLA_TILE=tall"} DEADLINE=$(left) SKIP_TESTS=1 \
  bash bench/studies/session11/call1.sh 2>&1 | grep -E "^sweep|^tag|^decode_mla|CEILINGS|rc="
