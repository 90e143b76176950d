"""The TF32 and split-TF32 kernels through the Rust backend against PyTorch's f32 SDPA, in one run on one GPU.

Ours: the foundation's Rust driver `cuda_kernels` (sdpa-cuda/benches/cuda_kernels.rs: the NVRTC-compiled
module as users get it, CUDA events after an L2 flush, median of the reps, output checked against the f64
reference on a few rows). PyTorch: f32 SDPA with TF32 off (its exact-f32 kernel; the math path for GQA),
`triton.testing.do_bench` medians (L2 flushed before each call), as ../shared/tools/gpu_anchors.py and
bench/gpu/bench_cuda.py do, on the same shapes and input distribution, with its own error against float64
on the first batch element. Points: the issue-4 f32 grid (B = 16384/S, H = 2048/D, D = 64 and 128,
S = 1024/2048/4096, no mask and causal) and GQA Hq=32 Hkv=8 S=4096 D=128 causal.

    python3 sdpa-cuda/dev/tf32_rust_bench.py --bench path/to/cuda_kernels [--rounds N] [--out DIR]

With --rounds N the Rust driver and PyTorch are timed N times alternately and every round is kept; the
table shows the median round. Writes tf32_rust_bench.json to --out ($OUT by default).
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

from sdpa_dev import bench, exact_f32, f64_err, log, point, run_points, uniform, write_points

ap = argparse.ArgumentParser()
ap.add_argument("--bench", required=True, help="path of the cuda_kernels benchmark binary")
ap.add_argument("--rounds", type=int, default=1)
ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)
exact_f32()


def pt(tag, b, hq, hkv, s, d, causal, math):
    return point(tag, b, hq, hkv, s, s, d, "f32", causal, "fa2", math)


points = []
for d in (64, 128):
    for s in (1024, 2048, 4096):
        for causal in (False, True):
            for m in ("tf32", "split-tf32"):
                points.append(pt("f32", 16384 // s, 2048 // d, 2048 // d, s, d, causal, m))
for m in ("tf32", "split-tf32"):
    points.append(pt("gqa_f32", 1, 32, 8, 4096, 128, True, m))
pfile = write_points(points)


def key(p):
    return (p["b"], p["hq"], p["hkv"], p["sq"], p["d"], p["mask"])


def time_torch(k, want_err):
    b, hq, hkv, s, d, mask = k
    g = torch.Generator(device="cuda").manual_seed(0)
    q, kk, v = (uniform((b, h, s, d), "f32", g) for h in (hq, hkv, hkv))
    causal = mask == "causal"
    fn = lambda: F.scaled_dot_product_attention(q, kk, v, is_causal=causal, enable_gqa=hq != hkv)
    ms = bench(fn, warmup=25, rep=100)
    err = f64_err(fn, q, kk, v, causal) if want_err else None
    del q, kk, v
    torch.cuda.empty_cache()
    return ms, err


rounds = []
torch_err = {}
for r in range(args.rounds):
    ours = run_points(args.bench, pfile, f"tf32_rust_raw_{r}.json", warmup=5, reps=25)
    tms = {}
    for p in ours:
        if key(p) not in tms:
            ms, err = time_torch(key(p), key(p) not in torch_err)
            tms[key(p)] = ms
            if err is not None:
                torch_err[key(p)] = err
    for p in ours:
        p["round"] = r
        p["torch_ms"] = tms[key(p)]
        p["torch_rel_err"] = torch_err.get(key(p))
        p["speedup"] = p["torch_ms"] / p["median_ms"] if p.get("median_ms") else None
        p["torch_version"] = torch.__version__
    rounds.append(ours)

env = dict(torch=torch.__version__, cuda=torch.version.cuda, device=torch.cuda.get_device_name(0), argv=sys.argv)
json.dump(dict(env=env, records=[p for r in rounds for p in r]), open(os.path.join(args.out, "tf32_rust_bench.json"),
                                                                        "w"), indent=1)


def f(x, spec):
    return "-" if x is None else format(x, spec)


log(f"{'tag':8} {'math':10} {'B':>3} {'H':>5} {'S':>5} {'D':>3} {'c':1} {'ours ms':>8} {'TFLOPS':>7} {'torch ms':>8} "
    f"{'x torch':>7} {'x rounds':>17} {'err':>8} {'torch err':>9}")
for i, p in enumerate(rounds[0]):
    per = [r[i] for r in rounds]
    sp = sorted((q.get("speedup") or 0) for q in per)
    med = sorted(per, key=lambda q: q.get("speedup") or 0)[len(per) // 2]
    log(f"{p['tag']:8} {p['f32_math']:10} {p['b']:>3} {p['hq']:>2}/{p['hkv']:<2} {p['sq']:>5} {p['d']:>3} "
        f"{int(p['mask'] == 'causal')} {f(med.get('median_ms'), '8.4f')} {f(med.get('tflops'), '7.1f')} "
        f"{f(med.get('torch_ms'), '8.4f')} {f(med.get('speedup'), '7.2f')} "
        f"{' '.join(format(x, '.2f') for x in sp):>17} {f(med.get('rel_err'), '8.1e')} "
        f"{f(med.get('torch_rel_err'), '9.1e')} {med.get('error', '')[:60]}")
