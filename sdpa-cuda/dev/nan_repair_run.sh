#!/bin/bash
# NaN-under-masked-keys repair, same-run A/B of three builds of the `cuda_kernels` driver, plus the GPU tests
# and sanitizers of the newest. Device: OUT=$OUT bash sdpa-cuda/dev/nan_repair_run.sh
# (carry gpu-bundle and target-ab). Builds, made here:
#   target-ab/old/cuda_kernels   fdd6bf9, before the repair
#   target-ab/new/cuda_kernels   a3dfc7e, the repair as first landed
#   gpu-bundle/                  `cargo xtask gpu-bundle` of the change under test
# Every build compiles its own NVRTC modules on a fresh machine (90+ s each): the three compile in parallel,
# with the tests of the newest, before anything is timed. The whole script takes about 12 minutes, more than
# one device call: run `nan_repair_run.sh tests` and then `nan_repair_run.sh ab` on the same (warm) machine,
# whose /tmp/cache-* keep the compiled modules. The device returns only a few files per call: the logs go
# into one tarball, $OUT/logs.tgz.
export CUDA_HOME=/usr/local/cuda SDPA_REQUIRE_GPU=1
B=gpu-bundle
P=sdpa-cuda/dev/nan_repair_points_ab.json
L=/tmp/nan-repair-logs; mkdir -p $L
stage=${1:-tests}
bin_of() { case $1 in old) echo target-ab/old/cuda_kernels ;; new) echo target-ab/new/cuda_kernels ;; *) echo $B/cuda_kernels ;; esac; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
t0=$(date +%s)
if [ "$stage" = tests ]; then
for v in old new; do
  SDPA_CUDA_CACHE=/tmp/cache-$v timeout 300 $(bin_of $v) --points $P --out $L/warm-$v.json --warmup 0 --reps 1 > $L/warm-$v.log 2>&1 &
done
export SDPA_CUDA_CACHE=/tmp/cache-light
timeout 300 $(bin_of light) --points $P --out $L/warm-light.json --warmup 0 --reps 1 > $L/warm-light.log 2>&1 &
for t in gpu_kernels fa2_kernels tf32_kernels unit_sdpa_cuda; do
  ( timeout 400 $B/tests/$t > $L/$t.log 2>&1; echo "$t rc=$? $(grep '^test result' $L/$t.log)" > $L/$t.rc ) &
done
wait
cat $L/*.rc
for t in gpu_kernels fa2_kernels tf32_kernels; do grep -A20 "^failures:" $L/$t.log | head -30 | cut -c1-300; done
echo "compile + tests took $(( $(date +%s) - t0 )) s"
for tool in memcheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 3 $B/tests/gpu_kernels --exact nan_under_masked_keys_stays_out_of_rows_that_do_not_see_them > $L/san_$tool.log 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' $L/san_$tool.log | tr '\n' ' ')"
done
fi
if [ "$stage" = ab ]; then
for round in 1 2; do
  for v in old new light; do
    SDPA_CUDA_CACHE=/tmp/cache-$v timeout 120 $(bin_of $v) --points $P --out $OUT/$v$round.json --warmup 5 --reps 20 > $L/$v$round.log 2>&1
    echo "$v round $round rc=$?"
  done
done
python3 - <<'PY'
import json, os
O = os.environ['OUT']
def load(n):
    try:
        return {(r['tag'], r['d'], r['sq'], r['sk'], r['mask'], r['dtype'], r['f32_math'], r['b']): r for r in json.load(open(f'{O}/{n}.json'))}
    except Exception as e:
        print('load', n, e); return {}
runs = {v: [load(f'{v}{i}') for i in (1, 2)] for v in ('old', 'new', 'light')}
def best(v, k):
    xs = [r[k]['median_ms'] for r in runs[v] if k in r and r[k].get('median_ms')]
    return min(xs) if xs else None
def ok(v, k):
    return all(r[k].get('check_pass') for r in runs[v] if k in r)
print(f"{'tag':8} {'D':>4} {'S':>6} {'mask':7} {'old ms':>9} {'new ms':>9} {'light ms':>9} {'new/old':>7} {'lt/old':>7} ok")
for k in runs['old'][0]:
    o, n, l = best('old', k), best('new', k), best('light', k)
    if None in (o, n, l): continue
    print(f"{k[0]:8} {k[1]:4} {k[3]:6} {k[4]:7} {o:9.4f} {n:9.4f} {l:9.4f} {n/o:7.3f} {l/o:7.3f} {ok('new', k) and ok('light', k)}")
PY
echo "bench done at $(( $(date +%s) - t0 )) s"
fi
tar -czf $OUT/logs.tgz -C $L .
echo "all done at $(( $(date +%s) - t0 )) s"
