"""Head dims above 256 (issue 21): `auto` (the wide-head path, kernels/wide.rs) through the Rust backend against
PyTorch's SDPA in one run on one GPU.

Ours: the Rust driver `cuda_kernels` (CUDA events, L2 flushed before each call, median of the reps, output
checked against the f64 reference on a few rows). PyTorch: `triton.testing.do_bench` medians of its default
backend and of EFFICIENT_ATTENTION and MATH forced (PyTorch has no fused kernel above 256 but the
memory-efficient one); a backend that refuses or runs out of memory is a null. Ceilings in the same run: the
device-to-device copy bandwidth (read + write) and an 8192^3 bf16 GEMM.

Grid: bf16, D = 512 / 1024 / 4096 at 16k tokens (B x S), H = 2048 / D (1 at 4096), causal and not; MLA decoding
(D = 576, Dv = 512, one kv head, 16 and 128 query heads, B = 8 / Sk = 4k and B = 1 / Sk = 32k), whose bytes
(sdpa-core's cost model: Q, K, V and O once) are compared with the copy bandwidth.

    python3 sdpa-cuda/dev/wide_bench.py --bench path/to/cuda_kernels [--quick] [--out DIR]

Writes wide_bench.json (raw) and wide-records.json (the flat records `sdpa report` reads) to --out ($OUT by
default) and prints a table last.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.getcwd(), "sdpa-cuda", "dev"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from torch.nn.attention import SDPBackend  # noqa: E402

from sdpa_dev import (copy_gbps, cost, env_info, gemm_tflops, key, log, point, run_points,  # noqa: E402
                      torch_sdpa_ms, unique_keys)

ap = argparse.ArgumentParser()
ap.add_argument("--bench", required=True, help="path of the cuda_kernels benchmark binary")
ap.add_argument("--quick", action="store_true", help="fewer lengths")
ap.add_argument("--decode-only", action="store_true")
ap.add_argument("--only", default="", help="prefill points to time instead of the grid, as D:S pairs (both masks "
                "each), e.g. 512:1024,512:4096")
ap.add_argument("--reps", type=int, default=20)
ap.add_argument("--sweep", default="", help="settings to time a few points under first, e.g. "
                                             "'SDPA_WIDE_SLAB_MB=64,1024;SDPA_WIDE_PV_PARTS=1,8' (the slab budget's "
                                             "and the P·V split's measurements; the main grid runs the defaults)")
ap.add_argument("--sweep-at", default="", help="the sweep's prefill points instead of its own, as D:S pairs, "
                "causal only (e.g. 512:1024,512:4096); no decoding points then")
ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)

points = []
grid = {512: [1024, 4096, 16384], 1024: [1024, 4096], 4096: [512, 2048]}
if args.quick:
    grid = {512: [4096], 1024: [4096], 4096: [2048]}
if args.only:
    grid = {}
    for pair in args.only.split(","):
        d, s_ = (int(x) for x in pair.split(":"))
        grid.setdefault(d, []).append(s_)
for d, seqs in ([] if args.decode_only else grid.items()):
    h = max(1, 2048 // d)
    for causal in [False, True]:
        for s in seqs:
            points.append(point("wide", 16384 // s, h, h, s, s, d, "bf16", causal, "auto"))
for hq in [16, 128]:
    for (b, sk) in [(8, 4096), (1, 32768)]:
        points.append(point("decode_mla", b, hq, 1, 1, sk, 576, "bf16", False, "auto", dv=512))

res = dict(env=env_info(date=False), ceilings={}, records=[], sweep=[])
log("ENV", json.dumps(res["env"]))
sweep_points = [point("sweep", 16384 // s, max(1, 2048 // d), max(1, 2048 // d), s, s, d, "bf16", c, "auto")
                for (d, s, c) in [(512, 4096, False), (512, 4096, True), (1024, 4096, False)]]
sweep_points += [point("sweep", b, hq, 1, 1, sk, 576, "bf16", False, "auto", dv=512)
                 for (b, hq, sk) in [(8, 128, 4096), (1, 128, 32768), (8, 16, 4096), (1, 16, 32768)]]
if args.sweep_at:
    sweep_points = [point("sweep", 16384 // s, max(1, 2048 // d), max(1, 2048 // d), s, s, d, "bf16", True, "auto")
                    for (d, s) in (tuple(int(v) for v in x.split(":")) for x in args.sweep_at.split(","))]
for setting in [x for x in args.sweep.split(";") if x]:
    var, values = setting.split("=")
    for val in values.split(","):
        recs = run_points(args.bench, sweep_points, f"wide_sweep_{var}_{val}.json", warmup=3, reps=args.reps,
                          env={var: val}, on_error="none") or []
        for r in recs:
            r["setting"] = f"{var}={val}"
            res["sweep"].append(r)
            log(f"sweep {var}={val:>5}  B={r['b']:2} H={r['hq']:3}/{r['hkv']:<3} S={r['sq']:5}/{r['sk']:5} "
                f"D={r['d']:4} {r['mask']:6} {r.get('median_ms') or 0:9.4f} ms {r.get('tflops') or 0:6.1f} TFLOPS "
                f"{r.get('gbps') or 0:6.0f} GB/s check {r.get('check_pass')}")
log(f"timing {len(points)} points of ours through the Rust backend ...")
ours = run_points(args.bench, points, os.path.join(args.out, "wide_raw.json"), warmup=3, reps=args.reps)

res["ceilings"]["d2d_GBps"] = copy_gbps()
res["ceilings"]["gemm_bf16_TFLOPs"] = gemm_tflops(torch.bfloat16)
log("CEILINGS", json.dumps(res["ceilings"]))

BACKENDS = [("default", None), ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH)]
torch_ms = torch_sdpa_ms(unique_keys(ours), BACKENDS)

bw = res["ceilings"]["d2d_GBps"]
gemm = res["ceilings"]["gemm_bf16_TFLOPs"]
flat = []
device = res["env"].get("name", "unknown GPU")
machine = f"{device}, torch {res['env'].get('torch')}, CUDA {res['env'].get('cuda')}"
for rec in ours:
    t = torch_ms[key(rec)]
    ms = rec.get("median_ms")
    for name, _ in BACKENDS:
        rec[f"torch_{name}_ms"] = t[name]
        rec[f"x_{name}"] = t[name] / ms if (ms and t[name]) else None
    best = [t[n] for n in ("efficient", "math") if t[n]]
    rec["x_best"] = min(best) / ms if (ms and best) else None
    rec["frac_gemm_bf16"] = rec["tflops"] / gemm if rec.get("tflops") else None
    # The bytes of sdpa-core's cost model (Q, K, V and O once; K and V dominate decoding) against the copy.
    rec["frac_copy_bw"] = rec["gbps"] / bw if rec.get("gbps") else None
    res["records"].append(rec)
    shape = dict(b=rec["b"], hq=rec["hq"], hkv=rec["hkv"], sq=rec["sq"], sk=rec["sk"], d=rec["d"],
                 dv=rec.get("dv", rec["d"]))
    base = dict(device=device, dtype=rec["dtype"], shape=shape, mask=rec["mask"], layout="bhsd", machine=machine)
    if ms:
        flat.append(dict(base, backend="cuda", kernel="auto", auto_chose=rec.get("kernel_ran"),
                         time_ms=dict(median=ms, min=rec["min_ms"], max=rec["max_ms"], reps=args.reps),
                         tflops=rec["tflops"], gbps=rec["gbps"]))
    flops, nbytes = cost(shape, rec["mask"], rec["dtype"])
    for name, _ in BACKENDS:
        tm = t[name]
        if tm:
            flat.append(dict(base, backend="pytorch", kernel=name, time_ms=dict(median=tm, min=tm, max=tm, reps=0),
                             tflops=flops / tm / 1e9, gbps=nbytes / tm / 1e6))
json.dump(res, open(os.path.join(args.out, "wide_bench.json"), "w"), indent=1)
json.dump(flat, open(os.path.join(args.out, "wide-records.json"), "w"), indent=1)


def fm(x, spec="6.2f"):
    return "     -" if x is None else format(x, spec)


log(f"\n{'tag':10} {'ran':7} {'B':>3} {'H':>7} {'Sq':>5} {'Sk':>5} {'D':>8} {'c':1} {'ms':>8} {'TFLOPS':>6} "
    f"{'gemm%':>5} {'xdflt':>6} {'xeff':>6} {'xmath':>6} {'xbest':>6} {'copy%':>5} ok")
for r in res["records"]:
    dd = f"{r['d']}/{r.get('dv', r['d'])}"
    log(f"{r['tag']:10} {r.get('kernel_ran', 'ERR'):7} {r['b']:>3} {r['hq']:>3}/{r['hkv']:<3} {r['sq']:>5} {r['sk']:>5} "
        f"{dd:>8} {int(r['mask'] == 'causal')} {fm(r.get('median_ms'), '8.4f')} {fm(r.get('tflops'), '6.1f')} "
        f"{fm(r['frac_gemm_bf16'] and 100 * r['frac_gemm_bf16'], '5.1f')} {fm(r['x_default'])} {fm(r['x_efficient'])} "
        f"{fm(r['x_math'])} {fm(r['x_best'])} {fm(r['frac_copy_bw'] and 100 * r['frac_copy_bw'], '5.1f')} "
        f"{'y' if r.get('check_pass') else 'N'}{(' ' + r['error'][:60]) if r.get('error') else ''}")
