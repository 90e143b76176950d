#!/usr/bin/env bash
# The A/B session 8 could not run (bench/results/gpu/fa3.md, "Fourth step": call 3's code ran 4-11 % slower at
# S <= 2k than call 1's, and two of its changes touch every length). `SDPA_FA3_AB` (src/kernels/fa3.rs
# `AbSwitches`, kernels/fa3.cu `FA3_XO_*`) brings back session 7's choice for each, in the same binary:
#   store4      O stored as 4-byte column pairs instead of 16-byte row chunks (session 10 made this the
#               product after this script's run; the switch is now `store16`, and the script below asks
#               for it, so a rerun times session 8's stores against the product);
#   tile-turns  ping-pong turns restarted at every work tile instead of round robin across tiles.
# Written in session 9 without a GPU (the switches have not run). The script:
#   1. tests/fa3's reference test with both switches on, under a short timeout (a turn miscount hangs: rc 124),
#      then memcheck/racecheck/synccheck on its small calls with both on and two persistent blocks;
#   2. fa3_bench.py on the fa2bench grid's short lengths (bf16, D = 64 and 128, causal and not, S = 512..4k):
#      the product fa3, each switch alone and both, our fa2, PyTorch's cuDNN and FLASH, in one run.
# Build the bundle first (`cargo xtask gpu-bundle`), then on the device, carrying it:
#   DEADLINE=420 bash bench/studies/fa3/ab9/run.sh
set -uo pipefail
B=gpu-bundle
O=/tmp/w/ab9; mkdir -p "$O"
T0=$SECONDS; DEADLINE=${DEADLINE:-420}
left() { echo $((DEADLINE - (SECONDS - T0))); }
pack() { tar czf "$OUT/ab9.tgz" -C /tmp/w ab9; }
trap pack EXIT
export CUDA_HOME=/usr/local/cuda SDPA_REQUIRE_GPU=1 PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0 SDPA_CUDA_CACHE=/tmp/sdpa-cache-ab9
command -v compute-sanitizer > /dev/null || export PATH="$PATH:$CUDA_HOME/bin"
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; } > "$O/env.txt" 2>&1
cat "$O/env.txt"

# 1. Correctness of the switched entries first.
SDPA_FA3_AB=store16,tile-turns timeout 150 "$B/tests/fa3" fa3_matches_the_reference > "$O/ref-ab.log" 2>&1
echo "reference test, both switches: rc $?" | tee "$O/ref-ab.rc"
(
  export SDPA_FA3_AB=store16,tile-turns SDPA_CUDA_LINEINFO=1 SDPA_FA3_GRID=2,1 SDPA_CUDA_CACHE=/tmp/sdpa-san-ab9
  san=("$B/tests/fa3" small_calls_for_the_sanitizer --exact)
  "${san[@]}" > "$O/san-warm.log" 2>&1
  echo "warm-up rc=$?"
  for tool in memcheck racecheck synccheck; do
    timeout 50 compute-sanitizer --tool "$tool" --error-exitcode 3 "${san[@]}" > "$O/san-$tool.log" 2>&1
    echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' "$O/san-$tool.log" | tail -2 | tr '\n' ' ')"
  done
) > "$O/san.txt" 2>&1

# 2. The timings, if the switched entries ran correctly.
l=$(left)
if grep -q "rc 0" "$O/ref-ab.rc" && [ "$l" -gt 60 ]; then
  PYTHONPATH="$B:sdpa-cuda/dev" timeout $(( l - 10 )) python3 sdpa-cuda/dev/fa3_bench.py --bench "$B/cuda_kernels" \
    --seqs 512 1024 2048 4096 --out "$O/bench" \
    --variants store16:SDPA_FA3_AB=store16 tileturns:SDPA_FA3_AB=tile-turns both:SDPA_FA3_AB=store16,tile-turns \
    > "$O/bench.log" 2>&1
  echo "bench rc=$?" > "$O/bench.rc"
fi

echo "== sanitizers (both switches)"; cat "$O/san.txt"
echo "== reference: $(cat "$O/ref-ab.rc") $(grep -E '^test result:' "$O/ref-ab.log" | tail -1)"
grep -hE "panicked|FAILED" "$O"/*.log 2>/dev/null | head -8 | cut -c1-300
echo "== bench ($(cat "$O/bench.rc" 2>/dev/null))"; grep -vE "^(timing|ENV|CEILINGS)" "$O/bench.log" 2>/dev/null | tail -40
