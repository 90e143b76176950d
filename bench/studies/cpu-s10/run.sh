#!/bin/bash
# Issue 21 (CPU), session 10: the call session 8 prepared and never made (bench/studies/cpu-s8b/run.sh),
# without its AVX2 before/after (settled since, avx2.md): the AMX tile rule against PyTorch, interleaved, on
# the device machine's host (Intel Xeon, AMX). Run from the repository root with the folder of bundle.sh
# carried in target-cpu10/dev, with the GPU idle:
#   DEADLINE=170 bash target-cpu10/dev/run.sh
# Everything lands in /tmp/r, tarred into $OUT/cpu10.tgz after every stage.
D=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; mkdir -p $R
export PYTHONUNBUFFERED=1 SDPA_BENCH_COMMIT=$(cat $D/COMMIT)
chmod +x $D/cpu_bench $D/t_* 2>/dev/null
T0=$(date +%s); DEADLINE=${DEADLINE:-170}
save() { tar czf $OUT/cpu10.tgz -C /tmp r; }
el() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $R/stages.txt; }
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
P="taskset -c 0,1"
PY="python3 $D/bench/cpu/pytorch_cpu_sdpa.py --ours $D/cpu_bench --simd amx --preset amx --torch-kernels fused --no-read-bw"

# 0. Host.
{ lscpu | grep -E "Model name|^CPU\(s\)|Thread|MHz|L1d|L2|L3"; nproc; uptime
  python3 -c 'import torch; print("torch", torch.__version__)'; } > $R/host.txt 2>&1
el host; cat $R/host.txt

# 1. Correctness, AMX required: tests/amx.rs with the 256-row items forced (real tiles), then the other
# sdpa-cpu suites at their defaults (each runs every path the host supports, amx first).
tst() { s=$(date +%s); env SDPA_REQUIRE_AMX=1 SDPA_CPU_SIMD=amx $3 timeout $2 $D/t_$1 -q > $R/t_$1$4.log 2>&1; rc=$?
  echo "t_$1$4 rc=$rc $(( $(date +%s) - s ))s $(grep -E 'test result|panicked|signal' $R/t_$1$4.log | head -2 | tr '\n' ' ')" >> $R/tests.txt; }
tst amx 30 SDPA_CPU_AMX_TILES=256x256 -256x256
for t in sdpa_cpu correctness nonfinite ragged_kernels semantics regression backward; do tst $t 25; done
el tests; cat $R/tests.txt; save

# 2. AMX against PyTorch (oneDNN on AMX), interleaved per case in each round (PyTorch, ours by the rule,
# ours with the other tile shape), 3 rounds. 2 threads pinned: the rule takes 256 x 256; the variant is the
# earlier default 128 x 256. 16 threads: the rule keeps 128 x 256; the variant forces 256 x 256.
$P timeout 90 $PY --threads 2 --rounds 3 --reps 6 --ours-variant 128x256:SDPA_CPU_AMX_TILES=128x256 \
  --out $R/amx-2t.json > $R/amx-2t.md 2> $R/amx-2t.log
el "amx 2t rc=$?"; save
timeout 40 $PY --threads 16 --rounds 3 --reps 10 --ours-variant 256x256:SDPA_CPU_AMX_TILES=256x256 \
  --out $R/amx-16t.json > $R/amx-16t.md 2> $R/amx-16t.log
el "amx 16t rc=$?"; save
python3 $D/table.py $R/amx-2t.json $R/amx-16t.json > $R/amx-table.md 2>&1; save

echo "== tests"; cut -c1-110 $R/tests.txt
echo "== amx"; cat $R/amx-table.md
el done; save
