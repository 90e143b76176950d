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
TOL = {0: 2e-3, 1: 2e-5}  # sdpa_core::check::tolerance for f32 TF32 / split TF32
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


class Params(ctypes.Structure):
    """The kernels' AttnParams (kernels/common.cuh, src/params.rs), field for field."""
    _fields_ = ([(n, ctypes.c_void_p) for n in ("q", "k", "v", "o", "mask", "lse", "workspace")]
                + [(n, ctypes.c_longlong * 3) for n in ("q_stride", "k_stride", "v_stride", "o_stride")]
                + [("mask_stride", ctypes.c_longlong * 4)]
                + [(n, ctypes.c_int) for n in ("b", "hq", "hkv", "group", "sq", "sk", "d", "dv", "mask_kind",
                                               "causal_offset")]
                + [("scale", ctypes.c_float), ("scale_log2", ctypes.c_float), ("num_splits", ctypes.c_int),
                   ("extra", ctypes.c_int)])


def log(*a):
    print(*a, flush=True)


class Lib:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        assert self.lib.tfdev_params_size() == ctypes.sizeof(Params) == 240, "AttnParams layout mismatch"
        self.lib.tfdev_launch.argtypes = [ctypes.c_int, ctypes.POINTER(Params), ctypes.c_void_p]
        self.lib.tfdev_mma_peak.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                            ctypes.POINTER(ctypes.c_double)]
        self.entries = []
        buf = (ctypes.c_int * 11)()
        for i in range(self.lib.tfdev_count()):
            self.lib.tfdev_entry(i, buf)
            dp, mt, nw, bk, st, split, pre, mask, bm, smem, wg = list(buf)
            cfg = f"wg{wg}_bk{bk}" if wg else f"mt{mt}_nw{nw}_bk{bk}_st{st}{'_pre' if pre else ''}"
            self.entries.append(dict(i=i, dp=dp, mt=mt, nw=nw, bk=bk, st=st, split=split, pre=pre, mask=mask, bm=bm,
                                     smem=smem, wg=wg, cfg=cfg))

    def configs(self, dp, split, mask):
        return [e for e in self.entries if e["dp"] == dp and e["split"] == split and e["mask"] == mask]


class Problem:
    """One attention call's tensors (logical BHSD views over BHSD or BSHD storage), uniform in
    [-sqrt(3), sqrt(3)] like sdpa-core's HostInputs::random and bench/gpu/bench_cuda.py."""

    def __init__(self, B, Hq, Hkv, Sq, Sk, D, layout="bhsd", mask="none", seed=0):
        g = torch.Generator(device="cuda").manual_seed(seed)

        def mk(H, S):
            shape = (B, H, S, D) if layout == "bhsd" else (B, S, H, D)
            t = (torch.rand(shape, device="cuda", generator=g) * 2 - 1) * 3 ** 0.5
            return t if layout == "bhsd" else t.transpose(1, 2)

        self.q, self.k, self.v = mk(Hq, Sq), mk(Hkv, Sk), mk(Hkv, Sk)
        self.o = torch.full_like(self.q, float("nan"))
        self.lse = torch.full((B, Hq, Sq), float("nan"), device="cuda")
        self.B, self.Hq, self.Hkv, self.Sq, self.Sk, self.D = B, Hq, Hkv, Sq, Sk, D
        self.mask = mask
        self.off = {"causal": 0, "causal-br": Sk - Sq}.get(mask, 0)
        self.scale = 1.0 / math.sqrt(D)

    def params(self, lse=True):
        p = Params()
        p.q, p.k, p.v, p.o = self.q.data_ptr(), self.k.data_ptr(), self.v.data_ptr(), self.o.data_ptr()
        p.lse = self.lse.data_ptr() if lse else None
        for name, t in (("q", self.q), ("k", self.k), ("v", self.v), ("o", self.o)):
            sb, sh, ss, sd = t.stride()
            assert sd == 1
            setattr(p, f"{name}_stride", (ctypes.c_longlong * 3)(sb, sh, ss))
        p.b, p.hq, p.hkv, p.sq, p.sk = self.B, self.Hq, self.Hkv, self.Sq, self.Sk
        p.group = self.Hq // self.Hkv
        p.d = p.dv = self.D
        p.mask_kind = 0 if self.mask == "none" else 1
        p.causal_offset = self.off
        p.scale = self.scale
        p.scale_log2 = self.scale * LOG2E
        p.num_splits = 1
        # Same rule as src/tf32.rs: bit 0 16-byte loads, bit 1 8-byte stores.
        al16 = all(t.data_ptr() % 16 == 0 and all(s % 4 == 0 for s in t.stride()[:3]) for t in (self.q, self.k, self.v))
        al8 = self.o.data_ptr() % 8 == 0 and all(s % 2 == 0 for s in self.o.stride()[:3])
        p.extra = (1 if al16 and self.D % 4 == 0 else 0) | (2 if al8 and self.D % 2 == 0 else 0)
        return p

    def reference(self, b_lim=None, head_chunk=8):
        """float64 output and LSE (batch elements [0, b_lim))."""
        B = self.B if b_lim is None else b_lim
        G = self.Hq // self.Hkv
        outs, lses = [], []
        for h0 in range(0, self.Hq, head_chunk):
            hs = slice(h0, min(self.Hq, h0 + head_chunk))
            kv = torch.arange(hs.start, hs.stop, device="cuda") // G
            q = self.q[:B, hs].double()
            k = self.k[:B, kv].double()
            v = self.v[:B, kv].double()
            s = q @ k.transpose(-1, -2) * self.scale
            if self.mask != "none":
                i = torch.arange(self.Sq, device="cuda")[:, None]
                j = torch.arange(self.Sk, device="cuda")[None, :]
                s = s.masked_fill(j > i + self.off, float("-inf"))
            m = s.amax(-1, keepdim=True)
            m0 = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
            pm = torch.exp(s - m0)
            l = pm.sum(-1, keepdim=True)
            outs.append(torch.where(l > 0, (pm @ v) / l, torch.zeros_like(l)))
            lses.append(torch.where(l > 0, m0 + torch.log(l), torch.full_like(l, float("-inf"))).squeeze(-1))
            del s, pm
        return torch.cat(outs, 1), torch.cat(lses, 1)


def rel_err(got, want):
    got, want = got.double(), want.double()
    nan_mismatch = int((torch.isnan(got) != torch.isnan(want)).sum())
    ok = ~torch.isnan(want) & ~torch.isnan(got)
    d = (got - want)[ok]
    return float(d.norm() / want[ok].norm().clamp_min(1e-300)), nan_mismatch


def launch(lib, e, pr, lse=True):
    p = pr.params(lse)
    rc = lib.lib.tfdev_launch(e["i"], ctypes.byref(p), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    if rc != 0:
        raise RuntimeError(f"launch failed rc={rc} {e}")


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
                if e["wg"] and not (pr.params().extra & 1):
                    continue  # the wgmma kernel takes only the 16-byte load path (the host falls back)
                pr.o.fill_(float("nan"))
                pr.lse.fill_(float("nan"))
                launch(lib, e, pr)
                torch.cuda.synchronize()
                err, nanbad = rel_err(pr.o, ref_o)
                fin = torch.isfinite(ref_lse)
                lse_e = float((pr.lse.double() - ref_lse)[fin].abs().max()) if fin.any() else 0.0
                lse_bad = int(((~fin) & (pr.lse.double() != ref_lse)).sum())
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
    f = 4 * B * Hq * Sq * Sk * D
    return f / 2 if causal and Sq == Sk else f


def bench(fn):
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def ceilings(lib, res):
    c = res["ceilings"]
    n = 8192
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    for name, tf32 in (("tf32", True), ("fp32", False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        ms = bench(lambda: a @ b)
        c[f"gemm_{name}_TFLOPs"] = 2 * n ** 3 / ms / 1e9
    torch.backends.cuda.matmul.allow_tf32 = False
    del a, b
    sink = torch.zeros(128, device="cuda")
    fl = ctypes.c_double()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for per_sm in (4, 8):
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        f = lambda: lib.lib.tfdev_mma_peak(sms * per_sm, 4096, ctypes.c_void_p(sink.data_ptr()), stream,
                                           ctypes.byref(fl))
        assert f() == 0
        ms = bench(f)
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
        row["torch_ms"] = bench(torch_fn)
        for split in (0, 1):
            for e in lib.configs(D, split, 1 if causal else 0):
                pr.o.fill_(float("nan"))
                launch(lib, e, pr, lse=False)
                torch.cuda.synchronize()
                err, nb = rel_err(pr.o[:1], ref_o)
                ms = bench(lambda: launch(lib, e, pr, lse=False))
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
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
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
    p = torch.cuda.get_device_properties(0)
    res = dict(env=dict(torch=torch.__version__, cuda=torch.version.cuda, name=p.name, sms=p.multi_processor_count,
                        argv=sys.argv, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())),
               ceilings={}, checks=[], bench=[])
    log("ENV", json.dumps(res["env"]))
    try:
        if args.check:
            run_checks(lib, res)
        if args.bench:
            if not args.no_ceilings:
                ceilings(lib, res)
            run_bench(lib, res, args.dims)
    finally:
        with open(os.path.join(args.out, "tf32dev.json"), "w") as f:
            json.dump(res, f, indent=1, default=str)
    summary(res)


if __name__ == "__main__":
    main()
