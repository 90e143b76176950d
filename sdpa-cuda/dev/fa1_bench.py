"""Development harness for the fa1 kernels on the device machine, without the Rust machinery.

Loads the nvcc-built library of dev/fa1_host.cu through ctypes, checks every variant against a float64
torch reference on random data with NaN-poisoned outputs (every mask, both layouts, GQA, lengths off the
tiles), then times the f32 variants against PyTorch's f32 SDPA (allow_tf32 off) with triton's do_bench
medians in the same run, with the error of both against float64 on the first (batch, head) slices.

    python3 sdpa-cuda/dev/fa1_bench.py --lib fa1dev.so [--check] [--bench] [--out DIR]
"""
import json
import os

import torch
import torch.nn.functional as F

from sdpa_dev import (TOLERANCE, DevLib, Problem, bench, cost, cuda_kernel_names, env_info, exact_f32, gemm_tflops,
                      harness_parser, log, lse_err, rel_err, save)

DTS = ["f32", "f16", "bf16"]
MASKS = ["none", "causal", "causal-br", "bool", "additive"]


class Lib(DevLib):
    def __init__(self, path):
        super().__init__(path, "fa1dev", 8)
        self.entries = []
        for i, (kind, dt, d, tm, alias, minb, unr, tx) in enumerate(self.rows):
            # e.g. "ship:t4b2u2", "alt:t4ab2u1" (a: P aliases K), "alt:x8t8b1u1" (8 threads per row), "plain"
            name = "plain" if kind == 1 else (("ship:" if kind == 0 else "alt:") + ("x8" if tx == 8 else "") +
                                                f"t{tm}{'a' if alias else ''}b{minb}u{unr}")
            self.entries.append(dict(i=i, kind=kind, dt=DTS[dt], d=d, tm=tm, alias=alias, minb=minb, unr=unr,
                                     tx=tx, name=name))

    def run(self, e, pr, lse=True):
        self.launch(e["i"], pr.params(lse), e)


def problem(B, Hq, Hkv, Sq, Sk, D, dt, layout="bhsd", mask="none", seed=0):
    # The bool mask broadcasts over batch and heads.
    return Problem(B, Hq, Hkv, Sq, Sk, D, dt, layout, mask, (1, 1, Sq, Sk) if mask == "bool" else None, seed)


def flops(B, H, S, D, causal):
    return cost(dict(b=B, hq=H, hkv=H, sq=S, sk=S, d=D), "causal" if causal else "none", "f32")[0]


def run_checks(lib, res):
    n_bad = 0
    for e in lib.entries:
        shapes = [(2, 4, 2, 77, 130, "bhsd"), (1, 4, 4, 300, 257, "bshd"), (1, 2, 1, 130, 50, "bhsd")]
        for (B, Hq, Hkv, Sq, Sk, layout) in shapes:
            for mask in MASKS:
                pr = problem(B, Hq, Hkv, Sq, Sk, e["d"], e["dt"], layout, mask, seed=Sq * 7 + Sk + e["d"])
                ref_o, ref_lse = pr.reference()
                pr.o.fill_(float("nan"))
                pr.lse.fill_(float("nan"))
                lib.run(e, pr)
                torch.cuda.synchronize()
                err, nanbad = rel_err(pr.o, ref_o)
                le, lse_bad = lse_err(pr.lse, ref_lse)
                ok = err <= TOLERANCE[e["dt"]] and nanbad == 0 and lse_bad == 0 and le < 1e-3
                row = dict(entry=e["name"], dt=e["dt"], D=e["d"], B=B, Hq=Hq, Hkv=Hkv, Sq=Sq, Sk=Sk, layout=layout,
                           mask=mask, rel_err=err, nan_mismatch=nanbad, lse_err=le, lse_bad=lse_bad, ok=ok)
                res["checks"].append(row)
                if not ok:
                    n_bad += 1
                    log("FAIL", json.dumps(row))
    log(f"CHECKS {len(res['checks']) - n_bad}/{len(res['checks'])} passed")
    worst = {}
    for c in res["checks"]:
        k = (c["entry"], c["dt"], c["D"])
        worst[k] = max(worst.get(k, 0), c["rel_err"])
    for k, w in sorted(worst.items()):
        log(f"  {k[0]:9} {k[1]:4} D={k[2]:3} max rel_err {w:.2e}")


def timer(fn):
    return bench(fn, warmup=10, rep=60)


def run_bench(lib, res):
    exact_f32()
    res["gemm_f32_TFLOPs"] = gemm_tflops(torch.float32, timer)
    log(f"f32 GEMM (no TF32): {res['gemm_f32_TFLOPs']:.1f} TFLOPS")
    for D in (64, 96, 128):
        for S in ((2048,) if D == 96 else (1024, 2048, 4096)):
            for causal in (False, True):
                B, H = 16384 // S, 2048 // D
                pr = problem(B, H, H, S, S, D, "f32", "bhsd", "causal" if causal else "none", seed=S + D)
                fl = flops(B, H, S, D, causal)
                ref, _ = pr.reference(b=0, heads=4)
                row = dict(D=D, S=S, B=B, H=H, causal=causal, ours={})
                for e in lib.entries:
                    if e["dt"] != "f32" or e["d"] != D:
                        continue
                    pr.o.fill_(float("nan"))
                    lib.run(e, pr, lse=False)
                    torch.cuda.synchronize()
                    err, nb = rel_err(pr.o[:1, :4], ref)
                    ms = timer(lambda: lib.run(e, pr, lse=False))
                    row["ours"][e["name"]] = dict(ms=ms, tflops=fl / ms / 1e9, rel_err_f64=err, nan=nb)
                fn = lambda: F.scaled_dot_product_attention(pr.q, pr.k, pr.v, is_causal=causal)
                row["torch_ms"] = timer(fn)
                row["torch_tflops"] = fl / row["torch_ms"] / 1e9
                row["torch_rel_err_f64"], _ = rel_err(fn()[:1, :4], ref)
                row["torch_kernels"] = cuda_kernel_names(fn, width=60)
                res["bench"].append(row)
                cf = " ".join(f"{k}:{v['tflops']:.1f}({row['torch_ms'] / v['ms']:.2f}x,{v['rel_err_f64']:.1e})"
                              for k, v in row["ours"].items())
                log(f"f32 D={D:3} S={S:5} c={int(causal)} torch {row['torch_tflops']:5.1f} TF err "
                    f"{row['torch_rel_err_f64']:.1e} | {cf}")
                del pr, ref
                torch.cuda.empty_cache()
    for D in (64, 128):
        for S in (2048, 4096):
            B, H = 16384 // S, 2048 // D
            pr = problem(B, H, H, S, S, D, "bf16", "bhsd", "none", seed=S)
            fl = flops(B, H, S, D, False)
            out = {}
            for e in lib.entries:
                if e["dt"] == "bf16" and e["d"] == D:
                    out[e["name"]] = fl / timer(lambda: lib.run(e, pr, lse=False)) / 1e9
            res["bench_bf16"].append(dict(D=D, S=S, tflops=out))
            log(f"bf16 D={D} S={S} none | " + " ".join(f"{k}:{v:.1f}" for k, v in out.items()))
            del pr
            torch.cuda.empty_cache()


def main():
    ap = harness_parser()
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    lib = Lib(args.lib)
    res = dict(env=env_info(), checks=[], bench=[], bench_bf16=[])
    log("ENV", json.dumps(res["env"]))
    try:
        if args.check:
            run_checks(lib, res)
        if args.bench:
            run_bench(lib, res)
    finally:
        save(res, args.out, "fa1dev.json")
    for r in res["bench"]:
        best = min(r["ours"].items(), key=lambda kv: kv[1]["ms"])
        log(f"SUMMARY D={r['D']:3} S={r['S']:5} c={int(r['causal'])} torch {r['torch_tflops']:5.1f} | best {best[0]} "
            f"{best[1]['tflops']:5.1f} TF x_torch {r['torch_ms'] / best[1]['ms']:.2f}")


if __name__ == "__main__":
    main()
