"""fa2 / splitkv through the Rust backend against PyTorch's SDPA, in one run on one GPU.

Our kernels are timed by the foundation's Rust driver `cuda_kernels` (sdpa-cuda/benches/cuda_kernels.rs:
NVRTC-compiled modules as users get them, CUDA events, L2 flushed before each call, median of the reps,
output checked against the f64 reference on a few rows). PyTorch is timed here with
`triton.testing.do_bench` medians, as ../shared/tools/gpu_anchors.py does: the FLASH_ATTENTION backend and
the default backend (cuDNN on the H100). The same run measures the ceilings: device-to-device copy
bandwidth (read + write) and an 8192^3 bf16 GEMM.

    python3 sdpa-cuda/dev/fa2_rust_bench.py --bench path/to/cuda_kernels [--quick] [--out DIR]

Writes fa2_rust_bench.json to --out ($OUT by default) and prints the tables and the issue's targets.
"""
import argparse
import json
import os

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from sdpa_dev import copy_gbps, env_info, gemm_tflops, key, log, point, run_points, torch_sdpa_ms, unique_keys

ap = argparse.ArgumentParser()
ap.add_argument("--bench", required=True, help="path of the cuda_kernels benchmark binary")
ap.add_argument("--quick", action="store_true")
ap.add_argument("--decode-only", action="store_true", help="only the decoding and GQA points")
ap.add_argument("--tiny", action="store_true", help="also issue 4's tiny shapes (B=1, H=1, S=64/128/512, D=64, bf16)")
ap.add_argument("--headdims", action="store_true",
                help="only issue 21's head-dim grid: fa2 at D = 32..256 (16k tokens, H = 2048/D or 16), MLA 192/128, "
                     "decoding at D = 80 and 192/128")
ap.add_argument("--odd", action="store_true",
                help="only issue 21's head dims that are not multiples of 8: D = 33, 65, 100, 127 (auto: fa2's pad-copy "
                     "path by its rule) against the same calls with SDPA_FA2_PAD_COPY=0 (the narrow path), fa2 at the "
                     "next multiple of 8 (40, 72, 104, 128) and PyTorch; B = 4, H = 16, S = 4k, causal and not, and "
                     "B = 32, S = 512 causal; bf16; PyTorch's default backend named by the kernels it launched")
ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)


pt = point


points = []
seqs = [512, 2048, 8192] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]
for d in ([32, 40, 64, 80, 96, 128, 160, 192, 224, 256] if args.headdims else []):
    h = 2048 // d if 2048 % d == 0 else 16
    for causal in [False, True]:
        for s in ([1024, 4096, 16384] if args.quick else [1024, 2048, 4096, 8192, 16384]):
            points.append(pt("headdim", 16384 // s, h, h, s, s, d, "bf16", causal, "auto"))
ODD = {33: 40, 65: 72, 100: 104, 127: 128}
for d in (sorted(ODD) if args.odd else []):
    for (b, s, causal) in [(4, 4096, False), (4, 4096, True), (32, 512, True)]:
        points.append(pt("odd", b, 16, 16, s, s, d, "bf16", causal, "auto"))
        points.append(pt("odd_next8", b, 16, 16, s, s, ODD[d], "bf16", causal, "fa2"))
for s in ([1024, 4096, 16384] if args.headdims else []):
    points.append(pt("mla", 16384 // s, 16, 16, s, s, 192, "bf16", True, "auto", dv=128))
for (b, hq, hkv, sk) in ([(8, 32, 32, 4096), (1, 32, 8, 32768)] if args.headdims else []):
    points.append(pt("decode80", b, hq, hkv, 1, sk, 80, "bf16", False, "auto"))
    points.append(pt("decode_mla", b, hq, hkv, 1, sk, 192, "bf16", False, "auto", dv=128))
for dtype in ([] if args.decode_only or args.headdims or args.odd else ["bf16"] if args.quick else ["bf16", "f16"]):
    for d in [64, 128]:
        for causal in [False, True]:
            for s in seqs:
                points.append(pt("fa2bench", 16384 // s, 2048 // d, 2048 // d, s, s, d, dtype, causal, "fa2"))
for (b, hq, hkv, sk) in ([] if args.headdims or args.odd else [(8, 32, 32, 4096), (1, 32, 8, 32768)]):
    for k in ["splitkv", "auto", "fa2"]:
        points.append(pt("decode", b, hq, hkv, 1, sk, 128, "bf16", False, k))
if not (args.headdims or args.odd):
    points.append(pt("gqa_prefill", 1, 32, 8, 4096, 4096, 128, "bf16", True, "fa2"))
for s in ([64, 128, 512] if args.tiny else []):
    for k in ["auto", "fa2", "splitkv"]:
        points.append(pt("tiny", 1, 1, 1, s, s, 64, "bf16", False, k))
    points.append(pt("tiny", 1, 1, 1, s, s, 128, "bf16", False, "auto"))

res = dict(env=env_info(date=False), ceilings={}, records=[])
log("ENV", json.dumps(res["env"]))

log(f"timing {len(points)} points of ours through the Rust backend ...")
ours = run_points(args.bench, points, "fa2_rust_raw.json", warmup=10, reps=50)
if args.odd:
    # The same odd calls on the narrow path (2-byte copies inside fa2), in the same run: the pad-copy A/B.
    narrow = [dict(p, tag="odd_narrow") for p in points if p["tag"] == "odd"]
    log(f"timing {len(narrow)} odd points with SDPA_FA2_PAD_COPY=0 ...")
    ours += run_points(args.bench, narrow, "fa2_rust_raw_narrow.json", warmup=10, reps=50,
                       env={"SDPA_FA2_PAD_COPY": "0"})

# Ceilings, in the same run.
res["ceilings"]["d2d_GBps"] = copy_gbps()
res["ceilings"]["gemm_bf16_TFLOPs"] = gemm_tflops(torch.bfloat16)
log("CEILINGS", json.dumps(res["ceilings"]))

dt = {"bf16": torch.bfloat16, "f16": torch.float16}


def torch_kernels(fn):
    """The CUDA kernels one call of `fn` launches (names cut to 60 characters), from the profiler: which backend
    PyTorch's default picked, and whether it padded the head dim first (extra copy or pad kernels)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name[:60] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})


def backend_of(kernels):
    """A short name for what PyTorch ran: flash, cudnn, efficient (CUTLASS memory-efficient), or math."""
    text = " ".join(kernels).lower()
    for name, marks in [("cudnn", ["cudnn", "sdpa_sm90", "fort_native"]), ("flash", ["flash"]),
                        ("efficient", ["fmha", "cutlass", "efficient"])]:
        if any(m in text for m in marks):
            return name
    return "math"


def kernels_of(shape, fn):
    """--odd: the kernels PyTorch's FLASH backend and its default choice launch for the call `fn`."""
    out = {}
    for name, be in [("flash", SDPBackend.FLASH_ATTENTION), ("default", None)]:
        try:
            if be is None:
                out[name + "_kernels"] = torch_kernels(fn)
            else:
                with sdpa_kernel([be]):
                    out[name + "_kernels"] = torch_kernels(fn)
        except Exception as e:  # noqa: BLE001 - a backend refusing a shape is a data point
            out[name + "_kernels"] = [f"failed: {e!r}"[:80]]
    return out


torch_ms = torch_sdpa_ms(unique_keys(ours), [("flash", SDPBackend.FLASH_ATTENTION), ("default", None)],
                         also=kernels_of if args.odd else None)

gemm = res["ceilings"]["gemm_bf16_TFLOPs"]
for rec in ours:
    t = torch_ms[key(rec)]
    rec["torch_flash_ms"], rec["torch_default_ms"] = t["flash"], t["default"]
    if args.odd:
        rec["torch_flash_kernels"], rec["torch_default_kernels"] = t.get("flash_kernels"), t.get("default_kernels")
        rec["torch_default_backend"] = backend_of(t.get("default_kernels") or [])
    ms = rec.get("median_ms")
    rec["x_flash"] = t["flash"] / ms if (ms and t["flash"]) else None
    rec["x_default"] = t["default"] / ms if (ms and t["default"]) else None
    rec["frac_gemm_bf16"] = rec["tflops"] / gemm if rec.get("tflops") else None
    rec["frac_copy_bw"] = rec["gbps"] / res["ceilings"]["d2d_GBps"] if rec.get("gbps") else None
    res["records"].append(rec)
json.dump(res, open(os.path.join(args.out, "fa2_rust_bench.json"), "w"), indent=1)


def fm(x, spec="6.1f"):
    return "    -" if x is None else format(x, spec)


log(f"\n{'tag':11} {'kernel':7} {'ran':7} {'dt':4} {'B':>3} {'H':>5} {'Sq':>5} {'Sk':>5} {'D':>3} {'c':1} "
    f"{'ms':>8} {'TFLOPS':>6} {'GB/s':>6} {'xflash':>6} {'xdflt':>6} {'gemm%':>5} {'ok':2}")
for rec in res["records"]:
    log(f"{rec['tag']:11} {rec['kernel']:7} {rec.get('kernel_ran', 'ERR'):7} {rec['dtype']:4} {rec['b']:>3} "
        f"{rec['hq']:>2}/{rec['hkv']:<2} {rec['sq']:>5} {rec['sk']:>5} {rec['d']:>3} {int(rec['mask'] == 'causal')} "
        f"{fm(rec.get('median_ms'), '8.4f')} {fm(rec.get('tflops'))} {fm(rec.get('gbps'), '6.0f')} "
        f"{fm(rec['x_flash'], '6.3f')} {fm(rec['x_default'], '6.3f')} "
        f"{fm(100 * rec['frac_gemm_bf16'] if rec['frac_gemm_bf16'] else None, '5.1f')} "
        f"{'y' if rec.get('check_pass') else 'N'}{(' ' + rec['error'][:60]) if rec.get('error') else ''}")

log("\ntargets")
hd = [r for r in res["records"] if r["tag"] == "headdim"]
for d in sorted({r["d"] for r in hd}):
    xf = sorted(r["x_flash"] for r in hd if r["d"] == d and r["x_flash"])
    ok = all(r.get("check_pass") for r in hd if r["d"] == d)
    ran = sorted({r.get("kernel_ran", "ERR") for r in hd if r["d"] == d})
    if xf:
        log(f"headdim D={d:3}: vs flash median {xf[len(xf) // 2]:.3f} min {xf[0]:.3f} over {len(xf)} points, ran {ran}, checks {ok}")
xf = sorted(r["x_flash"] for r in hd if r["x_flash"])
if xf:
    log(f"headdim grid: vs flash median {xf[len(xf) // 2]:.3f} (>= 1.0) min {xf[0]:.3f} (>= 0.9)")
odd = {(r["d"], r["mask"], r["sq"]): r for r in res["records"] if r["tag"] == "odd"}
nxt = {(r["d"], r["mask"], r["sq"]): r for r in res["records"] if r["tag"] == "odd_next8"}
nar = {(r["d"], r["mask"], r["sq"]): r for r in res["records"] if r["tag"] == "odd_narrow"}
if odd:
    # x: the other time over this row's (pad-copy by the rule); > 1: the pad-copy call is faster.
    log(f"\n{'D':>3} {'c':1} {'S':>5} {'ran':7} {'ms':>7} {'TFLOPS':>6} | {'narrow':>7} {'x':>5} | {'next8':>5} "
        f"{'fa2 ms':>7} {'x':>5} | {'flash ms':>8} {'x':>5} | {'default':9} {'ms':>7} {'x':>5} | check")
for (d, mask, sq), r in sorted(odd.items()):
    n = nxt.get((ODD[d], mask, sq), {})
    w = nar.get((d, mask, sq), {})
    ms, nms, wms = r.get("median_ms"), n.get("median_ms"), w.get("median_ms")
    log(f"{d:>3} {int(mask == 'causal')} {sq:>5} {r.get('kernel_ran', 'ERR'):7} {fm(ms, '7.3f')} {fm(r.get('tflops'))} | "
        f"{fm(wms, '7.3f')} {fm(wms / ms if ms and wms else None, '5.2f')} | "
        f"{ODD[d]:>5} {fm(nms, '7.3f')} {fm(nms / ms if ms and nms else None, '5.2f')} | "
        f"{fm(r['torch_flash_ms'], '8.3f')} {fm(r['x_flash'], '5.2f')} | {r.get('torch_default_backend', '-'):9} "
        f"{fm(r['torch_default_ms'], '7.3f')} {fm(r['x_default'], '5.2f')} | "
        f"{r.get('check_pass')}/{w.get('check_pass')}/{n.get('check_pass')}")
for r in res["records"]:
    if r["tag"] in ("mla", "decode80", "decode_mla"):
        log(f"{r['tag']} B={r['b']} S={r['sq']}/{r['sk']} D={r['d']}/{r.get('dv', r['d'])} ran {r.get('kernel_ran', 'ERR')}: "
            f"{fm(r.get('median_ms'), '.4f')} ms, x default {fm(r['x_default'], '.3f')}, x flash {fm(r['x_flash'], '.3f')}, "
            f"{fm(r.get('frac_copy_bw'), '.2f')} of copy, check {r.get('check_pass')}")
for dname in dt:
    grid = [r for r in res["records"] if r["tag"] == "fa2bench" and r["dtype"] == dname and r["x_flash"]]
    if not grid:
        continue
    xf = sorted(r["x_flash"] for r in grid)
    xd = sorted(r["x_default"] for r in grid if r["x_default"])
    log(f"fa2bench {dname}: vs flash median {xf[len(xf) // 2]:.3f} (>= 1.0) min {xf[0]:.3f} (>= 0.9) | "
        f"vs default (cuDNN) median {xd[len(xd) // 2]:.3f} min {xd[0]:.3f} | all checks pass: "
        f"{all(r.get('check_pass') for r in grid)}")
for r in res["records"]:
    if r["tag"] == "tiny":
        log(f"tiny D={r['d']} S={r['sq']} {r['kernel']:7} ran {r.get('kernel_ran', 'ERR'):7} {fm(r.get('median_ms') and r['median_ms'] * 1e3, '.1f')} us,"
            f" x default {fm(r['x_default'], '.3f')} (>= 1.0), x flash {fm(r['x_flash'], '.3f')}")
for r in res["records"]:
    if r["tag"] == "decode" and r["kernel"] in ("splitkv", "auto"):
        log(f"decode {r['kernel']:7} B={r['b']} Hq={r['hq']} Hkv={r['hkv']} Sk={r['sk']}: {r['median_ms'] * 1e3:.1f} us, "
            f"{r['gbps']:.0f} GB/s = {r['frac_copy_bw']:.2f} of copy (>= 0.85), x default {fm(r['x_default'], '.3f')}"
            f" (>= 1.0), x flash {fm(r['x_flash'], '.3f')}")
