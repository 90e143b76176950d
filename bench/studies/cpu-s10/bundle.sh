#!/bin/bash
# Assembles the device folder of run.sh in /work/main/target-cpu10/dev from release builds in
# CARGO_TARGET_DIR (default /work/main/target-cpu):
#   cargo build --release -p sdpa-cpu --example cpu_bench
#   cargo test --release -p sdpa-cpu --no-run 2> $TEST_LOG
# then: TEST_LOG=... bash bench/studies/cpu-s10/bundle.sh
set -e
W=$(cd "$(dirname "$0")/../../.." && pwd)
T=${CARGO_TARGET_DIR:-/work/main/target-cpu}/release
O=/work/main/target-cpu10/dev
rm -rf $O; mkdir -p $O/bench/cpu
cp $T/examples/cpu_bench $O/
# The test binaries: the `Executable` lines cargo prints for `--no-run`, saved in $TEST_LOG.
for f in $(grep Executable ${TEST_LOG:?} | awk '{print $NF}' | tr -d '()'); do
  n=$(basename $f); cp $f $O/t_${n%-*}
done
cp $W/bench/studies/cpu-s10/run.sh $W/bench/studies/cpu-s8b/table.py $O/
cp $W/bench/pytorch_sdpa.py $W/bench/sdpa_common.py $O/bench/
cp $W/bench/cpu/pytorch_cpu_sdpa.py $O/bench/cpu/
git -C $W rev-parse --short HEAD > $O/COMMIT
strip $O/cpu_bench $O/t_* 2>/dev/null || true
du -sh $O
