#!/bin/bash
# Assembles the device bundle of run.sh in /work/main/target-cpu/dev from this worktree's release builds
# (CARGO_TARGET_DIR=/work/main/target: cargo build --release -p sdpa-cli; the same with -p sdpa-cpu --example
# cpu_bench; cargo test --release -p sdpa-cpu --no-run > $TEST_LOG) and the base cpu_bench (main, 95a3e9e) at
# $BASE_BENCH.
set -e
W=$(cd "$(dirname "$0")/../../.." && pwd)
T=${CARGO_TARGET_DIR:-/work/main/target}/release
O=/work/main/target-cpu/dev
rm -rf $O; mkdir -p $O/bench/cpu
cp $T/sdpa $T/examples/cpu_bench $O/
cp ${BASE_BENCH:?} $O/cpu_bench_base
# The test binaries: the `Executable` lines of `cargo test --release -p sdpa-cpu --no-run` saved in $TEST_LOG.
for f in $(grep Executable ${TEST_LOG:?} | awk '{print $NF}' | tr -d '()'); do
  n=$(basename $f); cp $f $O/t_${n%-*}
done
cp $W/bench/studies/cpu-s8/run.sh $W/bench/studies/amx/{amx-cpu.json,amx-headdims.json,amx_table.py,pick.py} $O/
cp $W/bench/pytorch_sdpa.py $W/bench/sdpa_common.py $O/; cp $W/bench/pytorch_sdpa.py $W/bench/sdpa_common.py $O/bench/
cp $W/bench/cpu/pytorch_cpu_sdpa.py $O/bench/cpu/
git -C $W rev-parse --short HEAD > $O/COMMIT
strip $O/sdpa $O/cpu_bench $O/cpu_bench_base $O/t_* 2>/dev/null || true
du -sh $O
