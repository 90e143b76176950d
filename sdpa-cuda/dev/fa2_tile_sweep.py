"""Tile candidates for fa2's head-dim classes, through the Rust backend against PyTorch's FLASH_ATTENTION, in
one run on one GPU: each candidate `bm,bn,warps,stages` is forced with SDPA_FA2_TILE (src/kernels/fa2.rs
`forced_tile`) on the grid of issue 21 (bf16, 16k tokens, H = 2048/D or 16, causal and not), so the table of
`tile_for` can be chosen by measurement.

    python3 sdpa-cuda/dev/fa2_tile_sweep.py --bench gpu-bundle/cuda_kernels --dims 160,192,224 \\
        --tiles '64,64,4,1;128,64,8,1;128,64,8,2' [--dv 128] [--seqs 1024,4096,16384] [--out DIR]

Writes fa2_tile_sweep.json (every record, with the tile and `x_flash`) and prints, per head dim, each tile's
median and minimum ratio against flash (`--dv`: V's head dim for every point, against PyTorch's default
backend then, since flash refuses Dv != D).
"""
import argparse
import json
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from sdpa_dev import bench, env_info, key, log, point, run_points, unique_keys

ap = argparse.ArgumentParser()
ap.add_argument("--bench", required=True)
ap.add_argument("--dims", default="160,192,224")
ap.add_argument("--dv", type=int, default=None)
ap.add_argument("--tiles", required=True, help="';'-separated bm,bn,warps,stages candidates")
ap.add_argument("--seqs", default="1024,4096,16384")
ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)

points = []
for d in map(int, args.dims.split(",")):
    h = 2048 // d if 2048 % d == 0 else 16
    for causal in [False, True]:
        for s in map(int, args.seqs.split(",")):
            points.append(point("tile", 16384 // s, h, h, s, s, d, "bf16", causal, "fa2", dv=args.dv))

torch_ms = {}
for shape in unique_keys(points):
    b, hq, hkv, sq, sk, d, _, mask, dv = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k = (torch.randn(b, h, s, d, device="cuda", generator=g, dtype=torch.bfloat16) for h, s in ((hq, sq), (hkv, sk)))
    v = torch.randn(b, hkv, sk, dv, device="cuda", generator=g, dtype=torch.bfloat16)
    fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=mask == "causal")
    if dv == d:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            torch_ms[shape] = bench(fn)
    else:
        torch_ms[shape] = bench(fn)
    del q, k, v

res = dict(env=env_info(date=False), records=[])
for tile in args.tiles.split(";"):
    recs = run_points(args.bench, points, "fa2_tile_raw.json", warmup=10, reps=50,
                      env={"SDPA_FA2_TILE": tile}, on_error="none") or []
    for r in recs:
        r["tile"] = tile
        t = torch_ms[key(r)]
        r["torch_ms"] = t
        r["x_torch"] = t / r["median_ms"] if r.get("median_ms") else None
        res["records"].append(r)
json.dump(res, open(os.path.join(args.out, "fa2_tile_sweep.json"), "w"), indent=1)

against = "flash" if args.dv is None else "default"
log(f"{'D':>3} {'tile':14} {'c':1} " + " ".join(f"{'S=' + s:>12}" for s in args.seqs.split(",")))
for d in map(int, args.dims.split(",")):
    for tile in args.tiles.split(";"):
        for causal in ["none", "causal"]:
            row = [r for r in res["records"] if r["d"] == d and r["tile"] == tile and r["mask"] == causal]
            cells = " ".join(f"{(r['x_torch'] or 0):6.3f}{'' if r.get('check_pass') else '!'}{r.get('median_ms', 0):6.2f}"
                             if r.get("median_ms") else f"{'ERR ' + r.get('error', '')[:8]:>12}" for r in row)
            log(f"{d:3} {tile:14} {int(causal == 'causal')} {cells}")
    for tile in args.tiles.split(";"):
        x = sorted(r["x_torch"] for r in res["records"] if r["d"] == d and r["tile"] == tile and r.get("x_torch"))
        if x:
            log(f"D={d} tile {tile}: x {against} median {x[len(x) // 2]:.3f} min {x[0]:.3f}")
