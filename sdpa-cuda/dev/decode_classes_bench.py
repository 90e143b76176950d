"""splitkv decoding at the head-dim classes (issue 21's bar: >= 80 % of the copy bandwidth) against PyTorch,
one run on one GPU.

Our side: the Rust driver `cuda_kernels` (NVRTC modules as users get them, CUDA events, an L2 flush before each
call, median of the reps, the f64 check on a few rows), once per variant: the default build's choice and each
`--variant NAME=VAR=VALUE` (e.g. `cp.async=SDPA_SPLITKV_LOAD=cp.async`, the padded classes' path before their
TMA entries; `s32=SDPA_SPLITKV_SPLITS=32`). PyTorch: `do_bench` medians of its default backend (cuDNN on the
H100) and FLASH_ATTENTION, and the copy ceiling (device-to-device copy, read + write) in the same run, as
fa2_rust_bench.py measures them. Bytes are the call's own (K at D, V at Dv, Q and O).

    python3 sdpa-cuda/dev/decode_classes_bench.py --bench gpu-bundle/cuda_kernels \\
        [--variant cp.async=SDPA_SPLITKV_LOAD=cp.async ...] [--flush dirty|clean] [--out DIR]

Writes decode_classes.json to --out ($OUT by default) and ends with one table.
"""
import argparse
import json
import os

import torch
import torch.nn.functional as F

from sdpa_dev import copy_gbps, env_info, key, log, point, run_points, torch_call_ms, unique_keys

ap = argparse.ArgumentParser()
ap.add_argument("--bench", required=True, help="path of the cuda_kernels benchmark binary")
ap.add_argument("--variant", action="append", default=[],
                help="NAME=VAR=VALUE[+VAR=VALUE...]: ours again with these set")
ap.add_argument("--only", action="append", default=[],
                help="NAME:D[/Dv][@B]: run this variant only at this head dim (and batch) (repeatable; default: "
                     "every point)")
ap.add_argument("--flush", default="dirty", choices=["dirty", "clean"])
ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)

# Issue 21's decoding points: D = 80 (Hkv = Hq at B = 8, GQA 4 at B = 1), MLA 192/128, D = 96 (exact, but not
# whole TMA boxes) and D = 128 for the exact TMA path.
SHAPES = [(8, 32, 32, 4096), (1, 32, 8, 32768)]
DIMS = [(80, 80), (192, 128), (96, 96), (128, 128)]
points = [point(f"decode{d}" + (f"_{dv}" if dv != d else ""), b, hq, hkv, 1, sk, d, "bf16", False, "auto", dv=dv)
          for (d, dv) in DIMS for (b, hq, hkv, sk) in SHAPES]

variants = [("default", {})]
for v in args.variant:
    # NAME=VAR=VALUE[+VAR=VALUE...]
    name, assigns = v.split("=", 1)
    variants.append((name, dict(a.split("=", 1) for a in assigns.split("+"))))
only = {}
for o in args.only:
    name, dims = o.split(":")
    dims, _, b = dims.partition("@")
    d, _, dv = dims.partition("/")
    only.setdefault(name, []).append((int(d), int(dv or d), int(b) if b else None))


def wanted(name, p):
    """Whether variant `name` runs at point `p` (its --only list, or every point)."""
    return name not in only or any((d, dv) == (p["d"], p.get("dv", p["d"])) and b in (None, p["b"])
                                   for d, dv, b in only[name])

res = dict(env=env_info(), flush=args.flush, ceilings={}, records=[])
log("ENV", json.dumps(res["env"]))
ours = {}
for name, env in variants:
    pts = [p for p in points if wanted(name, p)]
    recs = run_points(args.bench, pts, f"decode_classes_{name}.json", warmup=10, reps=50, flush=args.flush,
                      env=env, on_error="none") or []
    for r in recs:
        r["variant"], r["variant_env"] = name, env
    ours[name] = recs
    log(f"ours {name}: {len(recs)} records")

res["ceilings"]["d2d_GBps"] = copy_gbps()
log("CEILINGS", json.dumps(res["ceilings"]))

torch_ms = {}
for shape in unique_keys(points):
    b, hq, hkv, sq, sk, d, _, mask, dv = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, hq, sq, d, device="cuda", generator=g, dtype=torch.bfloat16)
    k = torch.randn(b, hkv, sk, d, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn(b, hkv, sk, dv, device="cuda", generator=g, dtype=torch.bfloat16)
    fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv)  # noqa: E731
    torch_ms[shape] = torch_call_ms(fn, lambda name, e: log("torch", name, "refused", shape, repr(e)[:60]))
    del q, k, v
    torch.cuda.empty_cache()

copy = res["ceilings"]["d2d_GBps"]
for name, recs in ours.items():
    for rec in recs:
        t = torch_ms[key(rec)]
        ms = rec.get("median_ms")
        rec["torch_flash_ms"], rec["torch_default_ms"] = t["flash"], t["default"]
        rec["x_flash"] = t["flash"] / ms if (ms and t["flash"]) else None
        rec["x_default"] = t["default"] / ms if (ms and t["default"]) else None
        rec["frac_copy_bw"] = rec["gbps"] / copy if rec.get("gbps") else None
        res["records"].append(rec)
for shape, t in torch_ms.items():
    # PyTorch's own fraction of the copy bandwidth, from the same byte count as ours.
    mine = next((r for r in res["records"] if key(r) == shape and r.get("gbps") and r.get("median_ms")), None)
    if mine and t["default"]:
        t["default_frac_copy"] = mine["gbps"] * mine["median_ms"] / t["default"] / copy
res["torch"] = [dict(shape=list(s), **t) for s, t in torch_ms.items()]
with open(os.path.join(args.out, "decode_classes.json"), "w") as f:
    json.dump(res, f, indent=1)


def fm(x, spec):
    return "-" if x is None else format(x, spec)


log(f"\ncopy {copy:.0f} GB/s, flush {args.flush}")
log(f"{'variant':10} {'D/Dv':8} {'B':>2} {'Hq/Hkv':7} {'Sk':>6} {'us':>7} {'of copy':>7} {'x dflt':>6} {'x flash':>7} "
    f"{'dflt us':>7} {'dflt of copy':>12} ok")
for rec in res["records"]:
    t = torch_ms[key(rec)]
    ms = rec.get("median_ms")
    log(f"{rec['variant']:10} {str(rec['d']) + '/' + str(rec.get('dv', rec['d'])):8} {rec['b']:>2} "
        f"{str(rec['hq']) + '/' + str(rec['hkv']):7} {rec['sk']:>6} {fm(ms and ms * 1e3, '7.1f'):>7} "
        f"{fm(rec['frac_copy_bw'], '7.2f'):>7} {fm(rec['x_default'], '6.3f'):>6} {fm(rec['x_flash'], '7.3f'):>7} "
        f"{fm(t['default'] and t['default'] * 1e3, '7.1f'):>7} {fm(t.get('default_frac_copy'), '12.2f'):>12} "
        f"{'y' if rec.get('check_pass') else 'N'} {','.join(rec.get('programs', [])) or rec.get('error', '')[:40]}")
