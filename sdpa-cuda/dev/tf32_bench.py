"""Development harness for the TF32 / split-TF32 kernels on the device machine, without the Rust machinery.

Loads the nvcc-built library of dev/tf32_host.cu through ctypes and drives it with torch tensors:
- checks every tile configuration against a float64 torch reference on random data with NaN-poisoned
  outputs (odd lengths, Sq != Sk both ways, GQA, both layouts, causal both alignments, D off the padding,
  the scalar-load path), with sdpa-core's tolerances;
- times each configuration on the issue-4 f32 shapes against PyTorch's f32 SDPA (TF32 off: its CUTLASS
  exact-f32 kernel) with triton's do_bench medians (L2 flushed before each call) in the same run, and
  measures every error (ours plain and split, PyTorch f32) against float64 on the first batch element;
- measures the ceilings in the same run: TF32 and f32 GEMM (8192^3, cuBLAS through torch) and the
  mma.sync m16n8k8 TF32 instruction rate (the microbenchmark in tf32_host.cu).

    python3 sdpa-cuda/dev/tf32_bench.py --lib target-tf32/dev/tf32dev.so [--check] [--bench] [--out DIR]

Writes tf32dev.json to --out ($OUT by default) and prints short tables.
"""
import ctypes
import json
import os

import torch
import torch.nn.functional as F

from sdpa_dev import (DevLib, bench, cost, env_info, exact_f32, fill_params, gemm_tflops, harness_parser, log, lse_err,
                      reference, rel_err, save, uniform)

TOL = {0: 2e-3, 1: 2e-5}  # sdpa_core::check::tolerance for f32 TF32 / split TF32
exact_f32()


class Lib(DevLib):
    def __init__(self, path):
        super().__init__(path, "tfdev", 10)
        self.lib.tfdev_mma_peak.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                            ctypes.POINTER(ctypes.c_double)]
        self.entries = []
        for i, (dp, mt, nw, bk, st, split, pre, mask, bm, smem) in enumerate(self.rows):
            cfg = f"mt{mt}_nw{nw}_bk{bk}_st{st}{'_pre' if pre else ''}"
            self.entries.append(dict(i=i, dp=dp, mt=mt, nw=nw, bk=bk, st=st, split=split, pre=pre, mask=mask, bm=bm,
                                     smem=smem, cfg=cfg))

    def configs(self, dp, split, mask):
        return [e for e in self.entries if e["dp"] == dp and e["split"] == split and e["mask"] == mask]


class Problem:
    """One attention call's tensors (logical BHSD views over BHSD or BSHD storage), uniform in
    [-sqrt(3), sqrt(3)] like sdpa-core's HostInputs::random and bench/gpu/bench_cuda.py."""

    def __init__(self, B, Hq, Hkv, Sq, Sk, D, layout="bhsd", mask="none", seed=0):
        g = torch.Generator(device="cuda").manual_seed(seed)

        def mk(H, S):
            t = uniform((B, H, S, D) if layout == "bhsd" else (B, S, H, D), "f32", g)
            return t if layout == "bhsd" else t.transpose(1, 2)

        self.q, self.k, self.v = mk(Hq, Sq), mk(Hkv, Sk), mk(Hkv, Sk)
        self.o = torch.full_like(self.q, float("nan"))
        self.lse = torch.full((B, Hq, Sq), float("nan"), device="cuda")
        self.B, self.Hq, self.Hkv, self.Sq, self.Sk, self.D = B, Hq, Hkv, Sq, Sk, D
        self.mask = mask

    def params(self, lse=True):
        # Same rule as src/kernels/tf32.rs: bit 0 16-byte loads, bit 1 8-byte stores.
        al16 = all(t.data_ptr() % 16 == 0 and all(s % 4 == 0 for s in t.stride()[:3]) for t in (self.q, self.k, self.v))
        al8 = self.o.data_ptr() % 8 == 0 and all(s % 2 == 0 for s in self.o.stride()[:3])
        extra = (1 if al16 and self.D % 4 == 0 else 0) | (2 if al8 and self.D % 2 == 0 else 0)
        return fill_params(self.q, self.k, self.v, self.o, self.mask, self.lse if lse else None, extra=extra)

    def reference(self, b_lim=None, head_chunk=8):
        """float64 output and LSE (batch elements [0, b_lim))."""
        B = self.B if b_lim is None else b_lim
        return reference(self.q[:B], self.k[:B], self.v[:B], self.mask, head_chunk=head_chunk)


def launch(lib, e, pr, lse=True):
    lib.launch(e["i"], pr.params(lse), e)


def run_checks(lib, res):
    cases = []
    for dp, ds in ((64, (64, 40, 63)), (128, (128, 96, 80))):
        for d in ds:
            for mask in ("none", "causal", "causal-br"):
                cases.append((2, 4, 4, 77, 130, d, "bhsd", mask))
                cases.append((1, 8, 2, 130, 77, d, "bshd", mask))
                cases.append((1, 4, 1, 300, 300, d, "bhsd", mask))
            cases.append((1, 8, 8, 1, 257, d, "bshd", "none"))
    fails = 0
    for n, (B, Hq, Hkv, Sq, Sk, D, layout, mask) in enumerate(cases):
        dp = 64 if D <= 64 else 128
        pr = Problem(B, Hq, Hkv, Sq, Sk, D, layout, mask, seed=1000 + n)
        ref_o, ref_lse = pr.reference()
        for split in (0, 1):
            for e in lib.configs(dp, split, 0 if mask == "none" else 1):
                pr.o.fill_(float("nan"))
                pr.lse.fill_(float("nan"))
                launch(lib, e, pr)
                torch.cuda.synchronize()
                err, nanbad = rel_err(pr.o, ref_o)
                lse_e, lse_bad = lse_err(pr.lse, ref_lse)
                ok = err <= TOL[split] and nanbad == 0 and lse_bad == 0 and lse_e <= 1e-3 + TOL[split] * 20
                row = dict(cfg=e["cfg"], split=split, B=B, Hq=Hq, Hkv=Hkv, Sq=Sq, Sk=Sk, D=D, layout=layout,
                           mask=mask, rel_err=err, nan_mismatch=nanbad, lse_err=lse_e, lse_bad=lse_bad, ok=ok)
                res["checks"].append(row)
                if not ok:
                    fails += 1
                    if fails < 40:
                        log("FAIL", json.dumps(row))
    worst = {}
    for c in res["checks"]:
        k = (c["cfg"], c["split"], 64 if c["D"] <= 64 else 128)
        worst[k] = max(worst.get(k, 0), c["rel_err"] / TOL[c["split"]])
    for k, w in sorted(worst.items()):
        log(f"  check dp={k[2]:3} split={k[1]} {k[0]:18} worst err/tol {w:.3f}")
    log(f"CHECKS {len(res['checks']) - fails}/{len(res['checks'])} passed")


def flops(B, Hq, Sq, Sk, D, causal):
    return cost(dict(b=B, hq=Hq, hkv=Hq, sq=Sq, sk=Sk, d=D), "causal" if causal else "none", "f32")[0]


def timer(fn):
    return bench(fn, warmup=25, rep=100)


def ceilings(lib, res):
    c = res["ceilings"]
    for name, tf32 in (("tf32", True), ("fp32", False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        c[f"gemm_{name}_TFLOPs"] = gemm_tflops(torch.float32, timer)
    torch.backends.cuda.matmul.allow_tf32 = False
    sink = torch.zeros(128, device="cuda")
    fl = ctypes.c_double()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for per_sm in (4, 8):
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        f = lambda: lib.lib.tfdev_mma_peak(sms * per_sm, 4096, ctypes.c_void_p(sink.data_ptr()), stream,
                                           ctypes.byref(fl))
        assert f() == 0
        ms = timer(f)
        c[f"mma_sync_tf32_TFLOPs_{per_sm}blk"] = fl.value / ms / 1e9
    torch.cuda.empty_cache()
    log("CEILINGS", json.dumps(c))


def issue_shapes():
    out = []
    for D in (64, 128):
        for S in (1024, 2048, 4096):
            for causal in (False, True):
                out.append(("f32", 16384 // S, 2048 // D, 2048 // D, S, D, causal))
    out.append(("gqa_f32", 1, 32, 8, 4096, 128, True))
    return out


def run_bench(lib, res, dims=None):
    for (tag, B, Hq, Hkv, S, D, causal) in issue_shapes():
        if dims and D not in dims:
            continue
        mask = "causal" if causal else "none"
        pr = Problem(B, Hq, Hkv, S, S, D, "bhsd", mask, seed=S + D)
        fl = flops(B, Hq, S, S, D, causal)
        ref_o, _ = pr.reference(b_lim=1)
        row = dict(tag=tag, B=B, Hq=Hq, Hkv=Hkv, S=S, D=D, causal=causal, flops=fl, ours={})

        def torch_fn():
            return F.scaled_dot_product_attention(pr.q, pr.k, pr.v, is_causal=causal, enable_gqa=Hq != Hkv)

        out = torch_fn()
        row["torch_err"] = rel_err(out[:1], ref_o)[0]
        del out
        row["torch_ms"] = timer(torch_fn)
        for split in (0, 1):
            for e in lib.configs(D, split, 1 if causal else 0):
                pr.o.fill_(float("nan"))
                launch(lib, e, pr, lse=False)
                torch.cuda.synchronize()
                err, nb = rel_err(pr.o[:1], ref_o)
                ms = timer(lambda: launch(lib, e, pr, lse=False))
                row["ours"][f"{'split' if split else 'tf32'}:{e['cfg']}"] = dict(
                    split=split, cfg=e["cfg"], ms=ms, tflops=fl / ms / 1e9, rel_err=err, nan=nb,
                    x_torch=row["torch_ms"] / ms)
        res["bench"].append(row)
        tt = fl / row["torch_ms"] / 1e9
        log(f"{tag:7} B={B:2} H={Hq}/{Hkv} S={S:4} D={D:3} c={int(causal)} torch {row['torch_ms']:7.3f} ms "
            f"{tt:5.1f} TF err {row['torch_err']:.1e}")
        for k, v in row["ours"].items():
            log(f"    {k:26} {v['ms']:7.3f} ms {v['tflops']:6.1f} TF x{v['x_torch']:5.2f} err {v['rel_err']:.1e}"
                f"{' NAN' if v['nan'] else ''}")
        del pr, ref_o
        torch.cuda.empty_cache()


def summary(res):
    if not res["bench"]:
        return
    log("SUMMARY (best config per point)")
    log(f"{'shape':34} {'torch TF':>8} {'torch err':>9} | {'tf32 TF':>7} {'x':>5} {'err':>7} | "
        f"{'split TF':>8} {'x':>5} {'err':>7}")
    for r in res["bench"]:
        best = {}
        for v in r["ours"].values():
            if v["nan"] == 0 and (v["split"] not in best or v["ms"] < best[v["split"]]["ms"]):
                best[v["split"]] = v
        t, s = best.get(0), best.get(1)
        tt = r["flops"] / r["torch_ms"] / 1e9
        f = lambda v, k, fmt: format(v[k], fmt) if v else "-"
        log(f"B={r['B']:2} H={r['Hq']}/{r['Hkv']} S={r['S']:4} D={r['D']:3} c={int(r['causal'])} {tt:8.1f} "
            f"{r['torch_err']:9.1e} | {f(t, 'tflops', '7.1f')} {f(t, 'x_torch', '5.2f')} {f(t, 'rel_err', '7.1e')} | "
            f"{f(s, 'tflops', '8.1f')} {f(s, 'x_torch', '5.2f')} {f(s, 'rel_err', '7.1e')}  "
            f"[{t['cfg'] if t else ''} / {s['cfg'] if s else ''}]")


def main():
    ap = harness_parser()
    ap.add_argument("--dims", type=int, nargs="*", help="time only these head dims")
    ap.add_argument("--no-ceilings", action="store_true")
    ap.add_argument("--grid-cap", type=int, default=0,
                    help="at most this many blocks per launch (persistent kernels); config names get _pN")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    lib = Lib(args.lib)
    if args.grid_cap:
        lib.lib.tfdev_set_grid_cap(args.grid_cap)
        for e in lib.entries:
            e["cfg"] += f"_p{args.grid_cap}"
    res = dict(env=env_info(), ceilings={}, checks=[], bench=[])
    log("ENV", json.dumps(res["env"]))
    try:
        if args.check:
            run_checks(lib, res)
        if args.bench:
            if not args.no_ceilings:
                ceilings(lib, res)
            run_bench(lib, res, args.dims)
    finally:
        save(res, args.out, "tf32dev.json")
    summary(res)


if __name__ == "__main__":
    main()
