#!/bin/bash
# PERF: the perf example of this commit (cargo build --release -p sdpa-cpu --example perf). Table: python3 epyc_headdims_table.py epyc-headdims-1t.txt
# One thread, in-cache shape 1,2,2,512,512,D(,Dv), fastest of 40 calls, 3 interleaved passes.
for pass in 1 2 3; do for simd in avx512 avx2; do for dt in f32 bf16; do
 for dd in 32 40 64 80 96 128 160 192 256 192,128 512; do
  REPS=40 KERNELS=fa2 ${PERF:-target/release/examples/perf} 1,2,2,512,512,$dd none $dt 1 $simd | awk -v t="$pass $simd $dt $dd" '/min/{print t, $2, $5, $NF=="that"?"":"", $(NF-4)}'
 done; done; done; done
