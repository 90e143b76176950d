#!/bin/bash
# Same-run A/B of two builds of the `cuda_kernels` driver on fa2 shapes, with the GPU tests and sanitizers of
# the newer one and PyTorch's default SDPA timed in the same call. Device (carry gpu-bundle and target-ab):
#   OUT=$OUT bash sdpa-cuda/dev/tiny_ab_run.sh
#       fa2's deep K/V ring (issue 4's tiny shapes): before = target-ab/new (a3dfc7e), after = gpu-bundle
#   OUT=$OUT PREV=target-ab/head/cuda_kernels POINTS=sdpa-cuda/dev/small2_ab_points.json \
#       SAN_SHAPES="1,34,34,256,300,64 causal;1,34,17,200,200,128 none" bash sdpa-cuda/dev/tiny_ab_run.sh
#       a 2-deep ring in the 1-deep small tile (not shipped): before = 772e194, after = that change
export CUDA_HOME=/usr/local/cuda SDPA_REQUIRE_GPU=1
B=gpu-bundle; P=${POINTS:-sdpa-cuda/dev/tiny_ab_points.json}; L=/tmp/ab-logs; mkdir -p $L
PREV=${PREV:-target-ab/new/cuda_kernels}
SAN_SHAPES=${SAN_SHAPES:-"1,2,1,70,300,64 causal;1,2,1,70,400,128 none;1,4,2,130,1000,96 causal-br"}
t0=$(date +%s)
SDPA_CUDA_CACHE=/tmp/cache-prev timeout 200 $PREV --points $P --out $L/warm-prev.json --warmup 0 --reps 1 > $L/warm-prev.log 2>&1 &
export SDPA_CUDA_CACHE=/tmp/cache-now
for t in fa2_kernels gpu_kernels; do
  ( timeout 420 $B/tests/$t > $L/$t.log 2>&1; echo "$t rc=$? $(grep '^test result' $L/$t.log)" > $L/$t.rc ) &
done
wait
cat $L/*.rc; for t in fa2_kernels gpu_kernels; do grep -A20 "^failures:" $L/$t.log | head -30 | cut -c1-300; done
echo "tests took $(( $(date +%s) - t0 )) s"
IFS=';' read -ra shapes <<< "$SAN_SHAPES"
for shape in "${shapes[@]}"; do
  read -r sh mask <<< "$shape"
  for tool in memcheck racecheck; do
    r=$(timeout 100 compute-sanitizer --tool $tool --error-exitcode 3 $B/sdpa run --backend cuda --kernel fa2 --dtype bf16 --shape $sh --mask $mask --warmup 0 --reps 1 --check 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|check" | tr '\n' ' ')
    echo "$tool $sh $mask: $r"
  done
done
for round in 1 2 3; do for v in prev now; do
  b=$PREV; [ $v = now ] && b=$B/cuda_kernels
  SDPA_CUDA_CACHE=/tmp/cache-$v timeout 100 $b --points $P --out $OUT/$v$round.json --warmup 20 --reps 100 > $L/$v$round.log 2>&1 || echo "$v $round failed"
done; done
python3 - <<'PY' | tee $OUT/ab.txt
import json, os, torch, torch.nn.functional as F
from triton.testing import do_bench
O = os.environ['OUT']
runs = {v: [json.load(open(f'{O}/{v}{i}.json')) for i in (1, 2, 3)] for v in ('prev', 'now')}
print(f"{'B':>2} {'H':>3} {'S':>5} {'D':>4} {'mask':7} {'prev us (3 rounds)':>24} {'now us (3 rounds)':>24} {'ran':10} {'torch us (3)':>20} {'now/prev':>8} {'x torch':>7} ok")
for i, r in enumerate(runs['prev'][0]):
    p = [x[i]['median_ms'] * 1e3 for x in runs['prev']]; n = [x[i]['median_ms'] * 1e3 for x in runs['now']]
    ok = all(x[i]['check_pass'] for v in runs for x in runs[v])
    q, k, v = [torch.randn(r['b'], r['hq'], r['sq'], r['d'], device='cuda', dtype=torch.bfloat16) for _ in range(3)]
    causal = r['mask'] == 'causal'
    t = [do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), warmup=25, rep=100, return_mode='median') * 1e3 for _ in range(3)]
    f = lambda xs: '/'.join(f'{x:.2f}' for x in xs)
    print(f"{r['b']:>2} {r['hq']:>3} {r['sq']:>5} {r['d']:>4} {r['mask']:7} {f(p):>24} {f(n):>24} {runs['now'][0][i].get('kernel_ran','?'):10} {f(t):>20} {min(n)/min(p):8.3f} {min(t)/min(n):7.3f} {ok}")
PY
tar -czf $OUT/logs.tgz -C $L .
echo "all done at $(( $(date +%s) - t0 )) s"
