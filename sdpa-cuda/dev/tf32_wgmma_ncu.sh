#!/bin/bash
# Nsight Compute on the wgmma TF32 kernel at B=16, H=16, S=1024, D=128, causal (issue 4's weakest point), after
# `cargo xtask gpu-bundle` (carry gpu-bundle):   OUT=$OUT bash sdpa-cuda/dev/tf32_wgmma_ncu.sh
# Profiles the second launch (the first is the reference check's) with the full section set and per-instruction
# sampling, then prints the headline metrics, the warp-stall breakdown and the SASS instructions with the most
# stall samples (where the consumer and producer warps wait). $OUT/wg.ncu-rep holds the report.
export CUDA_HOME=/usr/local/cuda SDPA_REQUIRE_GPU=1 SDPA_CUDA_CACHE=/tmp/ncu-cache
B=gpu-bundle; P=sdpa-cuda/dev/tf32_wgmma_ncu_points.json
timeout 300 $B/cuda_kernels --points $P --out /tmp/warm.json --warmup 0 --reps 1 > /tmp/warm.log 2>&1 || tail -3 /tmp/warm.log
timeout 300 ncu --set full --import-source no --clock-control none -k regex:tf32wg --launch-skip 1 --launch-count 1 \
  -o $OUT/wg -f $B/cuda_kernels --points $P --out /tmp/prof.json --warmup 1 --reps 1 > /tmp/ncu.log 2>&1 || tail -5 /tmp/ncu.log
ncu -i $OUT/wg.ncu-rep --page details --csv > $OUT/details.csv 2>/dev/null
ncu -i $OUT/wg.ncu-rep --page source --csv --print-source sass > $OUT/source.csv 2>$OUT/source.err || head -3 $OUT/source.err
python3 - <<'PY'
import csv, os, collections
O = os.environ['OUT']
rows = list(csv.DictReader(open(f'{O}/details.csv')))
want = ('Duration', 'Compute (SM) Throughput', 'Memory Throughput', 'DRAM Throughput', 'L2 Hit Rate', 'Registers Per Thread',
        'Executed Ipc Active', 'Issue Slots Busy', 'Warp Cycles Per Issued Instruction', 'Achieved Occupancy',
        'Shared Memory Configuration Size', 'L1/TEX Hit Rate', 'Mem Pipes Busy', 'Max Bandwidth')
for r in rows:
    if r.get('Metric Name') in want:
        print(f"{r['Section Name'][:28]:28} {r['Metric Name'][:40]:40} {r['Metric Value']:>12} {r['Metric Unit']}")
for r in rows:  # rule messages naming the biggest stalls and pipes
    if r.get('Rule Name') and ('Stall' in r.get('Rule Description', '') or 'pipe' in r.get('Rule Description', '').lower()):
        print('rule', r['Rule Name'], '|', r['Rule Description'][:300])
try:
    src = list(csv.reader(open(f'{O}/source.csv')))
except Exception as e:
    print('no source page', e); src = []
if src:
    hdr = src[0]; print('source columns:', hdr[:40])
    idx = {h: i for i, h in enumerate(hdr)}
    key = next((h for h in hdr if h.startswith('Warp Stall Sampling (All')), None)
    stall_cols = [h for h in hdr if h.startswith('stall_') or h.startswith('Stall')]
    if key:
        body = [r for r in src[1:] if len(r) == len(hdr)]
        num = lambda x: float(x.replace(',', '') or 0)
        tot = sum(num(r[idx[key]]) for r in body) or 1
        body.sort(key=lambda r: -num(r[idx[key]]))
        for r in body[:40]:
            print(f"{100*num(r[idx[key]])/tot:5.1f}% {r[idx.get('Address', 0)]:>8} {r[idx.get('Source', 1)][:70]:70}",
                  ' '.join(f"{h}={r[idx[h]]}" for h in stall_cols if num(r[idx[h]]) > 0.1 * num(r[idx[key]]))[:200])
PY
