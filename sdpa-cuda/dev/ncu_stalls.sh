#!/bin/bash
# Nsight Compute with per-instruction stall sampling on one launch of our kernels, after `cargo xtask gpu-bundle`
# (carry gpu-bundle):
#   OUT=$OUT bash sdpa-cuda/dev/ncu_stalls.sh NAME KERNEL_REGEX COMMAND...
# Runs COMMAND once without ncu (NVRTC compiles on a fresh machine), then under ncu (--set full, clocks as found),
# profiling the second launch whose name matches KERNEL_REGEX (the first is usually a check or warm-up call), and
# prints the headline metrics, the stall breakdown and the SASS instructions with the most stall samples.
# $OUT/NAME.ncu-rep keeps the report. Used so far:
#   tf32 wgmma, B=16 H=16 S=1024 D=128 causal:  tf32 tf32wg gpu-bundle/cuda_kernels --points
#       sdpa-cuda/dev/tf32_wgmma_ncu_points.json --out /tmp/p.json --warmup 1 --reps 1
#   decoding:  dec8 splitkv gpu-bundle/sdpa run --backend cuda --kernel splitkv --shape 8,32,32,1,4096,128 --warmup 1 --reps 1
export CUDA_HOME=/usr/local/cuda SDPA_REQUIRE_GPU=1 SDPA_CUDA_CACHE=/tmp/ncu-cache
N=$1; K=$2; shift 2
timeout 300 "$@" > /tmp/warm-$N.log 2>&1 || tail -3 /tmp/warm-$N.log
timeout 300 ncu --set full --import-source no --clock-control none -k regex:$K --launch-skip 1 --launch-count 1 \
  -o $OUT/$N -f "$@" > /tmp/ncu-$N.log 2>&1 || tail -5 /tmp/ncu-$N.log
ncu -i $OUT/$N.ncu-rep --page details --csv > /tmp/details-$N.csv 2>/dev/null
ncu -i $OUT/$N.ncu-rep --page source --csv --print-source sass > /tmp/source-$N.csv 2>/tmp/source-$N.err || head -3 /tmp/source-$N.err
N=$N python3 - <<'PY'
import csv, os, collections
N = os.environ['N']
num = lambda x: 0.0 if x in ('', '-') else float(x.replace(',', ''))
rows = list(csv.DictReader(open(f'/tmp/details-{N}.csv')))
want = ('Duration', 'Compute (SM) Throughput', 'Memory Throughput', 'DRAM Throughput', 'L2 Hit Rate', 'Registers Per Thread',
        'Executed Ipc Active', 'Issue Slots Busy', 'Warp Cycles Per Issued Instruction', 'Achieved Occupancy',
        'Max Bandwidth', 'Mem Pipes Busy')
for r in rows:
    if r.get('Metric Name') in want:
        print(f"{r['Section Name'][:28]:28} {r['Metric Name'][:40]:40} {r['Metric Value']:>12} {r['Metric Unit']}")
src = list(csv.reader(open(f'/tmp/source-{N}.csv')))
src = src[1:] if src and src[0] and src[0][0] == 'Kernel Name' else src  # first row names the kernel
if not src:
    raise SystemExit('no source page')
hdr, body = src[0], [r for r in src[1:] if len(r) == len(src[0])]
I = {h: i for i, h in enumerate(hdr)}
key = 'Warp Stall Sampling (All Samples)'
stalls = [h for h in hdr if h.startswith('stall_') and '(Not' not in h]
tot = sum(num(r[I[key]]) for r in body) or 1
agg = collections.Counter({h[6:]: sum(num(r[I[h]]) for r in body) for h in stalls})
print('stall samples:', int(tot), ', '.join(f'{k} {100 * v / tot:.1f}%' for k, v in agg.most_common(8)))
order = sorted(range(len(body)), key=lambda n: -num(body[n][I[key]]))
for n in order[:30]:
    r = body[n]
    why = ' '.join(f'{h[6:]}={int(num(r[I[h]]))}' for h in stalls if num(r[I[h]]) > 0.15 * num(r[I[key]]))
    print(f"{100 * num(r[I[key]]) / tot:5.1f}% #{n:5} x{r[I['Instructions Executed']]:>9} {r[I['Source']].strip()[:64]:64} {why}")
PY
