#!/bin/bash
# Session 13's CPU A/B on this session's machine (Intel Xeon VM, AVX-512 with avx512_bf16/fp16, no AMX):
# the perf example of e0acc44 (BASE) against this session's (NEW), one thread, in cache (B = 1, H = 2,
# S = 512, no mask), f16 and bf16 on the AVX-512 and AVX2 paths (forced), interleaved; each line is one
# process's fastest of 50 calls in GFLOP/s, pinned to CPU 1 with address randomisation off.
#   BASE=/tmp/perf-e0 NEW=/tmp/perf-s13 bash bench/studies/session13/headdims-1t.sh > headdims-1t.txt
BASE=${BASE:?perf example before}; NEW=${NEW:?perf example after}
for pass in 1 2 3 4; do for simd in avx512 avx2; do for dt in f16 bf16; do
 for dd in 32 40 64 80 96 128 160 192 256 192,128 512; do for b in base new; do
  bin=$BASE; [ $b = new ] && bin=$NEW
  REPS=50 KERNELS=fa2 taskset -c 1 setarch -R $bin 1,2,2,512,512,$dd none $dt 1 $simd | awk -v t="$pass $b $simd $dt $dd" '/min/{print t, $5}'
done; done; done; done; done
