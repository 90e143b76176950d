#!/usr/bin/env python3
"""Table of headdims-1t.txt: per path, dtype and kernel (base/new), the fastest process over the passes
(GFLOP/s) and its ratio to the better of D = 64 and D = 128 of the same kernel (issue 21's bar: 0.85).
Also reads session 13's lines (f16 and bf16)."""
import collections, sys
best = collections.defaultdict(float)
for line in open(sys.argv[1] if len(sys.argv) > 1 else "headdims-1t.txt"):
    _, b, simd, dt, dd, g = line.split()
    best[(simd, dt, b, dd)] = max(best[(simd, dt, b, dd)], float(g))
dims = ["32", "40", "64", "80", "96", "128", "160", "192", "256", "192,128", "512"]
print("| path, dtype, kernel | " + " | ".join(d.replace(",", "/") for d in dims) + " |")
print("| --- |" + " --- |" * len(dims))
for simd in ["avx512", "avx2"]:
    for dt in [t for t in ["f32", "f16", "bf16"] if any(k[1] == t for k in best)]:
        for b in ["base", "new"]:
            top = max(best[(simd, dt, b, "64")], best[(simd, dt, b, "128")])
            g = [best[(simd, dt, b, d)] for d in dims]
            print(f"| {simd} {dt} {b}: GFLOP/s | " + " | ".join(f"{x:.0f}" for x in g) + " |")
            print(f"| {simd} {dt} {b}: of best(64, 128) | "
                  + " | ".join(("**%.2f**" if x / top < 0.85 else "%.2f") % (x / top) for x in g) + " |")
