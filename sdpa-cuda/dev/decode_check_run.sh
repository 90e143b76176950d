#!/usr/bin/env bash
# The checks a splitkv change needs on the device, in one call (a subset of gpu-bundle/run-gpu.sh): the
# fa2_kernels tests on all three load paths, machinery and gpu_kernels in parallel, then compute-sanitizer
# memcheck and racecheck on five splitkv shapes (one block per row tile; 3 blocks per row tile on the TMA
# and bulk paths; cp.async with Sq > 1; 20 blocks per row tile). Prints rc lines and the sanitizer summaries.
#   OUT=$OUT bash sdpa-cuda/dev/decode_check_run.sh      (after `cargo xtask gpu-bundle`, carrying gpu-bundle)
set -u
export SDPA_REQUIRE_GPU=1 SDPA_CUDA_CACHE=/tmp/sdpa-cache CUDA_HOME=/usr/local/cuda
B=gpu-bundle
mkdir -p $OUT/t
# warm the module cache once (one process), so the parallel test binaries load instead of compiling
$B/sdpa run --backend cuda --kernel splitkv --dtype bf16 --shape 1,4,1,1,300,128 --warmup 0 --reps 1 > /dev/null 2>&1
( $B/tests/fa2_kernels > $OUT/t/fa2.log 2>&1; echo "fa2_kernels rc=$?" >> $OUT/t/rc ) &
( SDPA_SPLITKV_LOAD=bulk $B/tests/fa2_kernels > $OUT/t/fa2-bulk.log 2>&1; echo "fa2_kernels-bulk rc=$?" >> $OUT/t/rc ) &
( SDPA_SPLITKV_LOAD=cp.async $B/tests/fa2_kernels > $OUT/t/fa2-cpasync.log 2>&1; echo "fa2_kernels-cpasync rc=$?" >> $OUT/t/rc ) &
( $B/tests/machinery --test-threads=1 > $OUT/t/machinery.log 2>&1; echo "machinery rc=$?" >> $OUT/t/rc ) &
( $B/tests/gpu_kernels > $OUT/t/gpu_kernels.log 2>&1; echo "gpu_kernels rc=$?" >> $OUT/t/rc ) &
wait
cat $OUT/t/rc; grep -h "^test result" $OUT/t/*.log
: > $OUT/t/san.log
for tool in memcheck racecheck; do
  for r in "1,4,1,1,300,128 none" "1,32,8,1,5000,128 none" "1,32,8,1,5000,128 none SDPA_SPLITKV_LOAD=bulk" \
           "2,8,2,3,777,64 causal-br SDPA_SPLITKV_LOAD=cp.async" "1,2,1,1,40000,64 causal-br"; do
    read -r shape mask envs <<< "$r"
    env $envs $B/sdpa run --backend cuda --kernel splitkv --dtype bf16 --shape $shape --mask $mask --warmup 0 --reps 1 > /dev/null 2>&1
    log="$(env $envs compute-sanitizer --tool $tool --error-exitcode 3 $B/sdpa run --backend cuda --kernel splitkv --dtype bf16 --shape $shape --mask $mask --warmup 0 --reps 1 --check 2>&1)"
    rc=$?; echo "== $tool $r rc=$rc" >> $OUT/t/san.log; echo "$log" >> $OUT/t/san.log
    echo "$tool $r rc=$rc $(echo "$log" | grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' | tail -1)"
  done
done
