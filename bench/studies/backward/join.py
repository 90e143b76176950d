"""Puts sdpa's backward (examples/backward_timing.rs) and PyTorch's (torch_bwd.py) side by side: reads JSON
lines from the files given, prints one row per point with the time ratios of the default tile (PyTorch's time
over ours: > 1 means sdpa is faster), then the median and minimum ratio of each sdpa tile timed to each PyTorch
backend (over the points that tile ran).

    python3 join.py sdpa.jsonl torch.jsonl
"""
import json
import statistics
import sys

recs = {}
for path in sys.argv[1:]:
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            if "ms" in r:
                recs[(r["impl"], r["d"], r["s"], r["causal"])] = r
points = sorted({k[1:] for k in recs})
print(f"{'D':>4} {'S':>6} {'causal':>6} {'sdpa ms':>8} {'TFLOPS':>7} {'flash ms':>8} {'x flash':>7} {'cudnn ms':>8} {'x cudnn':>7}  best tile (x flash)")
impls = sorted({k[0] for k in recs if k[0].startswith("sdpa")})
for d, s, c in points:
    ours = recs.get(("sdpa", d, s, c))
    row = f"{d:>4} {s:>6} {str(c):>6} "
    row += f"{ours['ms']:>8.3f} {ours['tflops']:>7.1f} " if ours else f"{'-':>8} {'-':>7} "
    for impl in ("flash", "cudnn"):
        t = recs.get((impl, d, s, c))
        if t and ours:
            row += f"{t['ms']:>8.3f} {t['ms'] / ours['ms']:>6.2f}x "
        else:
            row += f"{'-':>8} {'-':>7} "
    cands = [(recs[(i, d, s, c)]["ms"], i) for i in impls if (i, d, s, c) in recs]
    fl = recs.get(("flash", d, s, c))
    if cands and fl:
        ms, i = min(cands)
        row += f" {i} ({fl['ms'] / ms:.2f}x)"
    print(row)
for impl in impls:
    for ref in ("flash", "cudnn"):
        for d in sorted({p[0] for p in points}):
            xs = [recs[(ref, d, s, c)]["ms"] / recs[(impl, d, s, c)]["ms"]
                  for (dd, s, c) in points if dd == d and (impl, d, s, c) in recs and (ref, d, s, c) in recs]
            if xs:
                print(f"{impl} vs {ref} D={d}: median {statistics.median(xs):.2f}x, min {min(xs):.2f}x over {len(xs)} points")
