"""fa3 (the Hopper forward) against our fa2 and PyTorch's cuDNN and FLASH_ATTENTION backends, in one run on one GPU.

Ours through the Rust driver `cuda_kernels` (sdpa-cuda/benches/cuda_kernels.rs: NVRTC-compiled programs as users
get them, CUDA events, L2 flushed before each call, median of the reps, output checked against the f64 reference
on a few rows): `fa3` with ping-pong (the default), `fa3` without it (`SDPA_FA3_PINGPONG=0`) and `fa2`. PyTorch
with `triton.testing.do_bench` medians (as fa2_rust_bench.py): the default backend (cuDNN on the H100) and
FLASH_ATTENTION. The bf16 8192^3 GEMM ceiling is measured in the same run.

    python3 sdpa-cuda/dev/fa3_bench.py --bench path/to/cuda_kernels [--f16] [--tiles 128,3 176,2] [--out DIR]
    python3 sdpa-cuda/dev/fa3_bench.py --bench path/to/cuda_kernels --headdims [--seqs 1024 4096 16384] --variants

Grid: fa2bench (batch x seqlen = 16k tokens, hidden 2048, D = 64 and 128, S = 512..16k, causal and not), bf16
(and f16 with --f16). Writes fa3_bench.json to --out ($OUT by default) and prints a table per point and the
medians the issue asks about. --tiles also times fa3 with each forced tile (`SDPA_FA3_TILE=bn,stages`) at
S = 1k, 4k and 16k (or --tile-seqs), against the default tile of the same run.

--headdims: issue 21's head-dim grid instead (bf16, D = 32, 40, 80, 96, 160, 192, 224, 256 and the MLA pair
192/128, 16k tokens, H = 2048 / D where D divides 2048, else 16, S = 1k..16k or --seqs, causal and not), with a
summary per head dim: fa3 against PyTorch's FLASH_ATTENTION and default backends and against our fa2.
"""
import argparse
import json
import os
import statistics

import torch
from torch.nn.attention import SDPBackend

from sdpa_dev import env_info, gemm_tflops, key, log, point, run_points, torch_sdpa_ms, unique_keys

ap = argparse.ArgumentParser()
ap.add_argument("--bench", required=True, help="path of the cuda_kernels benchmark binary")
ap.add_argument("--f16", action="store_true", help="the f16 grid too")
ap.add_argument("--tiles", nargs="*", default=[],
                help="forced fa3 tiles `bn,stages` to time as well; `bn,stages@D` or `@D/Dv` at that head dim only")
ap.add_argument("--tile-seqs", nargs="*", type=int, default=[1024, 4096, 16384],
                help="sequence lengths the forced tiles are timed at (default 1k, 4k, 16k)")
ap.add_argument("--variants", nargs="*", default=["pp0:SDPA_FA3_PINGPONG=0"],
                help="fa3 runs besides the default, `name:VAR=value` (default: pp0, without ping-pong)")
ap.add_argument("--headdims", action="store_true", help="issue 21's head-dim grid instead of fa2bench")
ap.add_argument("--seqs", nargs="*", type=int, default=None, help="sequence lengths (default: the grid's)")
ap.add_argument("--dims", nargs="*", default=None,
                help="with --headdims, only these head dims (`D` or `D/Dv`, e.g. 256 192/128)")
ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)

dtypes = ["bf16", "f16"] if args.f16 else ["bf16"]
# (tag, dtype, D, Dv, heads, causal, S)
if args.headdims:
    seqs = args.seqs or [1024, 2048, 4096, 8192, 16384]
    dims = [(d, d, 2048 // d if 2048 % d == 0 else 16) for d in [32, 40, 80, 96, 160, 192, 224, 256]] + [(192, 128, 16)]
    if args.dims:
        dims = [x for x in dims if f"{x[0]}" in args.dims and x[0] == x[1] or f"{x[0]}/{x[1]}" in args.dims]
    shapes = [("headdim" if d == dv else "mla", dt, d, dv, h, causal, s) for dt in dtypes for (d, dv, h) in dims
              for causal in [False, True] for s in seqs]
else:
    seqs = args.seqs or [512, 1024, 2048, 4096, 8192, 16384]
    shapes = [("fa2bench", dt, d, d, 2048 // d, causal, s) for dt in dtypes for d in [64, 128]
              for causal in [False, True] for s in seqs]


def grid(kernel, seqs=None, dims=None):
    return [point(tag, 16384 // s, h, h, s, s, d, dt, causal, kernel, dv=dv)
            for (tag, dt, d, dv, h, causal, s) in shapes
            if (seqs is None or s in seqs) and (dims is None or (d, dv) in dims)]


def tile_dims(spec):
    """The forced tile `bn,stages` of a --tiles entry and the (D, Dv) it is limited to (None: every one)."""
    tile, _, at = spec.partition("@")
    if not at:
        return tile, None
    dims = []
    for x in at.split(","):
        d, _, dv = x.partition("/")
        dims.append((int(d), int(dv or d)))
    return tile, dims


res = dict(env=env_info(date=False), ceilings={}, records=[])
log("ENV", json.dumps(res["env"]))
runs = {}
variants = [(f"fa3_{v.split(':')[0]}", "fa3", dict([v.split(':', 1)[1].split('=', 1)])) for v in args.variants]
for name, kernel, env in [("fa3", "fa3", None)] + variants + [("fa2", "fa2", None)]:
    log(f"timing {name} ...")
    # Kept in --out, so that a run stopped in the PyTorch part still brings ours back.
    runs[name] = run_points(args.bench, grid(kernel), os.path.join(args.out, f"fa3_{name}_raw.json"), warmup=5,
                            reps=30, env=env, on_error="none") or []
tile_runs = {}
for spec in args.tiles:
    t, only = tile_dims(spec)
    log(f"timing fa3 with SDPA_FA3_TILE={t}{' at ' + str(only) if only else ''} ...")
    name = spec.replace(",", "x").replace("@", "_at").replace("/", "-")
    tile_runs[spec] = run_points(args.bench, grid("fa3", args.tile_seqs, only), f"fa3_tile_{name}_raw.json",
                                 warmup=5, reps=30, env={"SDPA_FA3_TILE": t}, on_error="none") or []
res["tiles"] = tile_runs
res["ceilings"]["gemm_bf16_TFLOPs"] = gemm_tflops(torch.bfloat16)
log("CEILINGS", json.dumps(res["ceilings"]))

torch_ms = torch_sdpa_ms(unique_keys(runs["fa2"] or runs["fa3"]), [("flash", SDPBackend.FLASH_ATTENTION), ("default", None)])

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
    dd = str(d) if d == dv else f"{d}/{dv}"
    log(f"{dname:4} {dd:>3} {int(mask == 'causal')} {sq:>5} | {fm(a['tflops'])} {fm(a['x_default'], '6.3f')} "
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
            log(f"{name} {dname}: vs cuDNN (default) median {statistics.median(xd):.3f} min {xd[0]:.3f} | vs flash "
                f"median {statistics.median(xf):.3f} min {xf[0]:.3f} | {len(xd)} points, all checks pass: {ok}")
        else:
            log(f"{name} {dname}: no timings")


def med_min(xs):
    xs = sorted(x for x in xs if x)
    return f"{statistics.median(xs):.3f} / {xs[0]:.3f}" if xs else "-"


if not args.headdims:
    # The issue's table: median / min x cuDNN per dtype, head dim and mask, for every fa3 run and fa2.
    log("\nx cuDNN (median / min over S) per dtype, D and mask: " + " | ".join(runs))
    for dname in dtypes:
        for d in [64, 128]:
            for causal in ["none", "causal"]:
                recs = [r for r in res["records"] if r["shape"][6] == dname and r["shape"][5] == d
                        and (r["shape"][7] == "causal") == (causal == "causal")]
                log(f"{dname} D={d} {causal:6}: " + " | ".join(med_min(r[n]["x_default"] for r in recs) for n in runs))


if args.headdims:
    log("\nper head dim (median / min over S and causal): fa3 x flash | fa3 x default | fa3 / fa2 | fa3 TFLOPS")
    for dname in dtypes:
        for (d, dv) in dict.fromkeys((r["shape"][5], r["shape"][8]) for r in res["records"]):
            recs = [r for r in res["records"] if r["shape"][6] == dname and (r["shape"][5], r["shape"][8]) == (d, dv)]
            a = [r["fa3"] for r in recs]
            f2 = [r["fa2"]["ms"] / r["fa3"]["ms"] if (r["fa3"]["ms"] and r["fa2"]["ms"]) else None for r in recs]
            tf = sorted(x["tflops"] for x in a if x["tflops"])
            log(f"{dname} D={d}/{dv}: {med_min(x['x_flash'] for x in a)} | {med_min(x['x_default'] for x in a)} | "
                f"{med_min(f2)} | {tf[0] if tf else 0:.0f}-{tf[-1] if tf else 0:.0f} | checks pass: "
                f"{all(x['check'] for x in a)}")
for t, recs in tile_runs.items():
    base = by["fa3"]
    lines = []
    ratios = []
    for r in recs:
        b0 = base.get(key(r), {})
        x = b0["median_ms"] / r["median_ms"] if (r.get("median_ms") and b0.get("median_ms")) else None
        if x:
            ratios.append(x)
        dims = f"{r['d']}/{r.get('dv', r['d'])}"
        lines.append(f"D={dims} c={int(r['mask'] == 'causal')} S={r['sq']}: {fm(r.get('tflops'))} TFLOPS "
                     f"(x{fm(x, '.3f')} of the default tile){' check ' + str(r.get('check_pass')) if not r.get('check_pass') else ''}"
                     f"{(' ' + r['error'][:50]) if r.get('error') else ''}")
    ratios.sort()
    log(f"tile {t}: median x{statistics.median(ratios):.3f} of the default tile" if ratios else f"tile {t}: no timings")
    for line in lines:
        log("  " + line)
