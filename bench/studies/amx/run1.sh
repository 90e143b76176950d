#!/bin/bash
# Device call 1 (engineer D, AMX): diagnostics, correctness on the AMX path, first timings.
D=target-amx/dev
R=/tmp/r; mkdir -p $R
chmod +x $D/sdpa $D/t_* 2>/dev/null
export PYTHONUNBUFFERED=1
save() { tar czf $OUT/amx1.tgz -C /tmp r; }
{
echo "== host"; uname -a; nproc; lscpu | grep -E "Model name|Thread|Core|Socket|MHz|L2|L3|NUMA node0|Flags" | sed 's/Flags:.*\(amx[^ ]*\).*/Flags (amx): see below/'
grep -m1 "^flags" /proc/cpuinfo | tr ' ' '\n' | grep -E "amx|avx512_bf16|avx512_fp16|xsave" | tr '\n' ' '; echo
echo "== sdpa devices"; $D/sdpa devices
SDPA_CPU_SIMD=amx $D/sdpa devices | grep -E "simd path|amx"
} > $R/diag.txt 2>&1; cat $R/diag.txt; save
tst() { n=$(basename $1); s=$(date +%s); SDPA_REQUIRE_AMX=1 SDPA_CPU_SIMD=amx timeout $2 $1 -q > $R/$n.log 2>&1; rc=$?; echo "$n rc=$rc $(( $(date +%s) - s ))s $(grep -E 'test result|panicked|signal' $R/$n.log | head -3 | tr '\n' ' ')" | tee -a $R/tests.txt; }
tst $D/t_amx 40; tst $D/t_sdpa_cpu 20; save
B="$D/sdpa bench --spec $D/amx-cpu.json --pytorch-script $D/pytorch_sdpa.py --pytorch-kernels default --check-rows 32 --quiet"
s=$(date +%s); SDPA_CPU_SIMD=amx timeout 50 $B --threads 16 --with-pytorch --out $R/amx-16t.json > $R/b16.log 2>&1; echo "bench amx 16t rc=$? $(( $(date +%s) - s ))s"; save
s=$(date +%s); SDPA_CPU_SIMD=amx taskset -c 0,1 timeout 60 $B --threads 2 --with-pytorch --out $R/amx-2t.json > $R/b2.log 2>&1; echo "bench amx 2t rc=$? $(( $(date +%s) - s ))s"; save
python3 $D/amx_table.py $R/amx-16t.json $R/amx-2t.json 2>&1 | tee $R/table.txt
for t in correctness nonfinite ragged_kernels semantics regression; do tst $D/t_$t 25; done; save
s=$(date +%s); SDPA_CPU_SIMD=avx512-bf16 timeout 20 $B --threads 16 --no-pytorch --out $R/bf16dot-16t.json > $R/bb.log 2>&1; echo "bench avx512-bf16 16t rc=$? $(( $(date +%s) - s ))s"
for t in 256x64 128x128 64x64; do SDPA_CPU_AMX_TILES=$t SDPA_CPU_SIMD=amx timeout 15 $B --threads 16 --no-pytorch --out $R/amx-16t-$t.json > /dev/null 2>&1; echo "tiles $t rc=$?"; done
python3 $D/amx_table.py $R/*.json > $R/table-all.txt 2>&1; cat $R/table-all.txt; save
