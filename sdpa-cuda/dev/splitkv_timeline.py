"""Where a decoding call's fixed cost goes: the per-block timeline of `splitkv`, against plain reads.

decode_flush_study.py found that at B=1, Hq=32, Hkv=8 (128 blocks) our event-timed time is a straight line
in the K/V bytes with an intercept of ~12 us (clean flush). This script looks inside one launch: it runs
the Rust driver with SDPA_SPLITKV_TRACE=1 (thread 0 of every block writes globaltimer / clock64 stamps,
kernels/splitkv.cu `skv_trace`) and reports, per point:
  - the event-timed median (traced run, clean flush) and the kernel's own span (first block entry to last
    block exit, globaltimer): the difference is launch latency;
  - the spread of block entries, the time from entry to the first K/V stage landing, the spread of the key
    loops' ends (imbalance between blocks), and the time from the last loop end to the kernel's end (the
    partial write, the counter and the last block's merge);
and times PyTorch's plain read (`sum`) and copy of the same bytes at each size, for the same line fit
(sdpa_dev.py's time_events: the same clean flush and event loop as decode_flush_study.py).

    python3 sdpa-cuda/dev/splitkv_timeline.py --bench gpu-bundle/cuda_kernels [--out DIR]
"""
import argparse
import json
import os
import statistics

import torch

import sdpa_dev
from sdpa_dev import kv_bytes, log, run_points

ap = argparse.ArgumentParser()
ap.add_argument("--bench", required=True)
ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
ap.add_argument("--splits", default="64", help="SDPA_SPLITKV_SPLITS for the B=1 sweep points")
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)
tdir = os.path.join(args.out, "trace")
os.makedirs(tdir, exist_ok=True)


SWEEP = [8192, 32768, 131072]
points = [sdpa_dev.point("decode", 1, 32, 8, 1, sk, 128, "bf16", False, "auto") for sk in SWEEP]
recs = run_points(args.bench, points, os.path.join(tdir, "records.json"), 10, 100, flush="clean",
                  env=dict(SDPA_SPLITKV_TRACE="1", SDPA_SPLITKV_SPLITS=args.splits, SDPA_SPLITKV_L2="first"),
                  extra=["--trace", tdir])
clean = sdpa_dev.flush("clean")


def time_events(fn):
    """Median us after the clean flush the traced run used."""
    return sdpa_dev.time_events(fn, clean) * 1e3


res = dict(points=[])
for n, (p, rec) in enumerate(zip(points, recs)):
    blocks = json.load(open(os.path.join(tdir, f"trace-{n}.json")))
    # fields: 0 gt_entry, 1 gt_exit, 2 clk_entry, 3 clk_first, 4 clk_loop, 5 clk_part, 6 clk_exit, 7 smid, 8 last
    t0 = min(b[0] for b in blocks)
    span = (max(b[1] for b in blocks) - t0) / 1e3
    ghz = statistics.median((b[6] - b[2]) / (b[1] - b[0]) for b in blocks if b[1] > b[0])
    us = lambda cyc: cyc / ghz / 1e3
    entry = [(b[0] - t0) / 1e3 for b in blocks]
    first = [us(b[3] - b[2]) for b in blocks if b[3]]  # 0: not stamped (the cp.async path)
    first = first or [float("nan")]
    loop_end = [(b[0] - t0) / 1e3 + us(b[4] - b[2]) for b in blocks]
    part = [us(b[5] - b[4]) for b in blocks]
    merge = [us(b[6] - b[5]) for b in blocks if b[8] == 1]
    kv = kv_bytes(p)
    x = torch.empty(kv // 2, dtype=torch.bfloat16, device="cuda").normal_()
    y = torch.empty_like(x)
    row = dict(sk=p["sk"], kv_bytes=kv, blocks=len(blocks), sms=len({b[7] for b in blocks}), event_us=rec["median_ms"] * 1e3,
               span_us=span, sm_ghz=ghz, entry_spread_us=max(entry), first_stage_us=[min(first), statistics.median(first), max(first)],
               loop_end_us=[min(loop_end), statistics.median(loop_end), max(loop_end)],
               part_us=statistics.median(part), merge_us=[min(merge), max(merge)] if merge else None,
               tail_after_last_loop_us=span - max(loop_end), check_pass=rec.get("check_pass"),
               torch_read_us=time_events(lambda: x.sum(dtype=torch.float32)), torch_copy_us=time_events(lambda: y.copy_(x)))
    del x, y
    res["points"].append(row)
json.dump(res, open(os.path.join(args.out, "splitkv_timeline.json"), "w"), indent=1)

log(f"{'Sk':>6} {'MB':>5} {'blk':>4} {'SMs':>4} {'event':>6} {'span':>6} {'GHz':>5} {'entry':>5} {'first stage min/med/max':>24} "
    f"{'loop end min/med/max':>21} {'part':>5} {'merge':>11} {'tail':>5} {'read':>6} {'copy':>6} ok")
for r in res["points"]:
    fs, le = r["first_stage_us"], r["loop_end_us"]
    mg = f"{r['merge_us'][0]:.1f}-{r['merge_us'][1]:.1f}" if r["merge_us"] else "-"
    log(f"{r['sk']:>6} {r['kv_bytes'] / 1e6:5.0f} {r['blocks']:>4} {r['sms']:>4} {r['event_us']:6.1f} {r['span_us']:6.1f} "
        f"{r['sm_ghz']:5.2f} {r['entry_spread_us']:5.1f} {fs[0]:7.1f} {fs[1]:7.1f} {fs[2]:7.1f}  {le[0]:6.1f} {le[1]:6.1f} {le[2]:6.1f} "
        f"{r['part_us']:5.1f} {mg:>11} {r['tail_after_last_loop_us']:5.1f} {r['torch_read_us']:6.1f} {r['torch_copy_us']:6.1f} "
        f"{'y' if r['check_pass'] else 'N'}")
