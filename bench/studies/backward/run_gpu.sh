#!/usr/bin/env bash
# The backward's GPU run (issue 24), from a folder holding the `backward` test binary, the `backward_timing`
# example and this folder's Python: `run_gpu.sh [tests] [alt] [nohf] [sanitize] [timing] [torch] [ncu]`.
#   tests     every test of tests/backward.rs on the default tiles
#   alt       the tests named by $ALT_FILTER (default: ragged deterministic; `all` for every test) again under
#             each tile of $ALT_TILES (`;`-separated [D:]bm,kw,cw,mt,min_blocks[,s], through SDPA_BWD_TILE)
#   nohf      every test, memcheck and racecheck with SDPA_BWD_HEAVY_FIRST=0 (causal masks on the launch-order grid)
#   sanitize  $SANITIZE_TOOLS (default memcheck racecheck) on the small calls
#   timing    examples/backward_timing on the default tiles and the D:tile list $TIME_TILES (with $TIME_NOHF set,
#             the default tiles once more without the causal grid order)
#   torch     bench/studies/backward/torch_bwd.py (FLASH_ATTENTION and CUDNN_ATTENTION), joined with ours
# Logs under $OUT/bwd, packed into $OUT/bwd.tgz; the last lines printed are the summary and the table.
set -uo pipefail
B="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-$PWD/gpu-out}"
R="$OUT/bwd"; mkdir -p "$R"
export SDPA_REQUIRE_GPU=1 SDPA_CUDA_CACHE="${SDPA_CUDA_CACHE:-/tmp/sdpa-cuda-cache}" CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export PYTHONUNBUFFERED=1
stages="${*:-tests sanitize timing torch}"
want() { [[ " $stages " == *" $1 "* ]]; }
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; } > "$R/env.txt" 2>&1
summary=()
if want tests; then
  t0=$(date +%s)
  timeout 90 "$B/backward" --test-threads 6 > "$R/tests.log" 2>&1; rc=$?
  summary+=("tests rc=$rc $(( $(date +%s) - t0 ))s: $(grep -E '^test result' "$R/tests.log" | tail -1)")
fi
if want alt; then
  IFS=';' read -ra tiles <<< "${ALT_TILES:-}"
  for t in "${tiles[@]}"; do
    t0=$(date +%s)
    filter="${ALT_FILTER:-ragged deterministic}"; [[ "$filter" == all ]] && filter=""
    # shellcheck disable=SC2086
    SDPA_BWD_TILE="$t" timeout "${ALT_TIMEOUT:-40}" "$B/backward" --test-threads 6 $filter > "$R/tests-${t//[:,]/_}.log" 2>&1; rc=$?
    summary+=("tests SDPA_BWD_TILE=$t rc=$rc $(( $(date +%s) - t0 ))s: $(grep -E '^test result' "$R/tests-${t//[:,]/_}.log" | tail -1)")
  done
fi
if want nohf; then
  # Every test, memcheck and racecheck again with causal masks on the launch-order grid (SDPA_BWD_HEAVY_FIRST=0).
  t0=$(date +%s)
  SDPA_BWD_HEAVY_FIRST=0 timeout 90 "$B/backward" --test-threads 6 > "$R/tests-nohf.log" 2>&1; rc=$?
  summary+=("tests SDPA_BWD_HEAVY_FIRST=0 rc=$rc $(( $(date +%s) - t0 ))s: $(grep -E '^test result' "$R/tests-nohf.log" | tail -1)")
  for tool in memcheck racecheck; do
    SDPA_BWD_HEAVY_FIRST=0 timeout 40 compute-sanitizer --tool "$tool" --error-exitcode 3 "$B/backward" small_calls_for_the_sanitizer > "$R/sanitize-$tool-nohf.log" 2>&1; rc=$?
    summary+=("$tool SDPA_BWD_HEAVY_FIRST=0 rc=$rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^test result' "$R/sanitize-$tool-nohf.log" | tr '\n' ' ')")
  done
fi
if want sanitize; then
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
    t0=$(date +%s)
    timeout 40 compute-sanitizer --tool "$tool" --error-exitcode 3 "$B/backward" small_calls_for_the_sanitizer > "$R/sanitize-$tool.log" 2>&1; rc=$?
    summary+=("$tool rc=$rc $(( $(date +%s) - t0 ))s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^test result' "$R/sanitize-$tool.log" | tr '\n' ' ')")
  done
fi
if want timing; then
  t0=$(date +%s)
  timeout "${TIME_TIMEOUT:-80}" "$B/backward_timing" 10 atomic "${TIME_TILES:-}" > "$R/sdpa.txt" 2>&1; summary+=("sdpa timing rc=$? $(( $(date +%s) - t0 ))s")
  grep '^{' "$R/sdpa.txt" > "$R/sdpa.jsonl"
  if [[ -n "${TIME_NOHF:-}" ]]; then
    # The default tiles again with the grid in launch order under causal masks (SDPA_BWD_HEAVY_FIRST=0), as sdpa:launch-order.
    t0=$(date +%s)
    SDPA_BWD_HEAVY_FIRST=0 timeout "${TIME_TIMEOUT:-80}" "$B/backward_timing" 10 atomic > "$R/sdpa-nohf.txt" 2>&1
    summary+=("sdpa timing (launch order) rc=$? $(( $(date +%s) - t0 ))s")
    grep '^{' "$R/sdpa-nohf.txt" | sed 's/"impl":"sdpa"/"impl":"sdpa:launch-order"/' >> "$R/sdpa.jsonl"
  fi
fi
if want torch; then
  t0=$(date +%s)
  timeout 70 python3 "$B/torch_bwd.py" 10 > "$R/torch.jsonl" 2> "$R/torch.err"; summary+=("torch timing rc=$? $(( $(date +%s) - t0 ))s")
fi
if want ncu; then
  # One point ($NCU_POINT, D:S:causal) of the main kernel under each tile of $NCU_TILES (`;`-separated, `default`
  # for the shipped tile), a few sections only.
  IFS=';' read -ra tiles <<< "${NCU_TILES:-default}"
  for t in "${tiles[@]}"; do
    t0=$(date +%s); d="${NCU_POINT%%:*}"
    if [[ "$t" == default ]]; then unset SDPA_BWD_TILE; name="bwd_bf16_${d}_plain"; else
      export SDPA_BWD_TILE="$d:$t"; x=$(sed -E "s/,([sf]+)$/\1/; s/,/x/g" <<< "$t"); name="bwd_tile${x}_bf16_${d}_plain"; fi
    SDPA_BWD_POINTS="$NCU_POINT" timeout "${NCU_TIMEOUT:-60}" ncu --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats \
      --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats ${NCU_EXTRA:-} -k "regex:^${name}\$" -c 1 \
      "$B/backward_timing" 1 atomic > "$R/ncu-${t//,/_}.txt" 2>&1
    summary+=("ncu $t ($name) rc=$? $(( $(date +%s) - t0 ))s")
    unset SDPA_BWD_TILE
  done
fi
[[ -s "$R/sdpa.jsonl" ]] && python3 "$B/join.py" "$R/sdpa.jsonl" "${TORCHFILE:-$R/torch.jsonl}" > "$R/table.txt" 2>&1
tar czf "$OUT/bwd.tgz" -C "$OUT" bwd
grep -hE "panicked at|over twice|FAIL" "$R"/tests*.log 2>/dev/null | head -12
grep -v '^{' "$R/sdpa.txt" 2>/dev/null | grep -iE "error|unsupported" | head -5
printf '%s\n' "${summary[@]}"
cat "$R/table.txt" 2>/dev/null
