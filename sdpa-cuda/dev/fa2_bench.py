"""Development harness for the fa2 / splitkv kernels on the device machine, without the Rust machinery.

Loads the nvcc-built library of dev/fa2_host.cu through ctypes, drives it with torch tensors, checks every
variant against a float64 torch reference on random data with NaN-poisoned outputs, and times it against
PyTorch's SDPA (FLASH_ATTENTION backend and the default, cuDNN) with triton's do_bench medians in the same
run, plus the copy-bandwidth and bf16 GEMM ceilings.

    python3 sdpa-cuda/dev/fa2_bench.py --lib target-fa2/dev/fa2dev.so [--check] [--bench] [--decode]
        [--tune] [--quick] [--out DIR]

Writes fa2dev.json (every check and timing) to --out ($OUT by default) and prints short tables.
"""
import json
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from sdpa_dev import (TOLERANCE, DevLib, MASK_KIND, Problem, bench, copy_gbps, cost, env_info, flush, gemm_tflops,
                      harness_parser, log, lse_err, rel_err, save, time_events)


class Lib(DevLib):
    def __init__(self, path):
        super().__init__(path, "fa2dev", 8)
        self.entries = []
        for i, (kind, dt, d, a, b, c, e, mask) in enumerate(self.rows):
            # fa2: a, b, c, e = BM, BN, warps, K/V stages; splitkv: a, b, c, e = warps, stages, keys per
            # step, bulk copies (1) or cp.async (0) | interleaved warps (2).
            self.entries.append(dict(i=i, kind=("fa2", "splitkv")[kind], dt=("f16", "bf16")[dt], d=d,
                                     a=a, b=b, c=c, e=e, mask=mask, cfg=(a, b, c, e)))

    def find(self, kind, dt, d, mask, cfg=None):
        for e in self.entries:
            if e["kind"] == kind and e["dt"] == dt and e["d"] == d and e["mask"] == mask:
                if cfg is None or e["cfg"] == tuple(cfg):
                    return e
        return None

    def configs(self, kind, dt, d, mask):
        return [e for e in self.entries if e["kind"] == kind and e["dt"] == dt and e["d"] == d and e["mask"] == mask
                and self.fits(e)]

    @staticmethod
    def fits(e):
        """Drops tuning configurations whose shared memory exceeds the H100's 227 KB per block."""
        return Lib.smem(e) <= 227 * 1024

    @staticmethod
    def smem(e):
        if e["kind"] == "splitkv":
            return (16 + 2 * e["b"] * e["c"]) * (e["d"] + 8) * 2 * e["a"] + 8 * e["a"] * e["b"]
        return (e["a"] + 2 * e["e"] * e["b"]) * (e["d"] + 8) * 2


def mask_code(kind):
    return MASK_KIND[kind]


def torch_math(pr):
    """PyTorch's unfused math path in the same dtype: the 'unfused kernel' error yardstick."""
    attn = None
    if pr.add is not None:
        attn = pr.add.to(pr.q.dtype)
    with sdpa_kernel([SDPBackend.MATH]):
        return F.scaled_dot_product_attention(pr.q, pr.k, pr.v, attn_mask=attn, is_causal=pr.mask == "causal",
                                              enable_gqa=pr.Hq != pr.Hkv)


class Runner:
    def __init__(self, lib):
        self.lib = lib

    def fa2(self, pr, entry, lse=True):
        self.lib.launch(entry["i"], pr.params(lse=lse), entry)

    def splits_for(self, pr, entry, sms=132, waves=1, min_keys=256):
        """src/kernels/splitkv.rs `plan_splits`: as many blocks per unit as fit in the resident block slots (x waves),
        at least `min_keys` keys per split; splits divide the keys evenly (the kernel ignores kps)."""
        G = pr.Hq // pr.Hkv
        nw = entry["a"]
        units = pr.B * pr.Hkv * ((G * pr.Sq + 15) // 16)
        per_sm = max(1, min(228 * 1024 // (Lib.smem(entry) + 1024), 64 // nw))
        bpu = max(1, int(sms * per_sm * waves) // units)
        n = max(1, min(bpu * nw, -(-pr.Sk // min_keys)))
        kps = -(-(-(-pr.Sk // n)) // 32) * 32
        return n, kps

    def splitkv(self, pr, entry, n_splits=None, kps=None, lse=True, ws=None):
        if n_splits is None:
            n_splits, kps = self.splits_for(pr, entry)
        rows = pr.B * pr.Hq * pr.Sq
        # per block: partial LSEs, partial outputs, then a counter per (batch, row tile)
        nblk = -(-n_splits // entry["a"])
        units = pr.B * pr.Hkv * ((pr.Hq // pr.Hkv * pr.Sq + 15) // 16)
        need = (rows * nblk + 3) // 4 * 4 + rows * nblk * pr.D + units
        if ws is None or ws.numel() < need:
            ws = torch.empty(need, device="cuda", dtype=torch.float32)
        self.lib.launch(entry["i"], pr.params(lse=lse, workspace=ws, num_splits=n_splits, extra=kps), entry)
        return ws


def run_checks(lib, res, args):
    r = Runner(lib)
    cases = []
    dims = [64, 96, 128, 256]
    for d in dims:
        for dt in ("bf16", "f16"):
            for mask in ("none", "causal", "causal-br", "bool", "additive"):
                cases.append((2, 4, 4, 77, 130, d, dt, "bhsd", mask, None))
                cases.append((1, 8, 2, 130, 77, d, dt, "bshd", mask, None))
            cases.append((1, 8, 1, 200, 333, d, dt, "bshd", "causal-br", None))
            cases.append((1, 8, 8, 257, 257, d, dt, "bhsd", "causal", None))
            cases.append((2, 8, 2, 1, 1000, d, dt, "bhsd", "none", None))
            cases.append((1, 32, 4, 1, 4099, d, dt, "bshd", "causal-br", None))
            cases.append((3, 8, 8, 2, 2500, d, dt, "bhsd", "additive", None))
            cases.append((1, 4, 4, 64, 64, d, dt, "bhsd", "additive", (1, 1, 64, 64)))
            cases.append((2, 4, 1, 33, 190, d, dt, "bhsd", "bool", (2, 1, 1, 190)))
    for (B, Hq, Hkv, Sq, Sk, D, dt, layout, mask, mdims) in cases:
        pr = Problem(B, Hq, Hkv, Sq, Sk, D, dt, layout, mask, mdims, seed=Sq * 7 + Sk)
        ref_o, ref_lse = pr.reference()
        math_err = None
        if mask != "causal-br":
            math_err, _ = rel_err(torch_math(pr), ref_o)
        for kind in args.kinds.split(","):
            for e in lib.configs(kind, dt, D, mask_code(mask)):
                pr.o.fill_(float("nan")); pr.lse.fill_(float("nan"))
                if kind == "fa2":
                    r.fa2(pr, e)
                else:
                    r.splitkv(pr, e)
                torch.cuda.synchronize()
                err, nanbad = rel_err(pr.o, ref_o)
                le, lbad = lse_err(pr.lse, ref_lse)
                ok = err <= TOLERANCE[dt] and nanbad == 0 and lbad == 0 and le <= 1e-3 + TOLERANCE[dt] * float(
                    ref_lse[torch.isfinite(ref_lse)].abs().max() if torch.isfinite(ref_lse).any() else 0)
                if math_err is not None and err > 2 * max(math_err, 1e-4):
                    ok = False
                row = dict(kind=kind, cfg=e["cfg"], B=B, Hq=Hq, Hkv=Hkv, Sq=Sq, Sk=Sk, D=D, dt=dt,
                           layout=layout, mask=mask, mask_dims=mdims, rel_err=err, nan_mismatch=nanbad,
                           lse_err=le, lse_bad=lbad, math_err=math_err, ok=ok)
                res["checks"].append(row)
                if not ok:
                    log("FAIL", json.dumps(row))
    n_ok = sum(c["ok"] for c in res["checks"])
    log(f"CHECKS {n_ok}/{len(res['checks'])} passed")
    worst = {}
    for c in res["checks"]:
        key = (c["kind"], c["dt"])
        ratio = c["rel_err"] / max(c["math_err"], 1e-4) if c["math_err"] else float("nan")
        w = worst.setdefault(key, [0, 0])
        w[0] = max(w[0], c["rel_err"])
        if ratio == ratio:
            w[1] = max(w[1], ratio)
    for k, w in worst.items():
        log(f"  {k[0]:8} {k[1]:5} max rel_err {w[0]:.2e}  max err/torch-math-err {w[1]:.2f}")


def problem_bytes(pr):
    """The call's minimal bytes (Q, K, V read and O written once at the dtype's size), sdpa-core's cost model."""
    shape = dict(b=pr.B, hq=pr.Hq, hkv=pr.Hkv, sq=pr.Sq, sk=pr.Sk, d=pr.D)
    return int(cost(shape, pr.mask, pr.dt)[1])


def flops(B, Hq, Sq, Sk, D, causal):
    return cost(dict(b=B, hq=Hq, hkv=Hq, sq=Sq, sk=Sk, d=D), "causal" if causal else "none", "bf16")[0]


def torch_time(pr, backend, causal):
    def fn():
        return F.scaled_dot_product_attention(pr.q, pr.k, pr.v, is_causal=causal, enable_gqa=pr.Hq != pr.Hkv)
    try:
        if backend is None:
            return bench(fn)
        with sdpa_kernel([backend]):
            return bench(fn)
    except Exception as e:  # noqa: BLE001 - a backend refusing a shape is a data point
        log("torch backend failed", backend, repr(e)[:100])
        return None


def ceilings(res):
    res["ceilings"]["d2d_GBps"] = copy_gbps()
    res["ceilings"]["gemm_bf16_TFLOPs"] = gemm_tflops(torch.bfloat16)
    log("CEILINGS", json.dumps(res["ceilings"]))


def run_bench(lib, res, args):
    r = Runner(lib)
    seqs = [512, 2048, 8192] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]
    dts = ["bf16"] if args.quick else ["bf16", "f16"]
    for dt in dts:
        for D in (64, 128):
            for causal in (False, True):
                for S in seqs:
                    B, H = 16384 // S, 2048 // D
                    pr = Problem(B, H, H, S, S, D, dt, "bhsd", "causal" if causal else "none", seed=S)
                    fl = flops(B, H, S, S, D, causal)
                    row = dict(tag="fa2bench", dt=dt, B=B, H=H, S=S, D=D, causal=causal, ours={})
                    # Sanity at full size: our output against PyTorch's flash output.
                    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                        want = F.scaled_dot_product_attention(pr.q, pr.k, pr.v, is_causal=causal)
                    cfgs = lib.configs("fa2", dt, D, 1 if causal else 0)
                    if not args.tune:
                        cfgs = cfgs[:1]
                    for e in cfgs:
                        pr.o.fill_(float("nan"))
                        r.fa2(pr, e, lse=False)
                        err, nb = rel_err(pr.o, want)
                        ms = bench(lambda: r.fa2(pr, e, lse=False))
                        row["ours"][str(e["cfg"])] = dict(ms=ms, tflops=fl / ms / 1e9, err_vs_flash=err,
                                                                          nan=nb)
                    row["flash"] = torch_time(pr, SDPBackend.FLASH_ATTENTION, causal)
                    row["cudnn"] = torch_time(pr, None, causal)
                    best = min(row["ours"].items(), key=lambda kv: kv[1]["ms"])
                    row["best_cfg"], row["best_ms"] = best[0], best[1]["ms"]
                    res["bench"].append(row)
                    tf = lambda ms: fl / ms / 1e9 if ms else float("nan")
                    cf = " ".join(f"{k}:{v['tflops']:.0f}" for k, v in row["ours"].items())
                    log(f"{dt:4} D={D:3} c={int(causal)} S={S:5} flash={tf(row['flash']):5.0f} cudnn={tf(row['cudnn']):5.0f}"
                        f" | {cf} | x_flash={row['flash'] / row['best_ms']:.3f} x_cudnn={row['cudnn'] / row['best_ms']:.3f}"
                        f" err={best[1]['err_vs_flash']:.1e}")
                    del pr, want
                    torch.cuda.empty_cache()


def run_extra(lib, res, args):
    """Tile choice for D = 96 and 256 (no PyTorch anchor needed to pick among our own configs)."""
    r = Runner(lib)
    for D in (96, 256):
        for causal in (False, True):
            for S in (1024, 4096):
                B, H = 16384 // S, 2048 // D if D != 96 else 16
                pr = Problem(B, H, H, S, S, D, "bf16", "bhsd", "causal" if causal else "none", seed=S)
                fl = flops(B, H, S, S, D, causal)
                out = {}
                for e in lib.configs("fa2", "bf16", D, 1 if causal else 0):
                    ms = bench(lambda: r.fa2(pr, e, lse=False))
                    out[str(e["cfg"])] = fl / ms / 1e9
                fms = torch_time(pr, SDPBackend.FLASH_ATTENTION, causal)
                res["extra"].append(dict(D=D, S=S, causal=causal, tflops=out, flash_tflops=fl / fms / 1e9 if fms else None))
                log(f"extra D={D} c={int(causal)} S={S} flash={fl / fms / 1e9 if fms else float('nan'):.0f} | " +
                    " ".join(f"{k}:{v:.0f}" for k, v in out.items()))
                del pr
                torch.cuda.empty_cache()


def time_flushed(fn, flush_fn):
    """Median of event-timed calls, `flush_fn()` before each (outside the events), synchronized after each."""
    return time_events(fn, flush_fn, reps=50, warmup=10, queue_ahead=False)


def run_decode(lib, res, args):
    r = Runner(lib)
    # do_bench's flush writes 256 MB, leaving L2 full of dirty lines that the timed call writes back;
    # reading 256 MB leaves it full of clean ones.
    flushes = {"write": flush("dirty"), "read": flush("clean")}
    for (B, Hq, Hkv, Sk) in [(8, 32, 32, 4096), (1, 32, 8, 32768)]:
        D, dt = 128, "bf16"
        pr = Problem(B, Hq, Hkv, 1, Sk, D, dt, "bhsd", "none", seed=Sk)
        nbytes = problem_bytes(pr)
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            want = F.scaled_dot_product_attention(pr.q, pr.k, pr.v, enable_gqa=Hq != Hkv)
        row = dict(tag="decode", B=B, Hq=Hq, Hkv=Hkv, Sk=Sk, D=D, dt=dt, bytes=nbytes, ours={})
        entries = lib.configs("splitkv", dt, D, 0)
        for e in entries:
            for waves in [float(w) for w in args.waves.split(",")]:
                n, kps = r.splits_for(pr, e, waves=waves)
                ws = r.splitkv(pr, e, n, kps, lse=False)
                pr.o.fill_(float("nan"))
                r.splitkv(pr, e, n, kps, lse=False, ws=ws)
                err, nb = rel_err(pr.o, want)
                ms = bench(lambda: r.splitkv(pr, e, n, kps, lse=False, ws=ws))
                path = ("bulk" if e["e"] & 1 else "cpasync") + ("_ilv" if e["e"] & 2 else "")
                key = f"{e['kind']}_nw{e['a']}_st{e['b']}_ks{e['c']}_{path}_waves{waves}_splits{n}"
                row["ours"][key] = dict(ms=ms, GBps=nbytes / ms / 1e6, err_vs_flash=err, nan=nb, entry=e, splits=(n, kps))
        row["flash"] = torch_time(pr, SDPBackend.FLASH_ATTENTION, False)
        row["cudnn"] = torch_time(pr, None, False)
        best = min(((k, v) for k, v in row["ours"].items() if v["err_vs_flash"] < 1e-2 and v["nan"] == 0),
                   key=lambda kv: kv[1]["ms"])
        row["best_cfg"], row["best_ms"] = best
        e = best[1]["entry"]
        n, kps = best[1]["splits"]
        ws = r.splitkv(pr, e, n, kps, lse=False)
        # Without zeroing the counters each call (they reset themselves): the memset's cost.
        lib.lib.fa2dev_set_memset(0)
        row["best_no_memset_ms"] = bench(lambda: r.splitkv(pr, e, n, kps, lse=False, ws=ws))
        lib.lib.fa2dev_set_memset(1)
        # The same calls after a write flush (as do_bench) and after a read flush (clean L2).
        sdpa = lambda: F.scaled_dot_product_attention(pr.q, pr.k, pr.v, enable_gqa=Hq != Hkv)
        row["flush"] = {}
        for fname, fl in flushes.items():
            row["flush"][fname] = dict(
                ours=time_flushed(lambda: r.splitkv(pr, e, n, kps, lse=False, ws=ws), fl),
                cudnn=time_flushed(sdpa, fl),
                kv_sum=time_flushed(lambda: (pr.k.sum(dtype=torch.float32), pr.v.sum(dtype=torch.float32)), fl))
        log("  flush write/read (us): " + "; ".join(
            f"{k}: {row['flush']['write'][k] * 1e3:.1f} / {row['flush']['read'][k] * 1e3:.1f}" for k in ("ours", "cudnn", "kv_sum")))
        res["decode"].append(row)
        for k, v in sorted(row["ours"].items(), key=lambda kv: kv[1]["ms"]):
            log(f"  decode B={B} Hq={Hq} Hkv={Hkv} Sk={Sk} {k}: {v['ms'] * 1e3:7.1f} us {v['GBps']:6.0f} GB/s"
                f" err={v['err_vs_flash']:.1e}")
        log(f"DECODE B={B} Hq={Hq} Hkv={Hkv} Sk={Sk}: ours {best[1]['ms'] * 1e3:.1f} us ({best[1]['GBps']:.0f} GB/s,"
            f" {best[1]['GBps'] / res['ceilings'].get('d2d_GBps', float('nan')):.2f} of copy; no memset"
            f" {row['best_no_memset_ms'] * 1e3:.1f} us) flash {row['flash'] * 1e3:.1f} us"
            f" default {row['cudnn'] * 1e3:.1f} us x_default={row['cudnn'] / best[1]['ms']:.3f} [{best[0]}]")
        del pr, ws
        torch.cuda.empty_cache()


def run_decode_ab(lib, res, args):
    """Split-KV variants at explicit split counts on the two decoding shapes, and fa2 tiles on issue 4's
    tiny shapes; ours and PyTorch's timed the same way (do_bench: 256 MB write flush, median), plus ours
    and cuDNN after a read flush (clean L2)."""
    r = Runner(lib)
    read_flush = flush("clean")
    plans = {
        (8, 32, 32, 4096): [((4, 2, 32, 0), 4), ((4, 2, 32, 2), 4), ((8, 2, 16, 0), 8), ((4, 2, 32, 0), 4)],
        (1, 32, 8, 32768): [((4, 3, 32, 1), 64), ((4, 3, 32, 3), 64), ((8, 2, 16, 1), 128), ((4, 3, 32, 1), 60),
                            ((4, 2, 32, 0), 64), ((4, 3, 32, 1), 64)],
    }
    res["decode_ab"] = []
    for (B, Hq, Hkv, Sk), variants in plans.items():
        D, dt = 128, "bf16"
        pr = Problem(B, Hq, Hkv, 1, Sk, D, dt, "bhsd", "none", seed=Sk)
        nbytes = problem_bytes(pr)
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            want = F.scaled_dot_product_attention(pr.q, pr.k, pr.v, enable_gqa=Hq != Hkv)
        sdpa = lambda: F.scaled_dot_product_attention(pr.q, pr.k, pr.v, enable_gqa=Hq != Hkv)
        row = dict(B=B, Hq=Hq, Hkv=Hkv, Sk=Sk, bytes=nbytes, cudnn=bench(sdpa), cudnn_read=time_flushed(sdpa, read_flush))
        for cfg, n in variants:
            e = lib.find("splitkv", dt, D, 0, cfg)
            if e is None:
                log("missing", cfg)
                continue
            ws = r.splitkv(pr, e, n, 0, lse=False)
            pr.o.fill_(float("nan"))
            r.splitkv(pr, e, n, 0, lse=False, ws=ws)
            err, nb = rel_err(pr.o, want)
            ms = bench(lambda: r.splitkv(pr, e, n, 0, lse=False, ws=ws))
            ms_read = time_flushed(lambda: r.splitkv(pr, e, n, 0, lse=False, ws=ws), read_flush)
            key = f"nw{cfg[0]}_st{cfg[1]}_ks{cfg[2]}_{'bulk' if cfg[3] & 1 else 'cp'}{'_ilv' if cfg[3] & 2 else ''}_n{n}"
            row[key] = dict(ms=ms, ms_read=ms_read, err=err, nan=nb)
            log(f"AB B={B} Sk={Sk} {key:28}: {ms * 1e3:6.1f} us (read flush {ms_read * 1e3:6.1f}) "
                f"{nbytes / ms / 1e6 / res['ceilings']['d2d_GBps']:.3f} of copy, x cudnn {row['cudnn'] / ms:.3f} "
                f"err {err:.1e} nan {nb}")
        log(f"AB B={B} Sk={Sk} cudnn {row['cudnn'] * 1e3:6.1f} us (read flush {row['cudnn_read'] * 1e3:6.1f})")
        res["decode_ab"].append(row)
        del pr, ws
        torch.cuda.empty_cache()
    for D, S in [(64, 64), (64, 128), (64, 512), (128, 64), (128, 128), (128, 512)]:
        pr = Problem(1, 1, 1, S, S, D, "bf16", "bhsd", "none", seed=S)
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            want = F.scaled_dot_product_attention(pr.q, pr.k, pr.v)
        row = dict(S=S, cudnn=torch_time(pr, None, False), flash=torch_time(pr, SDPBackend.FLASH_ATTENTION, False))
        for e in lib.configs("fa2", "bf16", D, 0):
            pr.o.fill_(float("nan"))
            r.fa2(pr, e, lse=False)
            err, nb = rel_err(pr.o, want)
            ms = bench(lambda: r.fa2(pr, e, lse=False))
            row[str(e["cfg"])] = dict(ms=ms, err=err, nan=nb)
            log(f"TINY D={D} S={S} fa2 {str(e['cfg']):18}: {ms * 1e3:5.2f} us x default {row['cudnn'] / ms:.3f} "
                f"x flash {row['flash'] / ms:.3f} err {err:.1e} nan {nb}")
        log(f"TINY D={D} S={S} default {row['cudnn'] * 1e3:.2f} us flash {row['flash'] * 1e3:.2f} us")
        row["D"] = D
        res["decode_ab"].append(row)


def run_ncu_target(lib, args):
    """One call of each decoding shape (ours with the first bulk config, then PyTorch's default), for ncu."""
    r = Runner(lib)
    for (B, Hq, Hkv, Sk) in [(8, 32, 32, 4096), (1, 32, 8, 32768)]:
        pr = Problem(B, Hq, Hkv, 1, Sk, 128, "bf16", "bhsd", "none", seed=Sk)
        e = [c for c in lib.configs("splitkv", "bf16", 128, 0) if c["e"] & 1][0]
        n, kps = r.splits_for(pr, e, waves=2)
        ws = r.splitkv(pr, e, n, kps, lse=False)
        r.splitkv(pr, e, n, kps, lse=False, ws=ws)
        F.scaled_dot_product_attention(pr.q, pr.k, pr.v, enable_gqa=Hq != Hkv)
        torch.cuda.synchronize()


def main():
    ap = harness_parser()
    ap.add_argument("--decode", action="store_true")
    ap.add_argument("--decode-ab", action="store_true", help="split-KV variants at fixed splits, fa2 tiny tiles")
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--extra", action="store_true")
    ap.add_argument("--kinds", default="fa2,splitkv", help="kernels to check: fa2, splitkv")
    ap.add_argument("--waves", default="2", help="split counts to time, in waves of resident warps")
    ap.add_argument("--ncu-target", action="store_true", help="one call per decoding shape, for ncu")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    lib = Lib(args.lib)
    if args.ncu_target:
        run_ncu_target(lib, args)
        return
    res = dict(env=env_info(), ceilings={}, checks=[], bench=[], decode=[], extra=[])
    log("ENV", json.dumps(res["env"]))
    try:
        if args.check:
            run_checks(lib, res, args)
        if args.bench or args.decode or args.decode_ab:
            ceilings(res)
        if args.bench:
            run_bench(lib, res, args)
        if args.decode:
            run_decode(lib, res, args)
        if args.decode_ab:
            run_decode_ab(lib, res, args)
        if args.extra:
            run_extra(lib, res, args)
    finally:
        save(res, args.out, "fa2dev.json")
    if res["bench"]:
        for dt in ("bf16", "f16"):
            rows = [b for b in res["bench"] if b["dt"] == dt]
            if not rows:
                continue
            xf = sorted(b["flash"] / b["best_ms"] for b in rows if b["flash"])
            xc = sorted(b["cudnn"] / b["best_ms"] for b in rows if b["cudnn"])
            log(f"SUMMARY {dt}: vs flash median {xf[len(xf) // 2]:.3f} min {xf[0]:.3f} | vs cudnn median "
                f"{xc[len(xc) // 2]:.3f} min {xc[0]:.3f}")


if __name__ == "__main__":
    main()
