"""The issue-4 f32 points of `fa1` through the Rust path (the `cuda_kernels` bench binary: NVRTC-compiled
kernels, CUDA events after a 256 MB L2 flush, median) and PyTorch's f32 SDPA (allow_tf32 off, default
backend, triton do_bench median, which also flushes L2) in the same run, as bench/gpu/bench_cuda.py does
for the whole table. Also PyTorch's error against float64 on the first batch element, and fa1 bf16.

    python3 sdpa-cuda/dev/fa1_rust_bench.py --bench target-fa1/release/deps/cuda_kernels-* [--out DIR]
Writes fa1_rust_bench[_LABEL].json (records with torch_ms, torch_rel_err, speedup) and prints a table.
"""
import argparse
import json
import os

import torch
import torch.nn.functional as F

from sdpa_dev import bench, cuda_kernel_names, exact_f32, f64_err, point, run_points, uniform

ap = argparse.ArgumentParser()
ap.add_argument("--bench", required=True)
ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
ap.add_argument("--reps", default="25")
ap.add_argument("--label", default="", help="suffix of the output file (fa1_rust_bench[_LABEL].json)")
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)


def pt(tag, b, h, s, d, dtype, causal):
    return point(tag, b, h, h, s, s, d, dtype, causal, "fa1")


points = []
for d in (64, 128):
    for s in (1024, 2048, 4096):
        for causal in (False, True):
            points.append(pt("f32", 16384 // s, 2048 // d, s, d, "f32", causal))
for d in (64, 128):
    for s in (2048, 4096):
        for causal in (False, True):
            points.append(pt("bf16", 16384 // s, 2048 // d, s, d, "bf16", causal))
points.append(dict(pt("gqa_f32", 1, 32, 4096, 128, "f32", True), hkv=8))

ours = run_points(args.bench, points, "fa1_rust_raw.json", warmup=5, reps=args.reps)

exact_f32()
for p in ours:
    if p["dtype"] != "f32":
        continue
    b, hq, hkv, s, d = p["b"], p["hq"], p["hkv"], p["sq"], p["d"]
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (uniform((b, h, s, d), "f32", g) for h in (hq, hkv, hkv))
    causal = p["mask"] == "causal"
    fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv)
    p["torch_ms"] = bench(fn, warmup=25, rep=100)
    p["torch_rel_err"] = f64_err(fn, q, k, v, causal)
    p["torch_kernels"] = cuda_kernel_names(fn)
    p["speedup"] = p["torch_ms"] / p["median_ms"] if p.get("median_ms") else None
    p["torch_version"] = torch.__version__
    del q, k, v
    torch.cuda.empty_cache()

json.dump(dict(env=dict(torch=torch.__version__, cuda=torch.version.cuda, device=torch.cuda.get_device_name(0)),
               records=ours), open(os.path.join(args.out, f"fa1_rust_bench{'_' + args.label if args.label else ''}.json"), "w"), indent=1)
print(f"{'tag':8} {'dt':4} {'B':>3} {'H':>5} {'S':>5} {'D':>3} c {'ran':6} {'ours ms':>8} {'TFLOPS':>6} "
      f"{'torch ms':>8} {'x':>5} {'err':>8} {'torch err':>9}")
for p in ours:
    f = lambda x, sp: "-" if x is None else format(x, sp)
    print(f"{p['tag']:8} {p['dtype']:4} {p['b']:>3} {p['hq']:>2}/{p['hkv']:<2} {p['sq']:>5} {p['d']:>3} "
          f"{int(p['mask'] == 'causal')} {p.get('kernel_ran', '?'):6} {f(p.get('median_ms'), '8.3f')} "
          f"{f(p.get('tflops'), '6.1f')} {f(p.get('torch_ms'), '8.3f')} {f(p.get('speedup'), '5.2f')} "
          f"{f(p.get('rel_err'), '8.1e')} {f(p.get('torch_rel_err'), '9.1e')} {p.get('error', '')[:50]}")
xs = [p["speedup"] for p in ours if p["tag"] == "f32" and p.get("speedup")]
if xs:
    print(f"f32 fa1 vs torch f32 (S>=1024, D 64/128): min {min(xs):.2f} median {sorted(xs)[len(xs) // 2]:.2f} "
          f"max {max(xs):.2f} target 0.70 {'PASS' if min(xs) >= 0.7 else 'MISS'}")
