"""fa3 (the Hopper forward) against our fa2 and PyTorch's cuDNN and FLASH_ATTENTION backends, in one run on one GPU.

Ours through the Rust driver `cuda_kernels` (sdpa-cuda/benches/cuda_kernels.rs: NVRTC-compiled programs as users
get them, CUDA events, L2 flushed before each call, median of the reps, output checked against the f64 reference
on a few rows): `fa3` with ping-pong (the default), `fa3` without it (`SDPA_FA3_PINGPONG=0`) and `fa2`. PyTorch
with `triton.testing.do_bench` medians (as fa2_rust_bench.py): the default backend (cuDNN on the H100) and
FLASH_ATTENTION. The bf16 8192^3 GEMM ceiling is measured in the same run.

    python3 sdpa-cuda/dev/fa3_bench.py --bench path/to/cuda_kernels [--f16] [--tiles 128,3 176,2] [--out DIR]

Grid: fa2bench (batch x seqlen = 16k tokens, hidden 2048, D = 64 and 128, S = 512..16k, causal and not), bf16
(and f16 with --f16). Writes fa3_bench.json to --out ($OUT by default) and prints a table per point and the
medians the issue asks about. --tiles also times fa3 with each forced tile (`SDPA_FA3_TILE=bn,stages`) at
S = 1k, 4k and 16k (or --tile-seqs), against the default tile of the same run.
"""
import argparse
import json
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from sdpa_dev import bench, env_info, gemm_tflops, key, log, point, run_points, unique_keys

ap = argparse.ArgumentParser()
ap.add_argument("--bench", required=True, help="path of the cuda_kernels benchmark binary")
ap.add_argument("--f16", action="store_true", help="the f16 grid too")
ap.add_argument("--tiles", nargs="*", default=[], help="forced fa3 tiles `bn,stages` to time as well")
ap.add_argument("--tile-seqs", nargs="*", type=int, default=[1024, 4096, 16384],
                help="sequence lengths the forced tiles are timed at (default 1k, 4k, 16k)")
ap.add_argument("--variants", nargs="*", default=["pp0:SDPA_FA3_PINGPONG=0"],
                help="fa3 runs besides the default, `name:VAR=value` (default: pp0, without ping-pong)")
ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)

dtypes = ["bf16", "f16"] if args.f16 else ["bf16"]
shapes = [(dt, d, causal, s) for dt in dtypes for d in [64, 128] for causal in [False, True]
          for s in [512, 1024, 2048, 4096, 8192, 16384]]


def grid(kernel, seqs=None):
    return [point("fa2bench", 16384 // s, 2048 // d, 2048 // d, s, s, d, dt, causal, kernel)
            for (dt, d, causal, s) in shapes if seqs is None or s in seqs]


res = dict(env=env_info(date=False), ceilings={}, records=[])
log("ENV", json.dumps(res["env"]))
runs = {}
variants = [(f"fa3_{v.split(':')[0]}", "fa3", dict([v.split(':', 1)[1].split('=', 1)])) for v in args.variants]
for name, kernel, env in [("fa3", "fa3", None)] + variants + [("fa2", "fa2", None)]:
    log(f"timing {name} ...")
    runs[name] = run_points(args.bench, grid(kernel), f"fa3_{name}_raw.json", warmup=5, reps=30, env=env,
                            on_error="none") or []
tile_runs = {}
for t in args.tiles:
    log(f"timing fa3 with SDPA_FA3_TILE={t} ...")
    tile_runs[t] = run_points(args.bench, grid("fa3", args.tile_seqs), f"fa3_tile_{t.replace(',', 'x')}_raw.json",
                              warmup=5, reps=30, env={"SDPA_FA3_TILE": t}, on_error="none") or []
res["tiles"] = tile_runs
res["ceilings"]["gemm_bf16_TFLOPs"] = gemm_tflops(torch.bfloat16)
log("CEILINGS", json.dumps(res["ceilings"]))

dt = {"bf16": torch.bfloat16, "f16": torch.float16}
torch_ms = {}
for shape in unique_keys(runs["fa2"] or runs["fa3"]):
    b, hq, hkv, sq, sk, d, dname, mask, dv = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, hq, sq, d, device="cuda", generator=g, dtype=dt[dname])
    k = torch.randn(b, hkv, sk, d, device="cuda", generator=g, dtype=dt[dname])
    v = torch.randn(b, hkv, sk, dv, device="cuda", generator=g, dtype=dt[dname])
    causal = mask == "causal"
    fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out = {}
    for name, be in [("flash", SDPBackend.FLASH_ATTENTION), ("default", None)]:
        try:
            if be is None:
                out[name] = bench(fn)
            else:
                with sdpa_kernel([be]):
                    out[name] = bench(fn)
        except Exception as e:  # noqa: BLE001 - a backend refusing a shape is a data point
            out[name] = None
            log("torch", name, "failed:", repr(e)[:80])
    torch_ms[shape] = out
    del q, k, v
    torch.cuda.empty_cache()

gemm = res["ceilings"]["gemm_bf16_TFLOPs"]
by = {name: {key(r): r for r in recs} for name, recs in runs.items()}
for shape, t in torch_ms.items():
    row = dict(shape=list(shape), torch_flash_ms=t["flash"], torch_default_ms=t["default"])
    for name in runs:
        r = by[name].get(shape, {})
        ms = r.get("median_ms")
        row[name] = dict(ms=ms, tflops=r.get("tflops"), ran=r.get("kernel_ran"), check=r.get("check_pass"),
                         error=r.get("error"),
                         x_default=t["default"] / ms if (ms and t["default"]) else None,
                         x_flash=t["flash"] / ms if (ms and t["flash"]) else None,
                         frac_gemm=r["tflops"] / gemm if r.get("tflops") else None)
    res["records"].append(row)
json.dump(res, open(os.path.join(args.out, "fa3_bench.json"), "w"), indent=1)


def fm(x, spec="6.1f"):
    return "    -" if x is None else format(x, spec)


vnames = [v[0] for v in variants]
log(f"\n{'dt':4} {'D':>3} {'c':1} {'S':>5} | {'fa3 TF':>6} {'xcudnn':>6} {'xflash':>6} {'ok':2} | "
    + "".join(f"{n[4:]:>6} {'xcudnn':>6} {'ok':2} | " for n in vnames)
    + f"{'fa2 TF':>6} {'xcudnn':>6} | {'fa3/fa2':>7} {'gemm%':>5}")
for row in res["records"]:
    b, hq, hkv, sq, sk, d, dname, mask, dv = row["shape"]
    a, f2 = row["fa3"], row["fa2"]
    ratio = f2["ms"] / a["ms"] if (a["ms"] and f2["ms"]) else None
    vcols = "".join(f"{fm(row[n]['tflops'])} {fm(row[n]['x_default'], '6.3f')} {'y' if row[n]['check'] else 'N'} | "
                    for n in vnames)
    log(f"{dname:4} {d:>3} {int(mask == 'causal')} {sq:>5} | {fm(a['tflops'])} {fm(a['x_default'], '6.3f')} "
        f"{fm(a['x_flash'], '6.3f')} {'y' if a['check'] else 'N'} | {vcols}"
        f"{fm(f2['tflops'])} {fm(f2['x_default'], '6.3f')} | {fm(ratio, '7.3f')} "
        f"{fm(100 * a['frac_gemm'] if a['frac_gemm'] else None, '5.1f')}"
        f"{(' ' + a['error'][:60]) if a.get('error') else ''}")
for name in runs:
    for dname in dtypes:
        recs = [r for r in res["records"] if r["shape"][6] == dname]
        xd = sorted(r[name]["x_default"] for r in recs if r[name]["x_default"])
        xf = sorted(r[name]["x_flash"] for r in recs if r[name]["x_flash"])
        ok = all(r[name]["check"] for r in recs)
        if xd:
            log(f"{name} {dname}: vs cuDNN (default) median {xd[len(xd) // 2]:.3f} min {xd[0]:.3f} | vs flash median "
                f"{xf[len(xf) // 2]:.3f} min {xf[0]:.3f} | {len(xd)} points, all checks pass: {ok}")
        else:
            log(f"{name} {dname}: no timings")
for t, recs in tile_runs.items():
    base = by["fa3"]
    lines = []
    ratios = []
    for r in recs:
        b0 = base.get(key(r), {})
        x = b0["median_ms"] / r["median_ms"] if (r.get("median_ms") and b0.get("median_ms")) else None
        if x:
            ratios.append(x)
        lines.append(f"D={r['d']} c={int(r['mask'] == 'causal')} S={r['sq']}: {fm(r.get('tflops'))} TFLOPS "
                     f"(x{fm(x, '.3f')} of the default tile){' check ' + str(r.get('check_pass')) if not r.get('check_pass') else ''}"
                     f"{(' ' + r['error'][:50]) if r.get('error') else ''}")
    ratios.sort()
    log(f"tile {t}: median x{ratios[len(ratios) // 2]:.3f} of the default tile" if ratios else f"tile {t}: no timings")
    for line in lines:
        log("  " + line)
