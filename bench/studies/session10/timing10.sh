#!/usr/bin/env bash
# Session 10's timing call, everything timed alone on an otherwise idle machine, in this order:
#   1. the AMX tile rule against PyTorch on the host CPU (bench/studies/cpu-s10/run.sh, GPU idle; its folder
#      carried in target-cpu10/dev), if that folder is there;
#   2. the fa2bench grid, bf16 and f16: the product fa3 (4-byte O stores since this session) and fa2 against
#      PyTorch's cuDNN and FLASH backends in the same run (sdpa-cuda/dev/fa3_bench.py);
#   3. odd head dims: fa2's pad-copy rule as refitted in session 8 against the narrow path and PyTorch
#      (sdpa-cuda/dev/fa2_rust_bench.py --odd);
#   4. the extra stages named in $EXTRA (a file of shell lines, each run with what is left of the deadline).
# From the repository root with gpu-bundle carried:
#   DEADLINE=520 bash bench/studies/session10/timing10.sh
set -uo pipefail
B=gpu-bundle
O=/tmp/w/timing10; mkdir -p "$O"
T0=$SECONDS; DEADLINE=${DEADLINE:-520}
left() { echo $((DEADLINE - (SECONDS - T0))); }
pack() { tar czf "$OUT/timing10.tgz" -C /tmp/w timing10; }
trap pack EXIT
export CUDA_HOME=/usr/local/cuda SDPA_REQUIRE_GPU=1 PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0 SDPA_CUDA_CACHE=/tmp/sdpa-cache10
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; } > "$O/env.txt" 2>&1
cat "$O/env.txt"

if [ -f target-cpu10/dev/run.sh ]; then
  DEADLINE=${CPU_S:-150} timeout $(( ${CPU_S:-150} + 15 )) bash target-cpu10/dev/run.sh > "$O/cpu.log" 2>&1
  echo "cpu rc=$? ($(left) s left)"
fi

PYTHONPATH="$B:sdpa-cuda/dev" timeout "$(( $(left) < ${GRID_S:-170} ? $(left) - 20 : ${GRID_S:-170} ))" \
  python3 sdpa-cuda/dev/fa3_bench.py --bench "$B/cuda_kernels" --out "$O/grid" --f16 --variants > "$O/grid.log" 2>&1
echo "grid rc=$? ($(left) s left)"

if [ "$(left)" -gt 70 ]; then
  PYTHONPATH="sdpa-cuda/dev:bench/gpu" timeout "$(( $(left) < ${ODD_S:-80} ? $(left) - 10 : ${ODD_S:-80} ))" \
    python3 sdpa-cuda/dev/fa2_rust_bench.py --bench "$B/cuda_kernels" --odd --out "$O/odd" > "$O/odd.log" 2>&1
  echo "odd rc=$? ($(left) s left)"
fi

if [ -n "${EXTRA:-}" ] && [ -f "$EXTRA" ]; then
  while IFS= read -r line; do
    [ -z "$line" ] && continue
    [ "$(left)" -lt 30 ] && { echo "skipped (deadline): $line"; continue; }
    L=$(left) timeout $(( $(left) - 5 )) bash -c "$line"
    echo "extra rc=$? ($(left) s left): $line"
  done < "$EXTRA"
fi

echo "== cpu"; sed -n '/^== tests/,$p' "$O/cpu.log" 2>/dev/null | head -30
echo "== grid"; grep -vE "^(timing|ENV|CEILINGS)|UserWarning|fn = lambda|torch (flash|default) failed" "$O/grid.log" | tail -50
echo "== odd"; sed -n '/^  D c     S ran/,$p' "$O/odd.log" 2>/dev/null | head -16
