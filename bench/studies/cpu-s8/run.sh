#!/bin/bash
# Issue 21 (CPU), session 8: the one device call. Run from the repository root with the bundle carried in
# target-cpu/dev (bundle.sh): bash target-cpu/dev/run.sh
# Stages, most important first, each under its own timeout; everything lands in /tmp/r, tarred into
# $OUT/cpu.tgz after every stage.
D=$(cd "$(dirname "$0")" && pwd)
R=/tmp/r; mkdir -p $R
export PYTHONUNBUFFERED=1 SDPA_BENCH_COMMIT=$(cat $D/COMMIT)
chmod +x $D/sdpa $D/cpu_bench $D/cpu_bench_base $D/t_* 2>/dev/null
T0=$(date +%s)
save() { tar czf $OUT/cpu.tgz -C /tmp r; }
el() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $R/stages.txt; }
P="taskset -c 0,1"

# 0. Host.
{ lscpu | grep -E "Model name|^CPU\(s\)|Thread|MHz|L1d|L2"; nproc
  python3 -c 'import torch; print("torch", torch.__version__)'
  $D/sdpa devices 2>&1 | grep -Ei "simd|amx|cpu"; } > $R/host.txt 2>&1
el host; cat $R/host.txt | head -12

# 1. Correctness: every sdpa-cpu suite (each runs every supported path: amx, avx512-bf16, avx512, avx2,
# scalar), AMX required.
tst() { s=$(date +%s); SDPA_REQUIRE_AMX=1 SDPA_CPU_SIMD=amx timeout $2 $D/t_$1 -q > $R/t_$1.log 2>&1; rc=$?
  echo "t_$1 rc=$rc $(( $(date +%s) - s ))s $(grep -E 'test result|panicked|signal' $R/t_$1.log | head -2 | tr '\n' ' ')" >> $R/tests.txt; }
for t in amx sdpa_cpu correctness nonfinite ragged_kernels semantics regression backward; do tst $t 30; done
el tests; cat $R/tests.txt; save

# 2. Before/after, ours only, 2 pinned threads, interleaved: base = main 95a3e9e, new = this branch.
ab() { for rep in 1 2; do for b in base new; do
  bin=$D/cpu_bench; [ $b = base ] && bin=$D/cpu_bench_base
  env SDPA_CPU_SIMD=$1 $P timeout 20 $bin --shape $2 --mask none --dtype $3 --threads 2 --warmup 1 --reps $4 \
    | python3 -c 'import json,sys; r=json.load(sys.stdin)[0]; print(sys.argv[1], round(r["time_ms"]["median"],3), round(r["time_ms"]["min"],3), round(r["tflops"]*1e3,1), "GFLOP/s")' "$1 $b $2 $3"
done; done; }
{ ab avx2 1,8,8,1024,1024,64 f32 5; ab avx2 1,8,8,1024,1024,128 bf16 3; ab avx512 1,8,8,1024,1024,64 f32 5
  ab amx 1,16,16,4096,4096,128 bf16 3; ab amx 1,16,16,4096,4096,64 bf16 3; } > $R/ab.txt 2>&1
el ab; cat $R/ab.txt; save

# 3. AMX at 2 threads: phase shares (profiled: lfence'd laps, slower), then key-block/item shapes, ours only.
for dd in 128 64; do SDPA_CPU_AMX_PROFILE=1 SDPA_CPU_SIMD=amx $P timeout 15 $D/cpu_bench --shape 1,16,16,4096,4096,$dd \
  --mask none --dtype bf16 --threads 2 --warmup 0 --reps 1 2>&1 >/dev/null | tail -1 | sed "s/^/D=$dd: /"; done > $R/profile.txt
cat $R/profile.txt
B="$D/sdpa bench --pytorch-script $D/pytorch_sdpa.py --pytorch-kernels default --check-rows 32 --quiet"
picks=""
for t in 128x256 128x512 256x256 64x256; do
  SDPA_CPU_AMX_TILES=$t SDPA_CPU_SIMD=amx $P timeout 15 $B --spec $D/amx-cpu.json --threads 2 --no-pytorch --out $R/tiles-2t-$t.json > /dev/null 2>&1
  echo "tiles $t rc=$?"; picks="$picks $t=$R/tiles-2t-$t.json"
done
BEST=$(python3 $D/pick.py $picks 2> $R/pick-2t.txt); cat $R/pick-2t.txt; el "tiles (best at 2 threads: $BEST)"; save

# 4. AMX against PyTorch (its default CPU SDPA, oneDNN on AMX) in the same invocation: 16 threads with the
# default tiles; 2 threads with the default and, if another shape won stage 3, with that one as well.
s=$(date +%s); SDPA_CPU_SIMD=amx timeout 40 $B --spec $D/amx-cpu.json --threads 16 --with-pytorch --out $R/amx-16t.json > $R/a16.log 2>&1; el "amx 16t rc=$?"
SDPA_CPU_SIMD=amx $P timeout 45 $B --spec $D/amx-cpu.json --threads 2 --with-pytorch --out $R/amx-2t.json > $R/a2.log 2>&1; el "amx 2t rc=$?"
if [ -n "$BEST" ] && [ "$BEST" != 128x256 ]; then
  SDPA_CPU_AMX_TILES=$BEST SDPA_CPU_SIMD=amx $P timeout 45 $B --spec $D/amx-cpu.json --threads 2 --with-pytorch --out $R/amx-2t-$BEST.json > $R/a2b.log 2>&1; el "amx 2t $BEST rc=$?"
fi
python3 $D/amx_table.py $R/amx-16t.json $R/amx-2t.json $(ls $R/amx-2t-*x*.json 2>/dev/null | grep -v pytorch) | tee $R/amx-table.md; save

# 5. AVX2 prefill grid against PyTorch capped to AVX2, both pinned to cores 0,1, with the FMA peak probe.
$P timeout 85 python3 $D/bench/cpu/pytorch_cpu_sdpa.py --ours $D/cpu_bench --simd avx2 --threads 2 --preset prefill \
  --rounds 2 --reps 3 --torch-kernels fused --no-read-bw --out $R/avx2-prefill.json > $R/prefill.md 2> $R/prefill.log
el "avx2 prefill rc=$?"; tail -16 $R/prefill.md; save

# 6. Head dims, as far as the call's 240 s allow (each runner writes its file only at its end): AVX2 against
# PyTorch (S = 1024, one round), then AMX at 16 threads against PyTorch.
left() { echo $(( 228 - ($(date +%s) - T0) )); }
if [ $(left) -ge 45 ]; then
  $P timeout $(( $(left) - 12 )) python3 $D/bench/cpu/pytorch_cpu_sdpa.py --ours $D/cpu_bench --simd avx2 --threads 2 --preset headdims \
    --rounds 1 --reps 3 --torch-kernels fused --no-read-bw --out $R/avx2-headdims.json > $R/headdims.md 2> $R/headdims.log
  el "avx2 headdims rc=$?"; python3 $D/bench/cpu/pytorch_cpu_sdpa.py --render-sweep $R/avx2-headdims.json > $R/headdims-sweep.md 2>&1; save
else el "avx2 headdims skipped"; fi
if [ $(left) -ge 20 ]; then
  SDPA_CPU_SIMD=amx timeout $(( $(left) - 4 )) $B --spec $D/amx-headdims.json --threads 16 --with-pytorch --out $R/amx-headdims-16t.json > $R/ahd.log 2>&1
  el "amx headdims rc=$?"; python3 $D/amx_table.py $R/amx-headdims-16t.json > $R/amx-headdims.md 2>&1; save
else el "amx headdims skipped"; fi

# 7. The table.
echo "== tests"; cat $R/tests.txt | cut -c1-100
echo "== before/after (median ms, min ms, GFLOP/s)"; cat $R/ab.txt
echo "== amx"; cut -d'|' -f3,5,6,8,10 $R/amx-table.md
echo "== avx2 prefill"; tail -14 $R/prefill.md | cut -c1-220
el done
