#!/bin/bash
# Device call for the wgmma TF32 kernel (kernels/tf32_wgmma.cu), after `cargo xtask gpu-bundle` (carry
# gpu-bundle):
#   OUT=$OUT bash sdpa-cuda/dev/tf32_wgmma_run.sh [tests] [sanitize] [ab]      (no stage named: all three)
# tests:    tf32_kernels with the wgmma kernel (default) and with SDPA_TF32_WGMMA=0 (the mma.sync kernel),
#           and gpu_kernels, at the same time;
# sanitize: memcheck and racecheck on small D = 128 / 80 plain-TF32 shapes (the wgmma kernel);
# ab:       the same `cuda_kernels` binary with SDPA_TF32_WGMMA=0 (mma) and without (wg), three alternating
#           rounds of dev/tf32_wgmma_points.json, and PyTorch's f32 SDPA (TF32 off, as issue 4 asks) timed
#           with do_bench in the same call. Prints a table; $OUT/ab.json holds every record.
#           EXTRA=path/to/cuda_kernels adds a third variant (`x`, run with SDPA_TF32_WGMMA=${EXTRA_WG:-0}),
#           EXTRA2 a fourth (`y`, SDPA_TF32_WGMMA=${EXTRA2_WG:-0}).
#           POINTS=file replaces dev/tf32_wgmma_points.json (dev/tf32_mma_points.json: split TF32 and D = 64,
#           the mma.sync kernel's points, where `mma` and `wg` run the same kernel).
export CUDA_HOME=/usr/local/cuda SDPA_REQUIRE_GPU=1
B=gpu-bundle; P=${POINTS:-sdpa-cuda/dev/tf32_wgmma_points.json}; L=/tmp/wg-logs; mkdir -p "$L"
stages="${*:-tests sanitize ab}"
want() { [[ " $stages " == *" $1 "* ]]; }
t0=$(date +%s)
# Warm both module caches for the timing binary while the tests run.
VARS="mma wg"; [ -n "${EXTRA:-}" ] && VARS="$VARS x"; [ -n "${EXTRA2:-}" ] && VARS="$VARS y"
bin() { case $1 in x) echo $EXTRA;; y) echo $EXTRA2;; *) echo $B/cuda_kernels;; esac; }
flag() { case $1 in mma) echo 0;; wg) echo 1;; x) echo ${EXTRA_WG:-0};; y) echo ${EXTRA2_WG:-0};; esac; }
for v in $VARS; do
  ( SDPA_TF32_WGMMA=$(flag $v) SDPA_CUDA_CACHE=/tmp/cache-$v timeout 300 $(bin $v) --points $P --out $L/warm-$v.json \
      --warmup 0 --reps 1 > $L/warm-$v.log 2>&1 ) &
done
if want tests; then
  ( SDPA_CUDA_CACHE=/tmp/cache-wg timeout 500 $B/tests/tf32_kernels > $L/tf32-wg.log 2>&1; echo "tf32_kernels(wgmma) rc=$? $(grep '^test result' $L/tf32-wg.log)" > $L/tf32-wg.rc ) &
  ( SDPA_TF32_WGMMA=0 SDPA_CUDA_CACHE=/tmp/cache-mma timeout 500 $B/tests/tf32_kernels > $L/tf32-mma.log 2>&1; echo "tf32_kernels(mma.sync) rc=$? $(grep '^test result' $L/tf32-mma.log)" > $L/tf32-mma.rc ) &
  ( SDPA_CUDA_CACHE=/tmp/cache-gk timeout 500 $B/tests/gpu_kernels > $L/gpu_kernels.log 2>&1; echo "gpu_kernels rc=$? $(grep '^test result' $L/gpu_kernels.log)" > $L/gpu_kernels.rc ) &
fi
wait
if want tests; then
  cat $L/*.rc
  grep -h "cases," $L/tf32-*.log
  for f in tf32-wg tf32-mma gpu_kernels; do grep -A12 "^failures:" $L/$f.log | head -16 | cut -c1-400; done
fi
echo "tests took $(( $(date +%s) - t0 )) s"
if want sanitize; then
  export SDPA_CUDA_CACHE=/tmp/cache-wg
  for shape in "1,2,1,70,90,128 none" "1,2,1,70,200,128 causal-br" "1,4,2,130,300,80 causal" "1,2,1,300,300,128 causal" "2,70,70,256,256,128 causal"; do
    read -r sh mask <<< "$shape"
    for tool in memcheck racecheck; do
      r=$(timeout 120 compute-sanitizer --tool $tool --error-exitcode 3 $B/sdpa run --backend cuda --kernel fa2 \
          --dtype f32 --f32-math tf32 --shape $sh --mask $mask --warmup 0 --reps 1 --check 2>&1 |
          grep -E "ERROR SUMMARY|RACECHECK SUMMARY|check|rel_err|error" | head -3 | tr '\n' ' ')
      echo "$tool $sh $mask: $r"
    done
  done
fi
if want ab; then
  for round in 1 2 3; do for v in $VARS; do
    SDPA_TF32_WGMMA=$(flag $v) SDPA_CUDA_CACHE=/tmp/cache-$v timeout 150 $(bin $v) --points $P --out $L/$v$round.json \
      --warmup 10 --reps 50 > $L/$v$round.log 2>&1 || echo "$v $round failed: $(tail -2 $L/$v$round.log)"
  done; done
  L=$L python3 - <<'PY' | tee $OUT/ab.txt
import json, os, torch, torch.nn.functional as F
from triton.testing import do_bench
L, O = os.environ['L'], os.environ['OUT']
runs = {v: [json.load(open(f'{L}/{v}{i}.json')) for i in (1, 2, 3)] for v in ('mma', 'wg', 'x', 'y')
        if os.path.exists(f'{L}/{v}1.json')}
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
rows = []
print(f"{'B':>2} {'Hq/Hkv':>6} {'S':>5} {'D':>4} {'mask':6} {'mma.sync ms (3)':>21} {'wgmma ms (3)':>21} {'torch ms (3)':>21} "
      f"{'wg/mma':>6} {'x torch mma':>11} {'x torch wg':>10} {'TF wg':>6} {'err mma':>8} {'err wg':>8} ok {'x ms (3)':>21} {'x/mma':>5}")
for i, r in enumerate(runs['mma'][0]):
    a = [x[i]['median_ms'] for x in runs['mma']]; w = [x[i]['median_ms'] for x in runs['wg']]
    ok = all(x[i]['check_pass'] for v in runs for x in runs[v])
    g = torch.Generator(device='cuda').manual_seed(0)
    mk = lambda h, s: (torch.rand(r['b'], h, s, r['d'], device='cuda', generator=g) * 2 - 1) * 3 ** 0.5
    q, k, v = mk(r['hq'], r['sq']), mk(r['hkv'], r['sk']), mk(r['hkv'], r['sk'])
    causal = r['mask'] == 'causal'
    fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=r['hq'] != r['hkv'])
    t = [do_bench(fn, warmup=25, rep=100, return_mode='median') for _ in range(3)]
    del q, k, v; torch.cuda.empty_cache()
    f = lambda xs: '/'.join(f'{x:.3f}' for x in xs)
    med = lambda xs: sorted(xs)[1]
    row = dict(point=r, mma_ms=a, wg_ms=w, torch_ms=t, mma_err=runs['mma'][0][i]['rel_err'], wg_err=runs['wg'][0][i]['rel_err'],
               wg_tflops=runs['wg'][1][i]['tflops'], mma_ran=runs['mma'][0][i].get('kernel_ran'), ok=ok)
    rows.append(row)
    print(f"{r['b']:>2} {r['hq']:>3}/{r['hkv']:<2} {r['sq']:>5} {r['d']:>4} {r['mask']:6} {f(a):>21} {f(w):>21} {f(t):>21} "
          + f"{med(w)/med(a):6.3f} {med(t)/med(a):11.2f} {med(t)/med(w):10.2f} {row['wg_tflops']:6.1f} {row['mma_err']:8.1e} {row['wg_err']:8.1e} {ok}"
          + (f" {f(xs):>21} {med(xs)/med(a):5.3f}" if (xs := [x[i]['median_ms'] for x in runs.get('x', [])]) else '')
          + (f" y {f(ys)} {med(ys)/med(a):5.3f}" if (ys := [x[i]['median_ms'] for x in runs.get('y', [])]) else ''))
    row['x_ms'] = xs
    row['y_ms'] = ys
json.dump(dict(rows=rows, mma=runs['mma'], wg=runs['wg'], x=runs.get('x'), y=runs.get('y'), device=torch.cuda.get_device_name(0), torch=torch.__version__),
          open(f'{O}/ab.json', 'w'), indent=1)
PY
fi
tar -czf $OUT/logs.tgz -C $L .
echo "all done at $(( $(date +%s) - t0 )) s"
