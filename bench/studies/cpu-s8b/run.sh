#!/bin/bash
# Issue 21 (CPU), session 8, second call: the AMX tile rule against PyTorch, interleaved. Run from the
# repository root with the bundle carried in target-cpu2/dev (bundle.sh): bash target-cpu2/dev/run.sh
# Everything lands in /tmp/r, tarred into $OUT/cpu2.tgz after every stage.
D=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; mkdir -p $R
export PYTHONUNBUFFERED=1 SDPA_BENCH_COMMIT=$(cat $D/COMMIT)
chmod +x $D/cpu_bench $D/cpu_bench_base $D/t_* 2>/dev/null
T0=$(date +%s)
save() { tar czf $OUT/cpu2.tgz -C /tmp r; }
el() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $R/stages.txt; }
left() { echo $(( 185 - ($(date +%s) - T0) )); }
P="taskset -c 0,1"
PY="python3 $D/bench/cpu/pytorch_cpu_sdpa.py --ours $D/cpu_bench --simd amx --preset amx --torch-kernels fused --no-read-bw"

# 0. Host.
{ lscpu | grep -E "Model name|^CPU\(s\)|Thread|MHz|L1d|L2|L3"; nproc; uptime
  python3 -c 'import torch; print("torch", torch.__version__)'; } > $R/host.txt 2>&1
el host; cat $R/host.txt

# 1. Correctness, AMX required: tests/amx.rs with the 256-row items forced (real tiles), then every other
# sdpa-cpu suite at its defaults (each runs every path the host supports, amx first).
tst() { s=$(date +%s); env SDPA_REQUIRE_AMX=1 SDPA_CPU_SIMD=amx $3 timeout $2 $D/t_$1 -q > $R/t_$1$4.log 2>&1; rc=$?
  echo "t_$1$4 rc=$rc $(( $(date +%s) - s ))s $(grep -E 'test result|panicked|signal' $R/t_$1$4.log | head -2 | tr '\n' ' ')" >> $R/tests.txt; }
tst amx 30 SDPA_CPU_AMX_TILES=256x256 -256x256
for t in sdpa_cpu correctness nonfinite ragged_kernels semantics regression backward; do tst $t 25; done
el tests; cat $R/tests.txt; save

# 1b. Before/after of the AVX2 V copy (V rows 512 bytes apart read from an aligned copy), ours only, 2 threads
# pinned, interleaved: base = the binary of 3892807 (in place), new = this bundle's.
ab() { for rep in 1 2 3; do for b in base new; do
  bin=$D/cpu_bench; [ $b = base ] && bin=$D/cpu_bench_base
  env SDPA_CPU_SIMD=$1 $P timeout 20 $bin --shape $2 --mask none --dtype f32 --threads 2 --warmup 1 --reps 5 \
    | python3 -c 'import json,sys; r=json.load(sys.stdin)[0]; print(sys.argv[1], round(r["time_ms"]["median"],3), round(r["time_ms"]["min"],3), round(r["tflops"]*1e3,1), "GFLOP/s")' "$1 $b $2"
done; done; }
{ ab avx2 1,8,8,1024,1024,128; ab avx2 1,8,8,1024,1024,120; } > $R/ab.txt 2>&1
el ab; cat $R/ab.txt; save

# 2. AMX against PyTorch (oneDNN on AMX), interleaved per case in each round (PyTorch, ours by the rule,
# ours with the other tile shape), 3 rounds. 2 threads pinned: the rule takes 256 x 256; the variant is the
# old default 128 x 256. 16 threads: the rule keeps 128 x 256; the variant forces 256 x 256.
$P timeout 90 $PY --threads 2 --rounds 3 --reps 6 --ours-variant 128x256:SDPA_CPU_AMX_TILES=128x256 \
  --out $R/amx-2t.json > $R/amx-2t.md 2> $R/amx-2t.log
el "amx 2t rc=$?"; save
timeout 40 $PY --threads 16 --rounds 3 --reps 10 --ours-variant 256x256:SDPA_CPU_AMX_TILES=256x256 \
  --out $R/amx-16t.json > $R/amx-16t.md 2> $R/amx-16t.log
el "amx 16t rc=$?"; save
python3 $D/table.py $R/amx-2t.json $R/amx-16t.json | tee $R/amx-table.md; save

# 3. Head dims (B = 1, H = 8, S = 1024, f32 and bf16) against PyTorch on the same ISA, 2 threads pinned, one
# round each, as far as the call's time allows (the runner writes its file only at its end): the AMX path
# (bf16 on tiles, f32 on the AVX-512 kernels), then forced AVX2.
hd() { if [ $(left) -ge 35 ]; then
  $P timeout $(( $(left) - 4 )) python3 $D/bench/cpu/pytorch_cpu_sdpa.py --ours $D/cpu_bench --simd $1 --threads 2 \
    --preset headdims --rounds 1 --reps 3 --torch-kernels fused --no-read-bw --out $R/$1-headdims.json \
    > $R/$1-headdims.md 2> $R/$1-headdims.log
  el "$1 headdims rc=$?"
  python3 $D/bench/cpu/pytorch_cpu_sdpa.py --render-sweep $R/$1-headdims.json > $R/$1-headdims-sweep.md 2>&1; save
else el "$1 headdims skipped"; fi; }
hd amx; hd avx2

echo "== tests"; cut -c1-110 $R/tests.txt
echo "== before/after (median ms, min ms, GFLOP/s)"; cat $R/ab.txt
echo "== amx"; cat $R/amx-table.md
for f in amx-headdims-sweep avx2-headdims-sweep; do echo "== $f"; cat $R/$f.md 2>/dev/null | cut -c1-90; done
el done; save
