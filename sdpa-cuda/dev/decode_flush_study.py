"""Decoding under two L2 flushes: what the timing protocol charges a call that reads ~100 MB.

`do_bench` (and our Rust driver by default) writes 256 MB before each timed call. That leaves L2 (50 MB on
the H100) full of dirty lines, and a call that streams more than L2 holds pays for writing them back inside
its timed region: for B=1, Hkv=8, Sk=32k (134 MB of K/V) that is up to ~37 % more DRAM traffic than the
call itself moves, while the 1 GiB copy that sets the bandwidth ceiling barely notices it (2 GiB moved).
This script times the same calls after a *dirty* flush (256 MB written) and after a *clean* one (256 MB
read: L2 then holds clean lines only, as Nsight Compute's cache control leaves it), for:
  - ours, through the Rust driver `cuda_kernels --flush dirty|clean` (the kernel `auto` picks);
  - PyTorch's default SDPA backend (cuDNN on the H100) and FLASH_ATTENTION, with the same event loop;
  - the ceilings of the issue: a 1 GiB device-to-device copy (bytes read + written), and, per shape, a copy
    and a read (one `sum`) of exactly the decoding call's K/V bytes;
  - a sweep of Sk at B=1, Hq=32, Hkv=8 with the split count held at 64 (128 blocks) and the loads marked
    evict-first, both as at Sk=32k, so that a straight line through time against bytes separates the
    streaming rate from the fixed cost of a call.
PyTorch is also timed with `do_bench` itself (dirty), to show that the event loop here agrees with it.

    python3 sdpa-cuda/dev/decode_flush_study.py --bench gpu-bundle/cuda_kernels [--out DIR]

Writes decode_flush_study.json under --out ($OUT by default) and prints the tables last.
"""
import argparse
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import sdpa_dev
from sdpa_dev import FLUSHES, bench, kv_bytes, log, run_points

ap = argparse.ArgumentParser()
ap.add_argument("--bench", required=True, help="path of the cuda_kernels benchmark binary")
ap.add_argument("--base", help="a second cuda_kernels binary (an earlier kernel) timed in alternation")
ap.add_argument("--rounds", type=int, default=2)
ap.add_argument("--reps", type=int, default=100)
ap.add_argument("--warmup", type=int, default=10)
ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)


FLUSH = {fl: sdpa_dev.flush(fl) for fl in FLUSHES}


def time_events(fn, flush):
    return sdpa_dev.time_events(fn, flush, reps=args.reps, warmup=args.warmup)


def pt(tag, b, hq, hkv, sk):
    return sdpa_dev.point(tag, b, hq, hkv, 1, sk, 128, "bf16", False, "auto")


shapes = [pt("decode", 8, 32, 32, 4096), pt("decode", 1, 32, 8, 32768)]
sweep = [pt("sweep", 1, 32, 8, sk) for sk in [8192, 16384, 32768, 65536, 131072]]


def run_ours(points, flush, env_extra, binary=None):
    return run_points(binary or args.bench, points, f"ours_{flush}.json", args.warmup, args.reps, flush=flush,
                      env=env_extra)


res = dict(env=dict(torch=torch.__version__, name=torch.cuda.get_device_name(), argv=sys.argv,
                    reps=args.reps, warmup=args.warmup), ceilings={}, shapes=[], sweep=[])
log("ENV", json.dumps(res["env"]))

# Ours first (the Rust driver opens its own context), in alternating rounds so the spread shows; the base
# binary (if any) on the decoding shapes only.
ours, base = {}, {}
for rnd in range(args.rounds):
    for fl in FLUSHES:
        if args.base:
            for rec in run_ours(shapes, fl, {}, args.base):
                base.setdefault((rec["b"], rec["sk"], fl), []).append(rec)
        for rec in run_ours(shapes, fl, {}) + run_ours(sweep, fl, {"SDPA_SPLITKV_SPLITS": "64", "SDPA_SPLITKV_L2": "first"}):
            ours.setdefault((rec["tag"], rec["b"], rec["sk"], fl), []).append(rec)

# Ceilings under both flushes: the 1 GiB copy of the target, and do_bench's own figure for it.
x = torch.empty(2**30, dtype=torch.uint8, device="cuda")
y = torch.empty_like(x)
for fl in FLUSHES:
    res["ceilings"][f"copy_1GiB_{fl}_GBps"] = 2 * x.numel() / time_events(lambda: y.copy_(x), FLUSH[fl]) / 1e6
res["ceilings"]["copy_1GiB_do_bench_GBps"] = 2 * x.numel() / bench(lambda: y.copy_(x), warmup=25, rep=200) / 1e6
del x, y
torch.cuda.empty_cache()
log("CEILINGS", json.dumps(res["ceilings"]))


def torch_side(p):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(p["b"], p["hq"], 1, p["d"], device="cuda", generator=g, dtype=torch.bfloat16)
    k = torch.randn(p["b"], p["hkv"], p["sk"], p["d"], device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kv = torch.cat([k.flatten(), v.flatten()])
    kv2 = torch.empty_like(kv)
    gqa = p["hq"] != p["hkv"]
    sdpa = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    out = {}
    for fl in FLUSHES:
        out[f"cudnn_{fl}_ms"] = time_events(sdpa, FLUSH[fl])
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            out[f"flash_{fl}_ms"] = time_events(sdpa, FLUSH[fl])
        out[f"copy_same_{fl}_ms"] = time_events(lambda: kv2.copy_(kv), FLUSH[fl])
        out[f"read_same_{fl}_ms"] = time_events(lambda: kv.sum(dtype=torch.float32), FLUSH[fl])
    out["cudnn_do_bench_ms"] = bench(sdpa)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        out["flash_do_bench_ms"] = bench(sdpa)
    del q, k, v, kv, kv2
    torch.cuda.empty_cache()
    return out


def med(recs, key="median_ms"):
    return statistics.median(r[key] for r in recs)


for p in shapes:
    t = torch_side(p)
    row = dict(b=p["b"], hq=p["hq"], hkv=p["hkv"], sk=p["sk"], kv_bytes=kv_bytes(p), **t)
    for fl in FLUSHES:
        recs = ours[("decode", p["b"], p["sk"], fl)]
        row[f"ours_{fl}_ms"] = med(recs)
        row[f"ours_{fl}_rounds_ms"] = [r["median_ms"] for r in recs]
        row["kernel_ran"] = recs[0].get("kernel_ran")
        row["check_pass"] = all(r.get("check_pass") for r in recs)
        # Bandwidth as the issue counts it: the call's minimal bytes (K, V, Q and O) over its time.
        row[f"ours_{fl}_GBps"] = recs[0]["gbps"] * recs[0]["median_ms"] / row[f"ours_{fl}_ms"]
        row[f"ours_{fl}_frac_copy"] = row[f"ours_{fl}_GBps"] / res["ceilings"][f"copy_1GiB_{fl}_GBps"]
        row[f"ours_{fl}_x_cudnn"] = row[f"cudnn_{fl}_ms"] / row[f"ours_{fl}_ms"]
        row[f"ours_{fl}_x_flash"] = row[f"flash_{fl}_ms"] / row[f"ours_{fl}_ms"]
        if args.base:
            row[f"base_{fl}_rounds_ms"] = [r["median_ms"] for r in base[(p["b"], p["sk"], fl)]]
            row[f"base_{fl}_ms"] = med(base[(p["b"], p["sk"], fl)])
        row[f"cudnn_{fl}_frac_copy"] = (row[f"ours_{fl}_GBps"] * row[f"ours_{fl}_ms"] / row[f"cudnn_{fl}_ms"]
                                        / res["ceilings"][f"copy_1GiB_{fl}_GBps"])
    res["shapes"].append(row)

for p in sweep:
    row = dict(sk=p["sk"], kv_bytes=kv_bytes(p))
    for fl in FLUSHES:
        recs = ours[("sweep", 1, p["sk"], fl)]
        row[f"ours_{fl}_ms"] = med(recs)
        row["check_pass"] = all(r.get("check_pass") for r in recs)
    res["sweep"].append(row)


def fit(xs, ys):
    """Least-squares line y = a + b·x."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


res["sweep_fit"] = {}
for fl in FLUSHES:
    a, b = fit([r["kv_bytes"] for r in res["sweep"]], [r[f"ours_{fl}_ms"] * 1e3 for r in res["sweep"]])
    res["sweep_fit"][fl] = dict(fixed_us=a, stream_GBps=1e-3 / b if b > 0 else None)
json.dump(res, open(os.path.join(args.out, "decode_flush_study.json"), "w"), indent=1)

log("\nceilings: 1 GiB copy " + ", ".join(f"{k} {v:.0f} GB/s" for k, v in res["ceilings"].items()))
log(f"\n{'shape':22} {'flush':5} {'ours us':>8} {'cudnn':>7} {'flash':>7} {'x cudnn':>7} {'frac copy':>9} "
    f"{'cudnn frac':>10} {'copy same':>9} {'read same':>9} ok")
for r in res["shapes"]:
    for fl in FLUSHES:
        log(f"B={r['b']} Hkv={r['hkv']} Sk={r['sk']:<6} {fl:5} {r[f'ours_{fl}_ms'] * 1e3:8.1f} "
            f"{r[f'cudnn_{fl}_ms'] * 1e3:7.1f} {r[f'flash_{fl}_ms'] * 1e3:7.1f} {r[f'ours_{fl}_x_cudnn']:7.3f} "
            f"{r[f'ours_{fl}_frac_copy']:9.3f} {r[f'cudnn_{fl}_frac_copy']:10.3f} "
            f"{r[f'copy_same_{fl}_ms'] * 1e3:9.1f} {r[f'read_same_{fl}_ms'] * 1e3:9.1f} "
            f"{'y' if r['check_pass'] else 'N'}")
    log(f"   rounds (us): dirty {[round(t * 1e3, 1) for t in r['ours_dirty_rounds_ms']]}, clean "
        f"{[round(t * 1e3, 1) for t in r['ours_clean_rounds_ms']]}; by do_bench (dirty): cuDNN "
        f"{r['cudnn_do_bench_ms'] * 1e3:.1f}, flash {r['flash_do_bench_ms'] * 1e3:.1f}, x cuDNN "
        f"{r['cudnn_do_bench_ms'] / r['ours_dirty_ms']:.3f}")
    if args.base:
        log(f"   base binary rounds (us): dirty {[round(t * 1e3, 1) for t in r['base_dirty_rounds_ms']]}, clean "
            f"{[round(t * 1e3, 1) for t in r['base_clean_rounds_ms']]}")
log("\nsweep B=1 Hq=32 Hkv=8, 64 splits: " + ", ".join(
    f"Sk={r['sk']}: {r['ours_dirty_ms'] * 1e3:.1f} / {r['ours_clean_ms'] * 1e3:.1f} us" for r in res["sweep"]))
for fl in FLUSHES:
    f = res["sweep_fit"][fl]
    log(f"fit ({fl}): fixed {f['fixed_us']:.1f} us + bytes at {f['stream_GBps']:.0f} GB/s")
