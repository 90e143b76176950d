#!/bin/bash
# The head-dim sweep of issue 21's CPU bar, one thread, in cache (B = 1, H = 2, S = 512), on this machine:
# the kernel before a session (BASE, a perf example) and after (NEW), interleaved; each line is one process's
# fastest of 50 calls, pinned to CPU 1 with address randomisation off (this VM's speed moves by up to 1.6x
# between processes; the fastest of several is the figure that repeats). Session 12: c07b335 against
# e3330d6, the defaults below; session 13: e0acc44 against 3a09fc7 with DTS="f16 bf16" (and PASSES="5 6 7 8
# 9 10" SIMDS=avx512 DTS=f16 once more, the host's load having moved during the first four).
BASE=${BASE:?perf example before}; NEW=${NEW:?perf example after}
for pass in ${PASSES:-1 2 3 4}; do for simd in ${SIMDS:-avx512 avx2}; do for dt in ${DTS:-f32 bf16}; do
 for dd in 32 40 64 80 96 128 160 192 256 192,128 512; do for b in base new; do
  bin=$BASE; [ $b = new ] && bin=$NEW
  REPS=50 KERNELS=fa2 taskset -c 1 setarch -R $bin 1,2,2,512,512,$dd none $dt 1 $simd | awk -v t="$pass $b $simd $dt $dd" '/min/{print t, $5}'
done; done; done; done; done
