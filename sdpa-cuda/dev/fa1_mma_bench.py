"""Issue 4's `fa1` bf16 vs `unfused` bf16 points at S >= 2048 (as bench/gpu/bench_cuda.py builds them: B =
16384/S, H = 2048/D, D = 64 and 128, causal and not), timed through the shipped Rust path: the
`cuda_kernels` bench binary (NVRTC-compiled kernels, CUDA events after a 256 MB L2 flush, median of the reps,
an f64-reference check on 8 rows per point). For each point the three kernels run back to back in one
process (unfused, fa1, fa2) so the ratios compare kernels measured in the same run.

    python3 sdpa-cuda/dev/fa1_mma_bench.py --bench target-fa1/carry/A/cuda_kernels --label A [--kernels fa1]
Writes fa1_mma_bench_<LABEL>.json (the cuda_kernels records) under --out and prints a table.
"""
import argparse
import json
import os
import sys

from sdpa_dev import point, run_points

ap = argparse.ArgumentParser()
ap.add_argument("--bench", required=True)
ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
ap.add_argument("--label", default="run")
ap.add_argument("--reps", default="20")
ap.add_argument("--warmup", default="5")
ap.add_argument("--kernels", default="unfused,fa1,fa2", help="comma-separated, in run order per point")
ap.add_argument("--seqs", default="2048,4096,8192")
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)

kernels = args.kernels.split(",")
points = []
for d in (64, 128):
    for s in map(int, args.seqs.split(",")):
        for mask in ("none", "causal"):
            for k in kernels:
                points.append(point("fa1_vs_unfused", 16384 // s, 2048 // d, 2048 // d, s, s, d, "bf16",
                                    mask == "causal", k))
pts = os.path.join(args.out, f"points_{args.label}.json")
rec_path = os.path.join(args.out, f"fa1_mma_bench_{args.label}.json")
with open(pts, "w") as f:
    json.dump(points, f)
recs = run_points(args.bench, pts, rec_path, args.warmup, args.reps, on_error="none")
if recs is None:
    sys.exit(1)
by = {}
for rec in recs:
    key = (rec["d"], rec["sq"], rec["mask"])
    by.setdefault(key, {})[rec["kernel"]] = rec
print(f"set {args.label}: D S mask | " + " | ".join(f"{k} ms (TFLOPS, ok)" for k in kernels) + " | unfused/fa1 | fa2/fa1")
ratios = []
for (d, s, mask), ks in sorted(by.items()):
    cells = []
    for k in kernels:
        rec = ks.get(k, {})
        if "median_ms" in rec:
            cells.append(f"{rec['median_ms']:.3f} ({rec['tflops']:.0f}, {'ok' if rec['check_pass'] else 'FAIL'} "
                         f"{rec['kernel_ran']})")
        else:
            cells.append(f"error: {rec.get('error', 'missing')}")
    row = f"{args.label}: D={d} S={s} {mask} | " + " | ".join(cells)
    f1 = ks.get("fa1", {}).get("median_ms")
    if f1 and "unfused" in ks and "median_ms" in ks["unfused"]:
        ratio = ks["unfused"]["median_ms"] / f1
        ratios.append(ratio)
        row += f" | {ratio:.2f}x"
    if f1 and "fa2" in ks and "median_ms" in ks["fa2"]:
        row += f" | {ks['fa2']['median_ms'] / f1:.2f}"
    print(row)
if ratios:
    print(f"set {args.label}: unfused/fa1 min {min(ratios):.2f} max {max(ratios):.2f} over {len(ratios)} points")
