#!/bin/bash
# Interleaved in-cache A/B of `examples/perf.rs` binaries and environment variants on one pinned thread
# (bench/studies/session19/README.md; VARIANTS="name:binary:VAR=value;VAR2=value ..."): prints "pass variant dtype D GFLOP/s(min) %-of-one-thread-peak".
PASSES=${PASSES:-3}; DIMS=${DIMS:-"64 128"}; DT=${DT:-f32}; SHAPE=${SHAPE:-1,2,2,1024,1024}
for pass in $(seq $PASSES); do for dd in $DIMS; do for v in $VARIANTS; do
  name=${v%%:*}; rest=${v#*:}; bin=${rest%%:*}; envs=${rest#*:}
  env $(echo $envs | tr ';' ' ') REPS=${REPS:-20} KERNELS=fa2 taskset -c ${CORE:-1} setarch -R $bin $SHAPE,$dd ${MASK:-none} $DT 1 ${SIMD:-avx2} | awk -v t="$pass $name $DT $dd" '/min/{print t, $5, $(NF-5)}'
done; done; done
