#!/bin/bash
# Device call 2 (engineer D, AMX): correctness of the revised kernel, tile choice, final table vs PyTorch.
D=target-amx/dev
R=/tmp/r; mkdir -p $R
chmod +x $D/sdpa $D/t_* 2>/dev/null
export PYTHONUNBUFFERED=1
save() { tar czf $OUT/amx2.tgz -C /tmp r; }
$D/sdpa devices > $R/diag.txt 2>&1; grep -E "simd path|amx" $R/diag.txt
tst() { n=$(basename $1); s=$(date +%s); SDPA_REQUIRE_AMX=1 SDPA_CPU_SIMD=amx timeout $2 $1 -q > $R/$n.log 2>&1; rc=$?; echo "$n rc=$rc $(( $(date +%s) - s ))s $(grep -E 'test result|panicked|signal' $R/$n.log | head -3 | tr '\n' ' ')" | tee -a $R/tests.txt; }
for t in amx sdpa_cpu correctness nonfinite ragged_kernels semantics regression; do tst $D/t_$t 30; done
tst $D/t_backward 20; save
B="$D/sdpa bench --pytorch-script $D/pytorch_sdpa.py --pytorch-kernels default --check-rows 32 --quiet"
picks=""
for t in default 128x256 256x128 64x128 256x256 128x64; do
  if [ $t = default ]; then e=""; else e="SDPA_CPU_AMX_TILES=$t"; fi
  env $e SDPA_CPU_SIMD=amx timeout 20 $B --spec $D/amx-cpu.json --threads 16 --no-pytorch --out $R/var16-$t.json > /dev/null 2>&1; echo "tiles $t rc=$?"
  picks="$picks $t=$R/var16-$t.json"
done
BEST=$(python3 $D/pick.py $picks 2> $R/pick.txt); cat $R/pick.txt; echo "best tiles: $BEST"; save
if [ "$BEST" = default ]; then E=""; else E="SDPA_CPU_AMX_TILES=$BEST"; fi
s=$(date +%s); env $E SDPA_CPU_SIMD=amx timeout 45 $B --spec $D/amx-cpu.json --threads 16 --with-pytorch --out $R/final-16t.json > $R/f16.log 2>&1; echo "final 16t rc=$? $(( $(date +%s) - s ))s"; save
s=$(date +%s); env $E SDPA_CPU_SIMD=amx taskset -c 0,1 timeout 60 $B --spec $D/amx-cpu.json --threads 2 --with-pytorch --out $R/final-2t.json > $R/f2.log 2>&1; echo "final 2t rc=$? $(( $(date +%s) - s ))s"; save
python3 $D/amx_table.py $R/final-16t.json $R/final-2t.json | tee $R/table.txt
s=$(date +%s); env $E SDPA_CPU_SIMD=amx timeout 60 $B --spec $D/amx-headdims.json --threads 16 --with-pytorch --out $R/headdims-16t.json > $R/hd.log 2>&1; echo "headdims 16t rc=$? $(( $(date +%s) - s ))s"
python3 $D/amx_table.py $R/headdims-16t.json | tee $R/table-hd.txt; save
