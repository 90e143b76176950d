"""Same-run A/B of several cuda_kernels builds (kernel variants) on the two decoding shapes of issue 5,
under both L2 flushes (sdpa_cuda::L2Flush), in alternating rounds; prints each variant's per-round medians.

    python3 sdpa-cuda/dev/decode_variants_ab.py base=target-ab/base2/cuda_kernels new=gpu-bundle/cuda_kernels \\
        [--rounds 3] [--out DIR]
"""
import argparse
import json
import os
import statistics
import sys

from sdpa_dev import point, run_points, write_points

ap = argparse.ArgumentParser()
ap.add_argument("variants", nargs="+", help="name=path of a cuda_kernels binary")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)
variants = [v.split("=", 1) for v in args.variants]
points = [point("decode", b, hq, hkv, 1, sk, 128, "bf16", False, "auto")
          for b, hq, hkv, sk in [(8, 32, 32, 4096), (1, 32, 8, 32768)]]
pfile = write_points(points)
times = {}
for rnd in range(args.rounds):
    for fl in ["clean", "dirty"]:
        for name, path in variants:
            recs = run_points(path, pfile, f"ab_{name}.json", 10, 100, flush=fl, on_error="none")
            if recs is None:
                sys.exit(f"{name}: {path} failed")
            for rec in recs:
                assert rec.get("check_pass"), rec
                times.setdefault((name, fl, rec["b"]), []).append(rec["median_ms"] * 1e3)
json.dump({f"{k[0]} {k[1]} B={k[2]}": v for k, v in times.items()}, open(os.path.join(args.out, "decode_variants_ab.json"), "w"), indent=1)
for b in [8, 1]:
    for fl in ["clean", "dirty"]:
        base = statistics.median(times[(variants[0][0], fl, b)])
        for name, _ in variants:
            t = times[(name, fl, b)]
            print(f"B={b} {fl:5} {name:8} median {statistics.median(t):7.2f} us  x{base / statistics.median(t):.3f}  rounds {[round(x, 2) for x in t]}")
