"""Turns the harness output (tf32dev.json from dev/tf32_bench.py) into the committed result file: one record
per issue-4 point with PyTorch f32 SDPA (time, TFLOPS, error against float64) and, for plain and split TF32,
the configuration the kernel ships (src/kernels/tf32.rs's `tile_for`, given as --ship) plus every
configuration timed; the same-run ceilings; and a summary of the correctness checks.

    python3 sdpa-cuda/dev/tf32_records.py tf32dev.json bench/studies/tf32/tf32-h100.json \
        --ship tf32:64=CFG --ship tf32:128:none=CFG --ship tf32:128:causal=CFG --ship split:64=CFG ...
"""
import argparse
import json

ap = argparse.ArgumentParser()
ap.add_argument("src")
ap.add_argument("dst")
ap.add_argument("--ship", action="append", default=[],
                help="mode:D[:none|causal]=cfg, the configuration the module ships (per mask where it differs)")
a = ap.parse_args()
res = json.load(open(a.src))
ship = {}
for s in a.ship:
    k, v = s.split("=")
    mode, d, *mask = k.split(":")
    ship[(mode, int(d)) + tuple(mask)] = v
ceil = res["ceilings"]
points = []
for r in res["bench"]:
    tflops_torch = r["flops"] / r["torch_ms"] / 1e9
    p = dict(tag=r["tag"], B=r["B"], Hq=r["Hq"], Hkv=r["Hkv"], S=r["S"], D=r["D"], causal=r["causal"],
             torch=dict(ms=r["torch_ms"], tflops=tflops_torch, rel_err_vs_f64=r["torch_err"]))
    for mode in ("tf32", "split"):
        cfg = ship.get((mode, r["D"], "causal" if r["causal"] else "none"), ship.get((mode, r["D"])))
        o = r["ours"].get(f"{mode}:{cfg}") if cfg else None
        if o:
            p[mode] = dict(config=cfg, ms=o["ms"], tflops=o["tflops"], rel_err_vs_f64=o["rel_err"],
                           x_torch=o["x_torch"], frac_tf32_gemm=o["tflops"] * (3 if mode == "split" else 1)
                           / ceil["gemm_tf32_TFLOPs"])
        p[f"{mode}_all_configs"] = {k.split(":", 1)[1]: dict(ms=v["ms"], tflops=v["tflops"], rel_err=v["rel_err"])
                                    for k, v in r["ours"].items() if k.startswith(mode + ":")}
    points.append(p)
checks = res.get("checks", [])
out = dict(env=res["env"], ceilings=ceil,
           note="x_torch = PyTorch f32 SDPA time / ours, same run; errors are relative L2 against float64 on "
                "batch element 0; frac_tf32_gemm counts split TF32 as 3 TF32 products per FLOP",
           checks=dict(total=len(checks), passed=sum(c["ok"] for c in checks),
                       worst_rel_err_tf32=max((c["rel_err"] for c in checks if c["split"] == 0), default=None),
                       worst_rel_err_split=max((c["rel_err"] for c in checks if c["split"] == 1), default=None)),
           points=points)
json.dump(out, open(a.dst, "w"), indent=1)
print(f"wrote {a.dst}: {len(points)} points")
