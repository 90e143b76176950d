#!/bin/bash
# NaN-under-masked-keys repair: tests, A/B timing (old = cuda_kernels built at fdd6bf9 in target-ab/old/, new =
# gpu-bundle/), sanitizers. Device: OUT=$OUT bash sdpa-cuda/dev/nan_repair_run.sh (carry gpu-bundle, target-ab).
# The old binary compiles its own modules with NVRTC first (over 90 s on the H100 machine).
export CUDA_HOME=/usr/local/cuda SDPA_REQUIRE_GPU=1 SDPA_CUDA_CACHE=/tmp/sdpa-cache
B=gpu-bundle
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
t0=$(date +%s)
timeout 150 $B/tests/gpu_kernels > $OUT/gpu_kernels.log 2>&1; echo "gpu_kernels rc=$? $(grep '^test result' $OUT/gpu_kernels.log)"
grep -E "^test .*(FAILED|ok)$" $OUT/gpu_kernels.log | grep -v " ok$" | head; grep -A30 "^failures:" $OUT/gpu_kernels.log | head -40 | cut -c1-400
timeout 150 $B/tests/fa2_kernels > $OUT/fa2_kernels.log 2>&1; echo "fa2_kernels rc=$? $(grep '^test result' $OUT/fa2_kernels.log)"
timeout 60 $B/tests/tf32_kernels > $OUT/tf32_kernels.log 2>&1; echo "tf32_kernels rc=$? $(grep '^test result' $OUT/tf32_kernels.log)"
echo "tests took $(( $(date +%s) - t0 )) s"
for round in 1 2; do
  for v in old new; do
    bin=target-ab/old/cuda_kernels; [ $v = new ] && bin=$B/cuda_kernels
    timeout 240 $bin --points sdpa-cuda/dev/nan_repair_points.json --out $OUT/$v$round.json --warmup 5 --reps 25 > $OUT/$v$round.log 2>&1; echo "$v round $round rc=$?"
  done
done
python3 - <<'P'
import json, os
O=os.environ['OUT']
def load(n):
    try: return {(r['tag'],r['d'],r['sq'],r['sk'],r['mask'],r['dtype'],r['f32_math']):r for r in json.load(open(f'{O}/{n}.json'))}
    except Exception as e: print('load',n,e); return {}
o1,n1,o2,n2=[load(x) for x in ['old1','new1','old2','new2']]
print(f"{'tag':8} {'D':>4} {'S':>6} {'mask':7} {'old ms':>9} {'new ms':>9} {'new/old':>7} ok")
for k in o1:
    if k not in n1 or k not in o2 or k not in n2: continue
    om=min(o1[k]['median_ms'],o2[k]['median_ms']); nm=min(n1[k]['median_ms'],n2[k]['median_ms'])
    print(f"{k[0]:8} {k[1]:4} {k[3]:6} {k[4]:7} {om:9.4f} {nm:9.4f} {nm/om:7.3f} {n1[k]['check_pass'] and n2[k]['check_pass']}")
P
echo "bench done at $(( $(date +%s) - t0 )) s"
for tool in memcheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 3 $B/tests/gpu_kernels --exact nan_under_masked_keys_stays_out_of_rows_that_do_not_see_them > $OUT/san_$tool.log 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' $OUT/san_$tool.log | tr '\n' ' ')"
done
echo "all done at $(( $(date +%s) - t0 )) s"
