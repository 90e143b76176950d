#!/usr/bin/env bash
# Session 10's device call for the backward at head dims that are not multiples of 8 (issue 21), whose
# pad-copy path (sdpa-cuda/src/kernels/bwd_pad.rs: Q, K, V, O and dO copied into zero-filled scratch with D
# and Dv rounded up to 8, the aligned backward run there, dQ, dK and dV's own columns copied back) was written
# on a machine without a GPU and has never run: this script is its first run.
#   1. tests, side by side: tests/backward_odd_head_dims (new: D/Dv 1..250 and unequal pairs, both causal
#      alignments and none, GQA 1/4, both layouts, misaligned views, ragged, explicit mask, deterministic and
#      f32 dQ, f16 and bf16), tests/backward (the aligned backward, regression), the unit tests of bwd,
#      bwd_pad and pad_copy, and odd_head_dims' fa3 refusal (its backward half moved to the new file);
#   2. compute-sanitizer memcheck and racecheck on small_odd_calls_for_the_sanitizer (the copies in and out,
#      atomic and deterministic with the f32 dQ; no line info: the tests' kernel cache is reused to fit);
#   3. with what is left, the backward timed (`sdpa bench --pass bwd`, PyTorch's backward of the same calls
#      in the same run when torch imports): bf16 B=4 H=16 S=2048 causal at D = 64, 65, 72, 80, 88.
# Logs under /tmp/w/odd10, packed into $OUT/odd10.tgz; a short table at the end. Build the bundle first
# (`cargo xtask gpu-bundle`), then run on the device from the repository root, carrying it:
#   DEADLINE=180 bash bench/studies/backward/odd10/run.sh
set -uo pipefail
B=gpu-bundle
O=/tmp/w/odd10; mkdir -p "$O"
T0=$SECONDS; DEADLINE=${DEADLINE:-180}
left() { echo $((DEADLINE - (SECONDS - T0))); }
cap() { local l; l=$(( $(left) - ${2:-20} )); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }  # min(want, left - margin)
pack() { tar czf "${OUT:-/tmp}/odd10.tgz" -C /tmp/w odd10; }
trap pack EXIT
export CUDA_HOME=/usr/local/cuda SDPA_REQUIRE_GPU=1 PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0 SDPA_CUDA_CACHE=/tmp/sdpa-cache10
command -v compute-sanitizer > /dev/null || export PATH="$PATH:$CUDA_HOME/bin"
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; git log --oneline -1 2>/dev/null; } > "$O/env.txt" 2>&1
cat "$O/env.txt"

# 1. The tests, side by side on the GPU (each compiles its own programs on parallel threads first).
runs=("backward_odd_head_dims" "backward" "unit_sdpa_cuda bwd pad_copy" "odd_head_dims fa3_refuses_odd_head_dims_with_the_reason")
for r in "${runs[@]}"; do
  read -r name filter <<< "$r"
  (
    s=$SECONDS
    timeout "$(cap 110 60)" "$B/tests/$name" $filter > "$O/$name.log" 2>&1
    echo "$? $(( SECONDS - s ))" > "$O/$name.rc"
  ) &
done
wait

# 2. The sanitizers on the small calls (the programs are in the tests' cache by now).
(
  san=("$B/tests/backward_odd_head_dims" small_odd_calls_for_the_sanitizer --exact)
  for tool in memcheck racecheck; do
    [ "$(left)" -lt 40 ] && { echo "$tool: skipped (deadline)"; continue; }
    timeout "$(cap 60 25)" compute-sanitizer --tool "$tool" --error-exitcode 3 "${san[@]}" > "$O/san-$tool.log" 2>&1
    echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' "$O/san-$tool.log" | tail -2 | tr '\n' ' ')"
  done
) > "$O/san.txt" 2>&1

# 3. The backward at D = 80 against its neighbours 72 and 88, and the odd D = 65 against 64 and 72, with
#    PyTorch's backward of the same calls when torch imports (sdpa bench runs it by default then).
#    TIMING=0 skips it (a call that runs other tests beside this script, and times in a call of its own).
l=$(left)
if [ "${TIMING:-1}" = 1 ] && [ "$l" -gt 35 ]; then
  shapes=(); for d in 64 65 72 80 88; do shapes+=(--shape "4,16,16,2048,2048,$d"); done
  timeout $(( l - 8 )) "$B/sdpa" bench --backend cuda --kernel auto --dtype bf16 --mask causal --layout bhsd \
    --pass bwd "${shapes[@]}" --pytorch-kernels flash,efficient,cudnn --warmup 2 --reps 10 --max-time 0.5 \
    --check-rows 16 --out "$O/bench.json" > "$O/bench.log" 2>&1
  echo "$?" > "$O/bench.rc"
  [ -s "$O/bench.json" ] && timeout 20 "$B/sdpa" report "$O/bench.json" --out-dir "$O/report" > "$O/report.log" 2>&1
else
  echo "skipped: $l s left" > "$O/bench.log"
fi

echo "== tests"
for r in "${runs[@]}"; do
  read -r name filter <<< "$r"
  echo "$name: rc/s $(cat "$O/$name.rc" 2>/dev/null) $(grep -E '^test result:' "$O/$name.log" | tail -1)"
done
grep -hE "^FAIL|panicked|cases failed" "$O"/*.log 2>/dev/null | head -16 | cut -c1-300
echo "== sanitizers"; cat "$O/san.txt"
echo "== bench (rc $(cat "$O/bench.rc" 2>/dev/null), $(( SECONDS - T0 )) s in all)"
grep -vE "^(timing|ENV)|UserWarning" "$O/bench.log" 2>/dev/null | tail -24
echo "== report (backward)"; sed -n '/[Bb]ackward/,/^$/p' "$O/report/report.md" 2>/dev/null | head -30
