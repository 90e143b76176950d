#!/usr/bin/env bash
# Issue 21's decoding at every head-dim class, in one device call: the kernel cache warmed on every core, then
# the splitkv decoding tests and compute-sanitizer memcheck + racecheck on one shape per changed path (TMA at
# a padded class and at MLA's 192/128) side by side, then the timings against PyTorch and the copy probe
# (decode_classes_bench.py: the default build, and the cp.async path the padded classes took before), one
# short ncu of one launch, and a table. Every stage has its own time limit, cut to what is left of DEADLINE
# seconds (default 185), so that the table prints and the archive is written inside the call's limit.
#   BUNDLE=target-dec/gpu-bundle OUT=$OUT bash target-dec/gpu-bundle/decode_classes_run.sh [--no-ncu] [bench args...]
# (after `cargo xtask gpu-bundle --out .../gpu-bundle` with this script and decode_classes_bench.py copied in;
# run from a checkout whose sdpa-cuda/dev holds sdpa_dev.py)
set -u
export SDPA_REQUIRE_GPU=1 SDPA_CUDA_CACHE=/tmp/sdpa-cache CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
B="${BUNDLE:-target-dec/gpu-bundle}"
ncu_on=1
if [ "${1:-}" = "--no-ncu" ]; then ncu_on=0; shift; fi
mkdir -p "$OUT/t"
t0=$(date +%s)
stamp() { echo "== $1 at $(( $(date +%s) - t0 ))s"; }
# cap N: N seconds, or what is left before the deadline (less a reserve for the archive) if that is less.
cap() { local left=$(( ${DEADLINE:-185} - ($(date +%s) - t0) )); echo $(( $1 < left ? $1 : (left > 1 ? left : 1) )); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader

# The test's shapes, the sanitizer shapes and the timed shapes (every program they need, both dtypes).
shapes="2,32,8,1,4097,80;1,8,1,3,1000,80;3,4,4,1,777,40;1,8,8,2,2500,32;1,32,8,1,20011,192,128;2,16,16,1,3001,192,128"
shapes="$shapes;2,8,2,1,4000,192;1,8,2,2,9000,160;1,4,1,1,5003,224;1,4,1,3,6000,248;8,32,32,1,4096,80;1,32,8,1,32768,80"
shapes="$shapes;8,32,32,1,4096,192,128;1,32,8,1,32768,192,128;8,32,32,1,4096,128;1,32,8,1,32768,128"
shapes="$shapes;1,16,2,2,3000,96;8,32,32,1,4096,96;1,32,8,1,32768,96"
# The three warm-ups side by side (each compiles on every core).
( timeout $(cap 60) $B/sdpa warmup --backend cuda --kernel splitkv --dtype f16,bf16 --mask none,causal --shape "$shapes" \
  > "$OUT/t/warmup.log" 2>&1; echo "warmup rc=$?" >> "$OUT/t/rc" ) &
( SDPA_SPLITKV_LOAD=cp.async timeout $(cap 60) $B/sdpa warmup --backend cuda --kernel splitkv --dtype f16,bf16 \
  --mask none,causal --shape "$shapes" > "$OUT/t/warmup-cpasync.log" 2>&1
  echo "warmup cp.async rc=$?" >> "$OUT/t/rc" ) &
( SDPA_SPLITKV_LOAD=bulk timeout $(cap 60) $B/sdpa warmup --backend cuda --kernel splitkv --dtype bf16 --mask none \
  --shape "1,32,8,1,32768,96" > "$OUT/t/warmup-bulk.log" 2>&1; echo "warmup bulk rc=$?" >> "$OUT/t/rc" ) &
wait
tail -2 "$OUT/t/warmup.log"
stamp "warm"

# Tests and sanitizers side by side (correctness only; the timings run alone afterwards).
( timeout $(cap 80) $B/tests/fa2_kernels splitkv_decodes_every_head_dim_class tma_maps_describe_both_layouts \
    repeated_splitkv_calls_reuse_the_kept_scratch > "$OUT/t/tests.log" 2>&1; echo "fa2_kernels (decode) rc=$?" >> "$OUT/t/rc" ) &
( SDPA_SPLITKV_LOAD=cp.async timeout $(cap 80) $B/tests/fa2_kernels splitkv_decodes_every_head_dim_class \
    > "$OUT/t/tests-cpasync.log" 2>&1; echo "fa2_kernels (decode, cp.async) rc=$?" >> "$OUT/t/rc" ) &
san() {  # tool, shape, mask[, load path forced]
  local log="$OUT/t/san-$1-${2//,/x}-$3${4:+-$4}.log"
  SDPA_SPLITKV_LOAD="${4:-tma}" timeout $(cap 80) compute-sanitizer --tool "$1" --error-exitcode 3 $B/sdpa run \
    --backend cuda --kernel splitkv --dtype bf16 --shape "$2" --mask "$3" --warmup 0 --reps 1 --check > "$log" 2>&1
  echo "$1 $2 $3 ${4:-} rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)" >> "$OUT/t/rc"
}
for tool in memcheck racecheck; do
  san $tool 1,32,8,1,5000,80 none &
  san $tool 1,16,4,1,3000,192,128 causal-br &
  san $tool 1,32,8,1,5000,80 none cp.async &
done
wait
cat "$OUT/t/rc"; grep -h "^test result\|panicked\|FAILED" "$OUT"/t/tests*.log | head -20
stamp "checks"

timeout $(cap 100) python3 "$B/decode_classes_bench.py" --bench "$B/cuda_kernels" --out "$OUT" \
  --variant cp.async=SDPA_SPLITKV_LOAD=cp.async --only cp.async:80 --only cp.async:192/128 "$@" \
  > "$OUT/bench.log" 2>&1; echo "bench rc=$?"
stamp "bench"

if [ $ncu_on = 1 ] && command -v ncu > /dev/null && [ "$(cap 100)" -ge 20 ]; then
  # One launch of B = 1, D = 80 (clean L2: ncu flushes its caches): DRAM throughput, occupancy, bytes.
  timeout $(cap 40) ncu --clock-control none -k regex:splitkv -c 1 --metrics \
gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__shared_mem_per_block_dynamic \
    $B/sdpa run --backend cuda --kernel splitkv --dtype bf16 --shape 1,32,8,1,32768,80 --warmup 0 --reps 1 \
    > "$OUT/ncu.log" 2>&1; echo "ncu rc=$?"
  grep -E 'splitkv_|gpu__time|dram__|warps_active|grid_size|shared_mem' "$OUT/ncu.log" | head -12
  stamp "ncu"
fi
sed -n '/^copy /,$p' "$OUT/bench.log"
# One file back: everything under $OUT in one archive.
tar czf /tmp/decode-classes.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/decode-classes.tgz "$OUT/"
