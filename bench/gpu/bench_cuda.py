"""Side-by-side benchmark of the sdpa-cuda foundation kernels and PyTorch SDPA, in one run on one GPU.

Run on the device machine (PyTorch + Triton there):
    python3 bench/gpu/bench_cuda.py --bench gpu-bundle/cuda_kernels [--quick] [--out DIR]
Our kernels are timed by the Rust driver `cuda_kernels` (sdpa-cuda/benches/cuda_kernels.rs: CUDA events
around each call after a 256 MB L2 flush, median of the reps), PyTorch by `triton.testing.do_bench` (the
same flush-then-events scheme, median) as in ../shared/tools/gpu_anchors.py. Writes cuda_bench.json (every
record, with `torch_ms` and `speedup` = torch time / our time) and prints the issue's targets last.
"""
import argparse, json, os

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from cuda_driver import key, point, run_points, unique_keys

ap = argparse.ArgumentParser()
ap.add_argument("--bench", required=True, help="path of the cuda_kernels benchmark binary")
ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
ap.add_argument("--quick", action="store_true")
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)


def log(*a):
    print(*a, flush=True)


def pt(tag, b, hq, hkv, s, d, dtype, causal, kernel, math="exact"):
    return point(tag, b, hq, hkv, s, s, d, dtype, causal, kernel, math)


points = []
# Tiny shapes from the seed reports: launch overhead, not arithmetic.
for s in [64, 128, 512]:
    for k in ["auto", "fa1", "unfused"]:
        points.append(pt("tiny", 1, 1, 1, s, 64, "bf16", False, k))
seqs_f32 = [1024, 4096] if args.quick else [1024, 2048, 4096]
for d in [64, 128]:
    for s in seqs_f32:
        for causal in [False, True]:
            h = 2048 // d
            for k, m in [("fa1", "exact"), ("fa2", "tf32"), ("fa2", "split-tf32")]:
                points.append(pt("f32", 16384 // s, h, h, s, d, "f32", causal, k, m))
# f32 GQA, where PyTorch falls back to its unfused math path.
for k, m in [("fa1", "exact"), ("fa2", "tf32"), ("fa2", "split-tf32"), ("unfused", "exact")]:
    points.append(pt("gqa_f32", 1, 32, 8, 4096, 128, "f32", True, k, m))
# fa1 against our own unfused baseline, bf16.
seqs_bf16 = [2048, 8192] if args.quick else [2048, 4096, 8192]
for d in [64, 128]:
    for s in seqs_bf16:
        for causal in [False, True]:
            h = 2048 // d
            for k in ["fa1", "unfused"]:
                points.append(pt("fa1_vs_unfused", 16384 // s, h, h, s, d, "bf16", causal, k))
# fa2 (f16/bf16 tensor cores) and splitkv decoding (issue 5), against PyTorch's default (cuDNN) here;
# sdpa-cuda/dev/fa2_rust_bench.py also times PyTorch's FLASH_ATTENTION backend on the full grid.
for d in [64, 128]:
    for s in seqs_bf16:
        for causal in [False, True]:
            points.append(pt("fa2", 16384 // s, 2048 // d, 2048 // d, s, d, "bf16", causal, "fa2"))
for b, hq, hkv, sk in [(8, 32, 32, 4096), (1, 32, 8, 32768)]:
    points.append(dict(pt("decode", b, hq, hkv, 1, 128, "bf16", False, "splitkv"), sk=sk))

log(f"timing {len(points)} points of ours ...")
ours = run_points(args.bench, points, "cuda_kernels_raw.json", warmup=5, reps=25)

# PyTorch on the same shapes, same inputs distribution (uniform, unit variance), default backend.
dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch_ms = {}
for shape in unique_keys(ours):
    b, hq, hkv, sq, sk, d, dname, mask, dv = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h, s, e: ((torch.rand(b, h, s, e, device="cuda", generator=g) * 2 - 1) * 3 ** 0.5).to(dt[dname])
    q, k, v = mk(hq, sq, d), mk(hkv, sk, d), mk(hkv, sk, dv)
    causal = mask == "causal"
    fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv)
    try:
        ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn(); torch.cuda.synchronize()
        kern = sorted({e.name[:50] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})[:2]
        # PyTorch's own error against float64 on the first batch element (f32 points: the accuracy side of
        # "at least 1.0x at the same or better accuracy").
        err = None
        if dname == "f32":
            ref = F.scaled_dot_product_attention(q[:1].double(), k[:1].double(), v[:1].double(), is_causal=causal,
                                                 enable_gqa=hq != hkv)
            err = ((fn()[:1].double() - ref).norm() / ref.norm()).item()
            del ref
    except Exception as e:  # noqa: BLE001 - record and go on
        ms, kern, err = None, repr(e)[:80], None
    torch_ms[shape] = (ms, kern, err)
    del q, k, v
    torch.cuda.empty_cache()

for p in ours:
    ms, kern, err = torch_ms[key(p)]
    p["torch_ms"] = ms
    p["torch_rel_err"] = err
    p["torch_kernels"] = kern
    p["speedup"] = (ms / p["median_ms"]) if (ms and p.get("median_ms")) else None
    p["torch_version"] = torch.__version__

json.dump(dict(env=dict(torch=torch.__version__, cuda=torch.version.cuda, device=torch.cuda.get_device_name(0)),
               records=ours), open(os.path.join(args.out, "cuda_bench.json"), "w"), indent=1)


def f(x, spec="7.3f"):
    return "-" if x is None else format(x, spec)


log(f"\n{'tag':15} {'kernel':8} {'math':10} {'dt':4} {'B':>3} {'H':>5} {'S':>5} {'D':>3} {'c':1} "
    f"{'ours ms':>9} {'TFLOPS':>7} {'torch ms':>9} {'x torch':>7} {'rel_err':>8} {'torch_err':>9}")
for p in ours:
    log(f"{p['tag']:15} {p['kernel']:8} {p['f32_math']:10} {p['dtype']:4} {p['b']:>3} {p['hq']:>2}/{p['hkv']:<2} "
        f"{p['sq']:>5} {p['d']:>3} {int(p['mask'] == 'causal')} {f(p.get('median_ms'), '9.4f')} "
        f"{f(p.get('tflops'), '7.1f')} {f(p.get('torch_ms'), '9.4f')} {f(p.get('speedup'), '7.2f')} "
        f"{f(p.get('rel_err'), '8.1e')} {f(p.get('torch_rel_err'), '9.1e')} {p.get('error', '')[:60]}")

# The issue's targets, as ratios measured above.
def ratios(pred):
    return [p["speedup"] for p in ours if pred(p) and p.get("speedup")]

def own_ratio(d, s, causal):
    fa = [p for p in ours if p["tag"] == "fa1_vs_unfused" and p["d"] == d and p["sq"] == s and
          (p["mask"] == "causal") == causal]
    t = {p["kernel"]: p.get("median_ms") for p in fa}
    return t["unfused"] / t["fa1"] if t.get("unfused") and t.get("fa1") else None

log("\ntargets (min ratio over the points; >= target passes)")
rows = [
    ("tiny bf16, auto vs torch default", ratios(lambda p: p["tag"] == "tiny" and p["kernel"] == "auto"), 1.0),
    ("f32 exact fa1 vs torch f32, S>=1024", ratios(lambda p: p["tag"] == "f32" and p["f32_math"] == "exact"), 0.7),
    ("f32 split-tf32 vs torch f32", ratios(lambda p: p["tag"] == "f32" and p["f32_math"] == "split-tf32"), 1.0),
    ("f32 tf32 vs torch f32", ratios(lambda p: p["tag"] == "f32" and p["f32_math"] == "tf32"), 3.0),
    ("f32 GQA best (fa1/tf32/split) vs torch", [max(ratios(lambda p: p["tag"] == "gqa_f32") or [0])], 3.0),
    ("f32 GQA split-tf32 vs torch", ratios(lambda p: p["tag"] == "gqa_f32" and p["f32_math"] == "split-tf32"), 3.0),
    ("fa1 bf16 vs our unfused bf16, S>=2048",
     [x for x in (own_ratio(d, s, c) for d in [64, 128] for s in seqs_bf16 for c in [False, True]) if x], 3.0),
    ("fa2 bf16 vs torch default (cuDNN; next goal)", ratios(lambda p: p["tag"] == "fa2"), 1.0),
    ("splitkv decode vs torch default", ratios(lambda p: p["tag"] == "decode"), 1.0),
]
for name, xs, target in rows:
    if not xs:
        log(f"  {name:42} no data")
        continue
    log(f"  {name:42} min {min(xs):6.2f} median {sorted(xs)[len(xs) // 2]:6.2f} max {max(xs):6.2f} "
        f"target {target:4.1f} {'PASS' if min(xs) >= target else 'MISS'}")
