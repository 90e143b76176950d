"""Turns fa3_bench.py's output into the flat record format `sdpa report` reads (bench/results/README.md).

    python3 sdpa-cuda/dev/fa3_records.py RAW.json OUT.json

One record per shape and kernel that passed its check (`fa3`, `fa3-pp0` for the run without ping-pong,
`fa3-static` for the static schedule, `fa3-desc-fold` and `fa3-eager-max` for session 18's A/Bs of
the wgmma descriptors and the row maximum (`SDPA_FA3_AB=desc-fold`, `eager-max`), `fa3-direct-o` for session
20's epilogue A/B (`direct-o`), `fa3-full-diag` for session 21's diagonal A/B (`full-diag`), `fa2`),
PyTorch's default (cuDNN) and FLASH_ATTENTION medians riding on the `fa3` record, the run's GEMM ceiling kept.
Entries whose check failed (an experiment) and the forced-tile timings stay in the raw file only.
"""
import json
import sys

raw, out = sys.argv[1], sys.argv[2]
d = json.load(open(raw))
names = {"fa3": "fa3", "fa3_pp0": "fa3-pp0", "fa3_static": "fa3-static", "fa3_fold": "fa3-desc-fold",
         "fa3_eager": "fa3-eager-max", "fa3_direct": "fa3-direct-o", "fa3_full": "fa3-full-diag",
         "fa2": "fa2"}
records = []
for row in d["records"]:
    b, hq, hkv, sq, sk, dim, dtype, mask, dv = row["shape"]
    for key, kernel in names.items():
        r = row.get(key)
        if not r or r.get("error") or not r.get("check") or not r.get("ms"):
            continue
        rec = dict(kernel=kernel, backend="cuda", device=d["env"]["name"], dtype=dtype, mask=mask, layout="bhsd",
                   b=b, hq=hq, hkv=hkv, sq=sq, sk=sk, d=dim, dv=dv, median_ms=r["ms"], tflops=r["tflops"])
        if key == "fa3":
            for t in ("torch_flash_ms", "torch_default_ms"):
                if row.get(t):
                    rec[t] = row[t]
        records.append(rec)
json.dump(dict(env=d["env"], ceilings=d["ceilings"], records=records), open(out, "w"), indent=1)
print(f"{out}: {len(records)} records")
