#!/bin/bash
# Interleaved A/B over environment variants of one `perf` example binary (BIN, default /tmp/perf-tiles: the
# build with the throwaway TMP_* switches of README.md); prints "pass variant dtype D GFLOP/s(min)".
PASSES=${PASSES:-3}; DIMS=${DIMS:-"64 128"}; DTS=${DTS:-f32}; SHAPE=${SHAPE:-1,2,2,1024,1024}
for pass in $(seq $PASSES); do for dt in $DTS; do for dd in $DIMS; do for v in $VARIANTS; do
  env $(echo $v | tr ';' ' ') REPS=${REPS:-20} KERNELS=fa2 taskset -c 1 setarch -R ${BIN:-/tmp/perf-tiles} $SHAPE,$dd ${MASK:-none} $dt 1 avx2 | awk -v t="$pass $v $dt $dd" '/min/{print t, $5, $NF, $(NF-4)}'
done; done; done; done
