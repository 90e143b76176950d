#!/bin/bash
# Issue 21 (AVX2 path), one device call: our fa2 against PyTorch forced to AVX2 on two pinned cores of the
# device host's Xeon, the head-dim sweep on AVX2 and AVX-512, and the commit before against this one.
# Run from the repository root: bash target-avx2/dev/run.sh
D=$(cd "$(dirname "$0")" && pwd)
export PYTHONUNBUFFERED=1 SDPA_BENCH_COMMIT=$(cat $D/COMMIT)
CPUS=0,1
lscpu | grep -E "Model name|^CPU\(s\)|Thread|Flags" | cut -c1-200 > $OUT/host.txt
for c in 0 1; do echo "cpu$c siblings $(cat /sys/devices/system/cpu/cpu$c/topology/thread_siblings_list)" >> $OUT/host.txt; done
python3 -c 'import torch; print("torch", torch.__version__)' >> $OUT/host.txt
cat $OUT/host.txt
T="taskset -c $CPUS"
# 1. AVX2 prefill grid against PyTorch (ATen/oneDNN/MKL capped at AVX2).
$T python3 $D/bench/cpu/pytorch_cpu_sdpa.py --ours $D/cpu_bench --simd avx2 --threads 2 --preset prefill \
  --rounds 2 --reps 3 --torch-kernels fused --no-read-bw --out $OUT/dev-prefill-avx2.json > $OUT/prefill.md 2>$OUT/prefill.log
tail -16 $OUT/prefill.md
# 2. Head-dim sweep on AVX2 against PyTorch.
$T python3 $D/bench/cpu/pytorch_cpu_sdpa.py --ours $D/cpu_bench --simd avx2 --threads 2 --preset headdims \
  --rounds 2 --reps 3 --torch-kernels fused --no-read-bw --out $OUT/dev-headdims-avx2.json > $OUT/headdims.md 2>$OUT/headdims.log
tail -3 $OUT/headdims.md
# 3. Ours only: before (base) / after on both paths at two shapes, AVX2's 48-row items at Sk = 4096 (b48)
# against the 96 rows this commit takes there, and the sweep on AVX-512.
{
for rep in 1 2; do
for simd in avx512 avx2; do
  for b in base new b48; do
    for s in 1,8,8,1024,1024,64 1,16,16,4096,4096,128; do
      [ $b = b48 ] && { [ $simd = avx512 ] || [ $s = 1,8,8,1024,1024,64 ]; } && continue
      SDPA_CPU_SIMD=$simd $T $D/cpu_bench_$b --shape $s --mask none --dtype f32 --threads 2 --warmup 1 --reps 3 | sed "s/^/$simd $b $s /"
    done
  done
done
done
for s in 1,8,8,1024,1024,32 1,8,8,1024,1024,40 1,8,8,1024,1024,64 1,8,8,1024,1024,80 1,8,8,1024,1024,96 1,8,8,1024,1024,128 1,8,8,1024,1024,160 1,8,8,1024,1024,192 1,8,8,1024,1024,256 1,8,8,1024,1024,192,128 1,8,8,1024,1024,512; do
  for dt in f32 bf16; do
    SDPA_CPU_SIMD=avx512 $T $D/cpu_bench --shape $s --mask none --dtype $dt --threads 2 --warmup 1 --reps 5 | sed "s/^/avx512 new $s /"
  done
done
} > $OUT/ours.txt 2>&1
SDPA_CPU_SIMD=avx512 $T $D/cpu_bench --fma-peak --threads 2 >> $OUT/ours.txt
SDPA_CPU_SIMD=avx2 $T $D/cpu_bench --fma-peak --threads 2 >> $OUT/ours.txt
python3 - $OUT/ours.txt <<'PY'
import json, sys
for line in open(sys.argv[1]):
    i = line.find("[")
    if i < 0: print(line.strip()); continue
    for r in json.loads(line[i:]):
        print(line[:i].strip(), r["dtype"], f'{r["time_ms"]["median"]:.2f} ms', f'{r["tflops"]*1e3:.0f} GFLOP/s')
PY
