#!/usr/bin/env bash
# Session 10's last call, with what was left of its device time:
#   1. RUNS/SAN (tests10.sh), if given: the GPU tests a review's kernel-side fixes need;
#   2. issue 25's D = 256 and 192/128 bars after this session's O-store change: fa3 against PyTorch on
#      the head-dim grid's 1k..4k points (`fa3_bench.py --headdims --dims 256 192/128`);
#   3. where a short call's time goes: ncu's warp-state, scheduler and occupancy sections on one fa3 launch at
#      the fa2bench grid's S = 512 (bf16, D = 128, B = 32, H = 16, no mask), for the next step on the
#      main bar (every point at S <= 1k is below 0.9x cuDNN).
# From the repository root with gpu-bundle carried:
#   DEADLINE=330 bash bench/studies/session10/final10.sh
set -uo pipefail
B=gpu-bundle
O=/tmp/w/final10; mkdir -p "$O"
T0=$SECONDS; DEADLINE=${DEADLINE:-330}
left() { echo $((DEADLINE - (SECONDS - T0))); }
pack() { tar czf "$OUT/final10.tgz" -C /tmp/w final10; }
trap pack EXIT
export CUDA_HOME=/usr/local/cuda SDPA_REQUIRE_GPU=1 PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0 SDPA_CUDA_CACHE=/tmp/sdpa-cache10f
command -v ncu > /dev/null || export PATH="$PATH:$CUDA_HOME/bin"
{ date -u; nvidia-smi -L; } > "$O/env.txt" 2>&1; cat "$O/env.txt"

if [ -n "${RUNS:-}${SAN:-}" ]; then
  DEADLINE=${TESTS_S:-150} bash bench/studies/session10/tests10.sh > "$O/tests.txt" 2>&1
  echo "tests rc=$? ($(left) s left)"
fi

PYTHONPATH="$B:sdpa-cuda/dev" timeout "$(( $(left) < ${DIMS_S:-100} ? $(left) - 60 : ${DIMS_S:-100} ))" \
  python3 sdpa-cuda/dev/fa3_bench.py --bench "$B/cuda_kernels" --headdims --dims 256 192/128 --seqs 1024 2048 4096 \
  --variants --out "$O/dims" > "$O/dims.log" 2>&1
echo "dims rc=$? ($(left) s left)"

NCU=(ncu --kernel-name regex:fa3 --launch-skip 3 --launch-count 1)
CALL=("$B/sdpa" run --backend cuda --kernel fa3 --dtype bf16 --shape 32,16,16,512,512,128 --warmup 3 --reps 1)
if [ "$(left)" -gt 40 ]; then
  timeout $(( $(left) - 25 )) "${NCU[@]}" --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats "${CALL[@]}" > "$O/ncu.txt" 2>&1
  echo "ncu rc=$? ($(left) s left)"
fi
# The stall reasons by name (a second launch: an unknown metric name fails the whole run, so apart).
if [ "$(left)" -gt 25 ]; then
  m=""; for r in barrier long_scoreboard short_scoreboard wait math_pipe_throttle mio_throttle membar sleeping \
    dispatch_stall no_instruction not_selected selected lg_throttle branch_resolving; do
    m="$m,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"; done
  timeout $(( $(left) - 5 )) "${NCU[@]}" --metrics "${m#,}" "${CALL[@]}" > "$O/ncu-stalls.txt" 2>&1
  echo "ncu stalls rc=$? ($(left) s left)"
fi

echo "== tests"; sed -n '/^== tests/,$p' "$O/tests.txt" 2>/dev/null | cut -c1-240
echo "== dims"; grep -vE "^(timing|ENV|CEILINGS)|UserWarning|fn = lambda|torch (flash|default) failed" "$O/dims.log" | tail -24
echo "== ncu"; grep -vE "^\s*$|^==PROF==|----" "$O/ncu.txt" | cut -c1-160 | tail -45
echo "== stalls"; grep -E "stalled" "$O/ncu-stalls.txt" | cut -c1-160
