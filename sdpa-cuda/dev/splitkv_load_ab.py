"""splitkv's load paths (SDPA_SPLITKV_LOAD = tma / bulk / cp.async) and split counts, A/B in one run on one GPU.

Alternating rounds: each round times every variant through the Rust backend (`cuda_kernels --points`, median
of --reps event-timed calls after an L2 flush each, output checked against the f64 reference) and PyTorch's
default backend (cuDNN on the H100) with `triton.testing.do_bench`, on the issue's decoding shapes. The copy
ceiling (read + write) is measured once. Prints the per-variant medians over the rounds and writes
splitkv_load_ab.json to --out.

    python3 sdpa-cuda/dev/splitkv_load_ab.py --bench gpu-bundle/cuda_kernels \
        [--variants tma,bulk,cp.async,tma:s=2] [--rounds 3] [--out DIR]

A variant is a load path, optionally with `:s=N` to force N splits (SDPA_SPLITKV_SPLITS), `:l2=first|normal|last`
to force the L2 policy of the K/V loads (SDPA_SPLITKV_L2) and `:bin=NAME` to time another build given as
`--alt NAME=PATH`.
"""
import argparse
import json
import os
import statistics

import torch
import torch.nn.functional as F

import sdpa_dev
from sdpa_dev import bench, kv_bytes, point, run_points, write_points

ap = argparse.ArgumentParser()
ap.add_argument("--bench", required=True)
ap.add_argument("--variants", default="tma,bulk,cp.async")
ap.add_argument("--alt", action="append", default=[], help="NAME=PATH: another cuda_kernels build, for `:bin=NAME`")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--reps", type=int, default=50)
ap.add_argument("--shapes", default="8,32,32,4096;1,32,8,32768", help="B,Hq,Hkv,Sk;... (bf16, D=128, Sq=1)")
ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)

shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes.split(";")]
points = [point("decode", b, hq, hkv, 1, sk, 128, "bf16", False, "splitkv") for (b, hq, hkv, sk) in shapes]
pfile = write_points(points)


def ours(variant):
    # The variant's settings only: SDPA_SPLITKV_SPLITS and _L2 from the caller's environment do not leak in.
    for key in ("SDPA_SPLITKV_SPLITS", "SDPA_SPLITKV_L2"):
        os.environ.pop(key, None)
    load, *opts = variant.split(":")
    env = {"SDPA_SPLITKV_LOAD": load}
    binary = args.bench
    for o in opts:
        k, _, val = o.partition("=")
        if k == "bin":
            binary = dict(a.split("=", 1) for a in args.alt)[val]
            continue
        env[{"s": "SDPA_SPLITKV_SPLITS", "l2": "SDPA_SPLITKV_L2"}[k]] = val
    recs = run_points(binary, pfile, "skv_ab.json", 10, args.reps, env=env, on_error="none")
    return recs if recs is not None else [dict(error="failed")] * len(points)


copy_gbps = sdpa_dev.copy_gbps()

variants = args.variants.split(",")
rows = {(v, i): [] for v in variants for i in range(len(points))}
torch_us = {i: [] for i in range(len(points))}
checks = {}
for rnd in range(args.rounds):
    for v in variants:
        for i, rec in enumerate(ours(v)):
            if rec.get("median_ms"):
                rows[(v, i)].append(rec["median_ms"] * 1e3)
            checks[(v, i)] = checks.get((v, i), True) and bool(rec.get("check_pass"))
    for i, p in enumerate(points):
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(p["b"], p["hq"], 1, 128, device="cuda", generator=g, dtype=torch.bfloat16)
        k = torch.randn(p["b"], p["hkv"], p["sk"], 128, device="cuda", generator=g, dtype=torch.bfloat16)
        v_ = torch.randn(p["b"], p["hkv"], p["sk"], 128, device="cuda", generator=g, dtype=torch.bfloat16)
        fn = lambda: F.scaled_dot_product_attention(q, k, v_, enable_gqa=p["hq"] != p["hkv"])  # noqa: E731
        torch_us[i].append(bench(fn) * 1e3)
        del q, k, v_
        torch.cuda.empty_cache()
    print(f"round {rnd + 1}: " + "  ".join(f"{v}/{i}={rows[(v, i)][-1]:.1f}" for (v, i) in rows if rows[(v, i)])
          + "  torch " + " ".join(f"{torch_us[i][-1]:.1f}" for i in torch_us), flush=True)

res = dict(copy_GBps=copy_gbps, rounds=args.rounds, reps=args.reps, points=points, results=[])
print(f"\ncopy ceiling {copy_gbps:.0f} GB/s (read + write)")
print(f"{'variant':14} {'shape':22} {'us (median of rounds)':>22} {'rounds':>24} {'x default':>9} {'of copy':>7} check")
for i, p in enumerate(points):
    t_def = statistics.median(torch_us[i])
    nbytes = kv_bytes(p)
    for v in variants:
        ts = rows[(v, i)]
        if not ts:
            print(f"{v:14} point {i}: failed")
            continue
        med = statistics.median(ts)
        frac = nbytes / (med * 1e-6) / 1e9 / copy_gbps
        shape = f"B={p['b']} H={p['hq']}/{p['hkv']} Sk={p['sk']}"
        print(f"{v:14} {shape:22} {med:22.1f} {' '.join(f'{t:.1f}' for t in ts):>24} {t_def / med:9.3f} {frac:7.3f}"
              f" {'y' if checks[(v, i)] else 'N'}")
        res["results"].append(dict(variant=v, point=i, us=ts, median_us=med, torch_default_us=torch_us[i],
                                   x_default=t_def / med, frac_copy=frac, check_pass=checks[(v, i)]))
    print(f"{'torch default':14} {'':22} {t_def:22.1f} {' '.join(f'{t:.1f}' for t in torch_us[i]):>24}")
json.dump(res, open(os.path.join(args.out, "splitkv_load_ab.json"), "w"), indent=1)
