"""Least-squares fit of time per score against head dim, t(D) = a + b·D (ns per score over all threads,
scores counted as a full Sq x Sk square, FLOPs per score 2·(D + Dv)), per kernel and mask, from a
head-dim sweep record of bench/cpu/pytorch_cpu_sdpa.py (D = Dv <= 256 only).

    python3 bench/studies/session14/headdim_fit.py bench/results/cpu/headdims-host-2t-bf16-amx-vs-avx512-s13.json
"""
import collections
import json
import sys

points = collections.defaultdict(list)
for rec in json.load(open(sys.argv[1])):
    sh = rec["shape"]
    if sh["d"] != sh["dv"] or sh["d"] > 256:
        continue
    gflops = rec["tflops"] * 1000
    points[(rec["backend"], rec["kernel"], rec["mask"])].append((sh["d"], 2 * (sh["d"] + sh["dv"]) / gflops))
for key, pts in sorted(points.items()):
    pts.sort()
    n = len(pts)
    mx = sum(d for d, _ in pts) / n
    my = sum(t for _, t in pts) / n
    b = sum((d - mx) * (t - my) for d, t in pts) / sum((d - mx) ** 2 for d, _ in pts)
    a = my - b * mx
    worst = max(abs(t - (a + b * d)) / t for d, t in pts)
    print(f"{' '.join(key):28} a = {a:.3f} ns, b = {b * 1000:.2f} ps per dim; fixed share at D = 128 "
          f"{a / (a + 128 * b):.0%}; worst residual {worst:.0%}")
