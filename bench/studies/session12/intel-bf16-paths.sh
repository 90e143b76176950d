#!/bin/bash
# bf16 on an Intel Xeon without AMX: the avx512-bf16 path (vdpbf16ps pairs) against avx512 (bf16 widened to
# f32 FMAs), same binary, interleaved, three passes; each line is one process's fastest of REPS calls.
# PERF: the perf example (cargo build --release -p sdpa-cpu --example perf). Table: the awk at the end.
PERF=${PERF:-target/release/examples/perf}
for pass in 1 2 3; do for sh in 1,8,8,1024,1024,64 1,8,8,1024,1024,128 1,4,4,2048,2048,128; do
 for m in none causal; do for p in avx512-bf16 avx512; do
  REPS=8 KERNELS=fa2 setarch -R $PERF $sh $m bf16 2 $p | awk -v t="$pass $sh $m $p" '/min/{print t, $2, $5}'
done; done; done; done
