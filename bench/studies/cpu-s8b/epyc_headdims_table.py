"""The EPYC head-dim sweep of epyc-headdims-1t.sh as a table: per path and dtype, GFLOP/s (median of the passes
of the fastest-of-40 call, with the range) and the fraction of the better of D = 64 and 128 (bold below 0.85)."""
import sys, statistics, collections
g = collections.defaultdict(list)
for line in open(sys.argv[1]):
    p = line.split()
    if len(p) < 6 or not p[0].isdigit():
        continue
    g[(p[1], p[2], p[3])].append(float(p[5]))
dims = ["32", "40", "64", "80", "96", "128", "160", "192", "256", "192,128", "512"]
print("| path, dtype | " + " | ".join(d.replace(",", "/") for d in dims) + " |")
print("| --- |" + " --- |" * len(dims))
for simd in ("avx512", "avx2"):
    for dt in ("f32", "bf16"):
        med = {d: statistics.median(g[(simd, dt, d)]) for d in dims}
        spread = {d: (min(g[(simd, dt, d)]), max(g[(simd, dt, d)])) for d in dims}
        ref = max(med["64"], med["128"])
        print(f"| {simd} {dt}: GFLOP/s (median of passes; range) | " + " | ".join(f"{med[d]:.0f} ({spread[d][0]:.0f}-{spread[d][1]:.0f})" for d in dims) + " |")
        print(f"| {simd} {dt}: of best(64, 128) | " + " | ".join(("**%.2f**" if med[d] / ref < 0.85 else "%.2f") % (med[d] / ref) for d in dims) + " |")
