#!/bin/bash
# Assembles the device bundle of run.sh in /work/main/target-cpu2/dev from this worktree's release builds
# (CARGO_TARGET_DIR=/work/main/target: cargo build --release -p sdpa-cpu --example cpu_bench; cargo test
# --release -p sdpa-cpu --no-run > $TEST_LOG) and a base cpu_bench at $BASE_BENCH (commit 3892807: AVX2 reads
# every f32 V tile in place). The before/after of the tile rule is this bundle's binary with
# SDPA_CPU_AMX_TILES=128x256 (the previous default).
set -e
W=$(cd "$(dirname "$0")/../../.." && pwd)
T=${CARGO_TARGET_DIR:-/work/main/target}/release
O=/work/main/target-cpu2/dev
rm -rf $O; mkdir -p $O/bench/cpu
cp $T/examples/cpu_bench $O/
cp ${BASE_BENCH:?} $O/cpu_bench_base
# The test binaries: the `Executable` lines of `cargo test --release -p sdpa-cpu --no-run` saved in $TEST_LOG.
for f in $(grep Executable ${TEST_LOG:?} | awk '{print $NF}' | tr -d '()'); do
  n=$(basename $f); cp $f $O/t_${n%-*}
done
cp $W/bench/studies/cpu-s8b/run.sh $W/bench/studies/cpu-s8b/table.py $O/
cp $W/bench/pytorch_sdpa.py $W/bench/sdpa_common.py $O/bench/
cp $W/bench/cpu/pytorch_cpu_sdpa.py $O/bench/cpu/
git -C $W rev-parse --short HEAD > $O/COMMIT
strip $O/cpu_bench $O/cpu_bench_base $O/t_* 2>/dev/null || true
du -sh $O
