"""Converts the output of fa2_rust_bench.py into the project's BenchRecord JSON (sdpa-core/src/record.rs), so
`sdpa report` can tabulate and plot it (TFLOPS against sequence length per kernel).

    python3 sdpa-cuda/dev/to_records.py bench/results/gpu/fa2-h100.json bench/results/gpu/fa2-h100-records.json

Our records carry median, min and max over the timed calls; PyTorch's come from do_bench medians only, so
their min and max are set to the median and `reps` to 0 (unknown). PyTorch's TFLOPS and GB/s follow
sdpa-core's cost model (bench/sdpa_common.py: exact causal pairs, bytes at the record's dtype).
"""
import json
import sys

from sdpa_dev import cost

src, dst = sys.argv[1], sys.argv[2]
data = json.load(open(src))
device = data["env"].get("name", "unknown GPU")
machine = f"{device}, torch {data['env'].get('torch')}, CUDA {data['env'].get('cuda')}"


out = []
for r in data["records"]:
    shape = dict(b=r["b"], hq=r["hq"], hkv=r["hkv"], sq=r["sq"], sk=r["sk"], d=r["d"], dv=r.get("dv", r["d"]))
    base = dict(device=device, dtype=r["dtype"], shape=shape, mask=r["mask"], layout="bhsd", machine=machine)
    if r.get("median_ms"):
        # `--odd`'s A/B: the same call with SDPA_FA2_PAD_COPY=0 is named apart from the pad-copy one.
        kernel = r["kernel_ran"] + ("-narrow" if r.get("tag") == "odd_narrow" else "")
        out.append(dict(base, backend="cuda", kernel=kernel,
                        time_ms=dict(median=r["median_ms"], min=r["min_ms"], max=r["max_ms"], reps=50),
                        tflops=r["tflops"], gbps=r["gbps"]))
    # PyTorch's default is cuDNN on the H100 where cuDNN takes the call; `--odd` runs name what ran instead.
    for name, key in (("flash", "torch_flash_ms"), (r.get("torch_default_backend", "cudnn"), "torch_default_ms")):
        ms = r.get(key)
        if not ms:
            continue
        flops, nbytes = cost(shape, r["mask"], r["dtype"])
        rec = dict(base, backend="pytorch", kernel=name, time_ms=dict(median=ms, min=ms, max=ms, reps=0),
                   tflops=flops / ms / 1e9, gbps=nbytes / ms / 1e6)
        if rec not in out and not any(o["backend"] == "pytorch" and o["kernel"] == name and o["shape"] == shape
                                      and o["dtype"] == r["dtype"] and o["mask"] == r["mask"] for o in out):
            out.append(rec)
json.dump(out, open(dst, "w"), indent=1)
print(f"wrote {len(out)} records to {dst}")
