"""Development harness for the fa1 kernels on the device machine, without the Rust machinery.

Loads the nvcc-built library of dev/fa1_host.cu through ctypes, checks every variant against a float64
torch reference on random data with NaN-poisoned outputs (every mask, both layouts, GQA, lengths off the
tiles), then times the f32 variants against PyTorch's f32 SDPA (allow_tf32 off) with triton's do_bench
medians in the same run, with the error of both against float64 on the first (batch, head) slices.

    python3 sdpa-cuda/dev/fa1_bench.py --lib fa1dev.so [--check] [--bench] [--out DIR]
"""
import argparse
import ctypes
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

LOG2E = 1.4426950408889634
DTS = ["f32", "f16", "bf16"]
TDT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
TOL = {"f32": 1e-5, "f16": 2e-3, "bf16": 1.6e-2}  # sdpa_core::check::tolerance


class Params(ctypes.Structure):
    """Mirror of AttnParams (kernels/common.cuh, src/params.rs)."""
    _fields_ = [(n, ctypes.c_void_p) for n in ("q", "k", "v", "o", "mask", "lse", "workspace")] + [
        (n, ctypes.c_longlong * 3) for n in ("q_stride", "k_stride", "v_stride", "o_stride")
    ] + [("mask_stride", ctypes.c_longlong * 4)] + [
        (n, ctypes.c_int) for n in ("b", "hq", "hkv", "group", "sq", "sk", "d", "dv", "mask_kind", "causal_offset")
    ] + [("scale", ctypes.c_float), ("scale_log2", ctypes.c_float), ("num_splits", ctypes.c_int),
         ("extra", ctypes.c_int)]


def log(*a):
    print(*a, flush=True)


class Lib:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        assert self.lib.fa1dev_params_size() == ctypes.sizeof(Params), "Params layout mismatch"
        self.lib.fa1dev_launch.argtypes = [ctypes.c_int, ctypes.POINTER(Params), ctypes.c_void_p]
        buf = (ctypes.c_int * 8)()
        self.entries = []
        for i in range(self.lib.fa1dev_count()):
            self.lib.fa1dev_entry(i, buf)
            kind, dt, d, tm, alias, minb, unr, tx = list(buf)
            # e.g. "ship:t4b2u2", "alt:t4ab2u1" (a: P aliases K), "alt:x8t8b1u1" (8 threads per row), "plain"
            name = "plain" if kind == 1 else (("ship:" if kind == 0 else "alt:") + ("x8" if tx == 8 else "") +
                                                f"t{tm}{'a' if alias else ''}b{minb}u{unr}")
            self.entries.append(dict(i=i, kind=kind, dt=DTS[dt], d=d, tm=tm, alias=alias, minb=minb, unr=unr,
                                     tx=tx, name=name))
        self.stream = torch.cuda.current_stream().cuda_stream

    def launch(self, e, pr, lse=True):
        p = pr.params(lse)
        rc = self.lib.fa1dev_launch(e["i"], ctypes.byref(p), ctypes.c_void_p(self.stream))
        if rc != 0:
            raise RuntimeError(f"launch failed rc={rc} {e}")


MASKS = {"none": 0, "causal": 1, "causal-br": 1, "bool": 2, "additive": 2}


class Problem:
    def __init__(self, B, Hq, Hkv, Sq, Sk, D, dt, layout="bhsd", mask="none", seed=0):
        g = torch.Generator(device="cuda").manual_seed(seed)

        def mk(H, S):
            if layout == "bhsd":
                return torch.randn(B, H, S, D, device="cuda", generator=g).to(TDT[dt])
            return torch.randn(B, S, H, D, device="cuda", generator=g).to(TDT[dt]).transpose(1, 2)

        self.q, self.k, self.v, self.o = mk(Hq, Sq), mk(Hkv, Sk), mk(Hkv, Sk), mk(Hq, Sq)
        self.B, self.Hq, self.Hkv, self.Sq, self.Sk, self.D, self.dt, self.mask = B, Hq, Hkv, Sq, Sk, D, dt, mask
        self.scale = 1.0 / math.sqrt(D)
        self.lse = torch.empty(B, Hq, Sq, device="cuda", dtype=torch.float32)
        self.add = None
        if mask == "bool":  # broadcast over batch and heads
            keep = torch.rand(1, 1, Sq, Sk, device="cuda", generator=g) < 0.8
            self.add = torch.where(keep, 0.0, float("-inf")).float()
        elif mask == "additive":
            vals = torch.rand(B, Hq, Sq, Sk, device="cuda", generator=g) * 4 - 2
            drop = torch.rand(B, Hq, Sq, Sk, device="cuda", generator=g) < 0.1
            self.add = torch.where(drop, float("-inf"), vals).float().contiguous()
        self.off = {"causal": 0, "causal-br": Sk - Sq}.get(mask, 0)

    def params(self, lse=True):
        p = Params()
        p.q, p.k, p.v, p.o = self.q.data_ptr(), self.k.data_ptr(), self.v.data_ptr(), self.o.data_ptr()
        p.lse = self.lse.data_ptr() if lse else None
        p.mask = self.add.data_ptr() if self.add is not None else None
        for name, t in (("q", self.q), ("k", self.k), ("v", self.v), ("o", self.o)):
            sb, sh, ss, sd = t.stride()
            assert sd == 1
            setattr(p, f"{name}_stride", (ctypes.c_longlong * 3)(sb, sh, ss))
        if self.add is not None:
            st = [0 if n == 1 else s for n, s in zip(self.add.shape, self.add.stride())]
            p.mask_stride = (ctypes.c_longlong * 4)(*st)
        p.b, p.hq, p.hkv, p.sq, p.sk = self.B, self.Hq, self.Hkv, self.Sq, self.Sk
        p.group = self.Hq // self.Hkv
        p.d = p.dv = self.D
        p.mask_kind = MASKS[self.mask]
        p.causal_offset = self.off
        p.num_splits, p.extra = 1, 0
        p.scale = self.scale
        p.scale_log2 = self.scale * LOG2E
        return p

    def reference(self, b=None, heads=None):
        """float64 output and LSE, optionally for batch b and query heads [0, heads) only."""
        G = self.Hq // self.Hkv
        bs = slice(None) if b is None else slice(b, b + 1)
        hs = slice(None) if heads is None else slice(0, heads)
        q = self.q[bs, hs].double()
        k = self.k[bs].double().repeat_interleave(G, 1)[:, hs]
        v = self.v[bs].double().repeat_interleave(G, 1)[:, hs]
        s = q @ k.transpose(-1, -2) * self.scale
        if self.mask in ("causal", "causal-br"):
            i = torch.arange(self.Sq, device="cuda")[:, None]
            j = torch.arange(self.Sk, device="cuda")[None, :]
            s = s.masked_fill(j > i + self.off, float("-inf"))
        if self.add is not None:
            a = self.add.double()
            s = s + (a if a.shape[0] == 1 else a[bs, hs])
        m = s.amax(-1, keepdim=True)
        m0 = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
        p = torch.exp(s - m0)
        l = p.sum(-1, keepdim=True)
        o = torch.where(l > 0, (p @ v) / l, torch.zeros_like(l))
        lse = torch.where(l > 0, m + torch.log(l), torch.full_like(l, float("-inf")))
        return o, lse.squeeze(-1)


def rel_err(got, want):
    got, want = got.double(), want.double()
    nan_mismatch = int((torch.isnan(got) != torch.isnan(want)).sum())
    ok = ~torch.isnan(want) & ~torch.isnan(got)
    d = (got - want)[ok]
    return float(d.norm() / want[ok].norm().clamp_min(1e-300)), nan_mismatch


def run_checks(lib, res):
    n_bad = 0
    for e in lib.entries:
        shapes = [(2, 4, 2, 77, 130, "bhsd"), (1, 4, 4, 300, 257, "bshd"), (1, 2, 1, 130, 50, "bhsd")]
        for (B, Hq, Hkv, Sq, Sk, layout) in shapes:
            for mask in MASKS:
                pr = Problem(B, Hq, Hkv, Sq, Sk, e["d"], e["dt"], layout, mask, seed=Sq * 7 + Sk + e["d"])
                ref_o, ref_lse = pr.reference()
                pr.o.fill_(float("nan"))
                pr.lse.fill_(float("nan"))
                lib.launch(e, pr)
                torch.cuda.synchronize()
                err, nanbad = rel_err(pr.o, ref_o)
                fin = torch.isfinite(ref_lse)
                lse_bad = int(((~fin) & (pr.lse != ref_lse)).sum())
                lse_err = float((pr.lse.double() - ref_lse)[fin].abs().max()) if fin.any() else 0.0
                ok = err <= TOL[e["dt"]] and nanbad == 0 and lse_bad == 0 and lse_err < 1e-3
                row = dict(entry=e["name"], dt=e["dt"], D=e["d"], B=B, Hq=Hq, Hkv=Hkv, Sq=Sq, Sk=Sk, layout=layout,
                           mask=mask, rel_err=err, nan_mismatch=nanbad, lse_err=lse_err, lse_bad=lse_bad, ok=ok)
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


def flops(B, H, S, D, causal):
    f = 4 * B * H * S * S * D
    return f / 2 if causal else f


def bench(fn):
    return do_bench(fn, warmup=10, rep=60, return_mode="median")


def run_bench(lib, res):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    n = 8192
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    res["gemm_f32_TFLOPs"] = 2 * n**3 / bench(lambda: a @ b) / 1e9
    del a, b
    log(f"f32 GEMM (no TF32): {res['gemm_f32_TFLOPs']:.1f} TFLOPS")
    for D in (64, 96, 128):
        for S in ((2048,) if D == 96 else (1024, 2048, 4096)):
            for causal in (False, True):
                B, H = 16384 // S, 2048 // D
                pr = Problem(B, H, H, S, S, D, "f32", "bhsd", "causal" if causal else "none", seed=S + D)
                fl = flops(B, H, S, D, causal)
                ref, _ = pr.reference(b=0, heads=4)
                row = dict(D=D, S=S, B=B, H=H, causal=causal, ours={})
                for e in lib.entries:
                    if e["dt"] != "f32" or e["d"] != D:
                        continue
                    pr.o.fill_(float("nan"))
                    lib.launch(e, pr, lse=False)
                    torch.cuda.synchronize()
                    err, nb = rel_err(pr.o[:1, :4], ref)
                    ms = bench(lambda: lib.launch(e, pr, lse=False))
                    row["ours"][e["name"]] = dict(ms=ms, tflops=fl / ms / 1e9, rel_err_f64=err, nan=nb)
                fn = lambda: F.scaled_dot_product_attention(pr.q, pr.k, pr.v, is_causal=causal)
                row["torch_ms"] = bench(fn)
                row["torch_tflops"] = fl / row["torch_ms"] / 1e9
                row["torch_rel_err_f64"], _ = rel_err(fn()[:1, :4], ref)
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    fn()
                    torch.cuda.synchronize()
                row["torch_kernels"] = sorted({ev.name[:60] for ev in prof.events()
                                               if ev.device_type == torch.autograd.DeviceType.CUDA})[:2]
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
            pr = Problem(B, H, H, S, S, D, "bf16", "bhsd", "none", seed=S)
            fl = flops(B, H, S, D, False)
            out = {}
            for e in lib.entries:
                if e["dt"] == "bf16" and e["d"] == D:
                    out[e["name"]] = fl / bench(lambda: lib.launch(e, pr, lse=False)) / 1e9
            res["bench_bf16"].append(dict(D=D, S=S, tflops=out))
            log(f"bf16 D={D} S={S} none | " + " ".join(f"{k}:{v:.1f}" for k, v in out.items()))
            del pr
            torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    lib = Lib(args.lib)
    p = torch.cuda.get_device_properties(0)
    res = dict(env=dict(torch=torch.__version__, cuda=torch.version.cuda, name=p.name, sms=p.multi_processor_count,
                        argv=sys.argv, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())),
               checks=[], bench=[], bench_bf16=[])
    log("ENV", json.dumps(res["env"]))
    try:
        if args.check:
            run_checks(lib, res)
        if args.bench:
            run_bench(lib, res)
    finally:
        json.dump(res, open(os.path.join(args.out, "fa1dev.json"), "w"), indent=1, default=str)
    for r in res["bench"]:
        best = min(r["ours"].items(), key=lambda kv: kv[1]["ms"])
        log(f"SUMMARY D={r['D']:3} S={r['S']:5} c={int(r['causal'])} torch {r['torch_tflops']:5.1f} | best {best[0]} "
            f"{best[1]['tflops']:5.1f} TF x_torch {r['torch_ms'] / best[1]['ms']:.2f}")


if __name__ == "__main__":
    main()
