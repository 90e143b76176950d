#!/usr/bin/env bash
# Device call for the shipped TF32 kernels (committed kernels/tf32.cu):
#   1. Rust tests: tests/tf32_kernels.rs (all), gpu_kernels.rs (tf32 filter), compute-sanitizer memcheck +
#      racecheck on sanitizer_small_cases;
#   2. the Rust path against PyTorch f32 SDPA, same run: dev/tf32_rust_bench.py over cuda_kernels, 3 rounds;
#   3. harness: shipped D = 128 tiles (tf32dev.so).
# Built here into $C: cuda_kernels, tf32_kernels, gpu_kernels (cargo, stripped), tf32dev.so (nvcc).
# The persistent-block experiment this script also ran (bench/studies/tf32/tf32-final-h100-run.log) was measured
# slower and removed; its kernel and steps are in git at b50d99c (dev/tf32_persist.cu, this script).
C=${C:-target-tf32/carry5}
OUT=${OUT:-/tmp/tf32-out}
W=/tmp/tf32-final; rm -rf $W; mkdir -p $W "$OUT"
export PATH=/usr/local/cuda/bin:$PATH CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} SDPA_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $W/env.txt 2>&1
"$C/tf32_kernels" --test-threads=1 --nocapture > $W/tests.log 2>&1; echo "tf32_kernels rc=$? $(grep '^test result' $W/tests.log)" >> $S
grep -E "cases|rel_err" $W/tests.log | cut -c1-200 >> $S
"$C/gpu_kernels" --test-threads=1 tf32 > $W/gpu_tf32.log 2>&1; echo "gpu_kernels tf32 rc=$? $(grep '^test result' $W/gpu_tf32.log)" >> $S
for tool in memcheck racecheck; do
  compute-sanitizer --tool $tool --error-exitcode 3 "$C/tf32_kernels" --exact sanitizer_small_cases > $W/san-$tool.log 2>&1
  echo "sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $W/san-$tool.log)" >> $S
done
python3 sdpa-cuda/dev/tf32_rust_bench.py --bench "$C/cuda_kernels" --rounds 3 --out "$OUT" > $W/rust_bench.log 2>&1
echo "rust bench rc=$?" >> $S; cat $W/rust_bench.log | tail -28 >> $S
B=sdpa-cuda/dev/tf32_bench.py
python3 $B --lib "$C/tf32dev.so" --bench --no-ceilings --dims 128 --out $W/h_ship > $W/h_ship.log 2>&1
for f in h_ship; do echo "== harness $f" >> $S; grep -E "^(f32|gqa)|^ +(tf32|split):" $W/$f.log | cut -c1-90 >> $S; done
tar czf "$OUT/logs.tgz" -C $W .
cat $S
