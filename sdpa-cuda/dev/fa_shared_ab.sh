#!/bin/bash
# A/B of the fa2/fa1m refactor (tile code shared in kernels/fa2_mma.cuh): old = cuda_kernels built at 8dfba13
# into target-ab/old/, new = gpu-bundle/ from `cargo xtask gpu-bundle`. Device: OUT=$OUT bash sdpa-cuda/dev/fa_shared_ab.sh
# (carry gpu-bundle and target-ab). Tests, sanitizer on four small shapes, then two alternating timing rounds.
export CUDA_HOME=/usr/local/cuda SDPA_REQUIRE_GPU=1 SDPA_CUDA_CACHE=/tmp/sdpa-cache
B=gpu-bundle
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
start=$(date +%s)
$B/tests/gpu_kernels > $OUT/gpu_kernels.log 2>&1; echo "gpu_kernels rc=$? $(grep '^test result' $OUT/gpu_kernels.log)"
$B/tests/fa2_kernels > $OUT/fa2_kernels.log 2>&1; echo "fa2_kernels rc=$? $(grep '^test result' $OUT/fa2_kernels.log)"
echo "tests took $(( $(date +%s) - start )) s"
for r in "fa1 bf16 1,2,1,70,90,64 causal-br" "fa1 bf16 1,2,2,70,90,128 none" "fa2 bf16 1,2,1,70,90,64 causal" "fa2 f16 2,4,2,200,333,128 causal-br"; do
  read -r k dt shape mask <<< "$r"
  $B/sdpa run --backend cuda --kernel $k --dtype $dt --shape $shape --mask $mask --warmup 0 --reps 1 > /dev/null 2>&1
  for tool in memcheck racecheck; do
    res=$(compute-sanitizer --tool $tool --error-exitcode 3 $B/sdpa run --backend cuda --kernel $k --dtype $dt --shape $shape --mask $mask --warmup 0 --reps 1 --check 2>&1 | grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' | tail -1)
    echo "$tool $r: $res"
  done
done
for round in 1 2; do
  for v in old new; do
    bin=target-ab/old/cuda_kernels; [ $v = new ] && bin=$B/cuda_kernels
    $bin --points sdpa-cuda/dev/fa_shared_ab_points.json --out $OUT/$v$round.json --warmup 5 --reps 25 > $OUT/$v$round.log 2>&1; echo "$v round $round rc=$?"
  done
done
python3 - <<'P'
import json, os
O=os.environ['OUT']
def load(n): return {(r['tag'],r['d'],r['sq'],r['mask'],r['dtype']):r for r in json.load(open(f'{O}/{n}.json'))}
o1,n1,o2,n2=[load(x) for x in ['old1','new1','old2','new2']]
print(f"{'tag':8} {'D':>4} {'S':>5} {'mask':7} {'old ms':>9} {'new ms':>9} {'new/old':>7} {'old err':>8} {'new err':>8} ok")
for k in o1:
    om=min(o1[k]['median_ms'],o2[k]['median_ms']); nm=min(n1[k]['median_ms'],n2[k]['median_ms'])
    print(f"{k[0]:8} {k[1]:4} {k[2]:5} {k[3]:7} {om:9.4f} {nm:9.4f} {nm/om:7.3f} {o1[k]['rel_err']:8.1e} {n1[k]['rel_err']:8.1e} {n1[k]['check_pass'] and n2[k]['check_pass']}")
P
