#!/usr/bin/env python3
"""Time PyTorch's CPU scaled_dot_product_attention (fused) and the eager matmul-softmax-matmul (unfused)
on the CPU issue's shapes, interleaved in the same run with sdpa-cpu's kernels, and write result records
(sdpa-core's BenchRecord format, one JSON array) plus a markdown table of ratios.

    cargo build --release -p sdpa-cpu --example cpu_bench
    python3 bench/cpu/pytorch_cpu_sdpa.py --ours target/release/examples/cpu_bench --threads 2 --rounds 3

Without --ours only PyTorch is timed. `--ours-variant LABEL:VAR=VALUE` (repeatable) also times ours with VAR=VALUE
in its environment right after its plain run of each case (records name the kernel `fa2@LABEL`), e.g. AMX tile
shapes against the tile rule with `--simd amx --preset amx`; records keep each round's median. `--simd avx2` (or SDPA_CPU_SIMD in the environment) forces one SIMD path on
both sides: ours through SDPA_CPU_SIMD, PyTorch's through the instruction-set caps of ATen, oneDNN and MKL
(bench/pytorch_sdpa.py's ISA_CAPS, set before torch is imported); the records say which capability ATen ran. Each round runs every case once on each side (PyTorch fused,
PyTorch unfused, ours), so background load hits both sides alike; the record's median is the median of
the per-round medians, min and max are over all samples. The same run also measures the machine's
ceilings: the f32 FMA rate at the forced path's vector width on one thread and on --threads threads at once
(ours --fma-peak), read bandwidth (torch sum over 1 GiB) and, with
--ours, the read bandwidth of a Rust streaming sum with 512-bit loads (ours --read-bw, best of 6 passes).
"""

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import time

# The cost model, tolerances and CPU model live in bench/sdpa_common.py (shared with bench/pytorch_sdpa.py and
# sdpa-cuda/dev); its folder goes on sys.path here, which also serves the peak-memory child that imports this file.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from sdpa_common import TOLERANCE as TOL, cost, cpu_model  # noqa: E402
from pytorch_sdpa import ISA_CAPS  # noqa: E402


def git_commit():
    # A copy run away from its checkout (the device machine runs /work/main's tree) names its commit here.
    if os.environ.get("SDPA_BENCH_COMMIT"):
        return os.environ["SDPA_BENCH_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def record(backend, kernel, device, dtype, shape, mask, threads, samples, per_round, check, machine, extra=None):
    flops, byts = cost(shape, mask, dtype)
    med = statistics.median(per_round)
    r = {
        "backend": backend, "kernel": kernel, "device": device, "dtype": dtype, "shape": shape, "mask": mask,
        "layout": "bhsd", "threads": threads,
        "time_ms": {"median": med, "min": min(samples), "max": max(samples), "reps": len(samples)},
        # The spread across rounds (each round's median), so a noisy host shows as such in the record.
        "round_medians_ms": list(per_round),
        "tflops": flops / (med * 1e-3) / 1e12, "gbps": byts / (med * 1e-3) / 1e9,
        "check": check, "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
    }
    if extra:
        r.update(extra)
    return r


class Torch:
    def __init__(self, threads):
        import torch
        self.torch = torch
        torch.set_num_threads(threads)
        self.F = torch.nn.functional
        # The instruction set ATen's CPU kernels dispatch to (ATEN_CPU_CAPABILITY may have lowered it).
        self.capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: None)()
        cap = f", ATen {self.capability}" if self.capability else ""
        self.device = f"{cpu_model()} (pytorch {torch.__version__}{cap}, {threads} threads)"

    def inputs(self, shape, dtype, seed=0):
        t = self.torch
        g = t.Generator().manual_seed(seed)
        dt = {"f32": t.float32, "f16": t.float16, "bf16": t.bfloat16}[dtype]
        amp = math.sqrt(3.0)
        mk = lambda h, s, d: ((t.rand(shape["b"], h, s, d, generator=g) * 2 - 1) * amp).to(dt)
        return mk(shape["hq"], shape["sq"], shape["d"]), mk(shape["hkv"], shape["sk"], shape["d"]), \
            mk(shape["hkv"], shape["sk"], shape["dv"])

    def fn(self, kernel, shape, mask):
        t, F = self.torch, self.F
        causal = mask == "causal"
        gqa = shape["hq"] != shape["hkv"]
        if kernel == "fused":
            return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        scale = 1.0 / math.sqrt(shape["d"])
        keep = None
        if causal:
            keep = t.ones(shape["sq"], shape["sk"], dtype=t.bool).tril()

        def unfused(q, k, v):
            if gqa:
                rep = shape["hq"] // shape["hkv"]
                k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            s = (q @ k.transpose(-2, -1)) * scale
            if keep is not None:
                s = s.masked_fill(~keep, float("-inf"))
            return t.softmax(s, dim=-1) @ v
        return unfused

    def time(self, kernel, shape, mask, dtype, warmup, reps):
        q, k, v = self.inputs(shape, dtype)
        f = self.fn(kernel, shape, mask)
        with self.torch.inference_mode():
            for _ in range(warmup):
                f(q, k, v)
            out = []
            for _ in range(reps):
                t0 = time.perf_counter()
                f(q, k, v)
                out.append((time.perf_counter() - t0) * 1e3)
        return out

    def check(self, kernel, shape, mask, dtype, rows=16):
        """Relative L2 error of the first and last `rows` query rows against float64."""
        t = self.torch
        q, k, v = self.inputs(shape, dtype, seed=1)
        with t.inference_mode():
            o = self.fn(kernel, shape, mask)(q, k, v).double()
            sq = shape["sq"]
            idx = sorted(set(list(range(min(rows, sq))) + list(range(max(0, sq - rows), sq))))
            qd, kd, vd = q.double(), k.double(), v.double()
            rep = shape["hq"] // shape["hkv"]
            kd, vd = kd.repeat_interleave(rep, 1), vd.repeat_interleave(rep, 1)
            s = (qd[:, :, idx] @ kd.transpose(-2, -1)) / math.sqrt(shape["d"])
            if mask == "causal":
                j = t.arange(shape["sk"])
                allowed = j[None, :] <= t.tensor(idx)[:, None]
                s = s.masked_fill(~allowed, float("-inf"))
            ref = t.softmax(s, -1) @ vd
            got = o[:, :, idx]
            err = float(((got - ref).norm() / ref.norm()).item())
            mx = float((got - ref).abs().max().item())
        return {"max_abs_err": mx, "rel_err": err, "tolerance": TOL[dtype], "pass": err <= TOL[dtype],
                "rows_checked": len(idx) * shape["b"] * shape["hq"]}

    def read_bandwidth(self, gib=1.0, reps=5):
        t = self.torch
        x = t.ones(int(gib * 2**30) // 4, dtype=t.float32)
        x.sum()
        best = []
        for _ in range(reps):
            t0 = time.perf_counter()
            x.sum()
            best.append(time.perf_counter() - t0)
        return x.numel() * 4 / statistics.median(best) / 1e9


def shp(b, hq, hkv, sq, sk, d, dv=None):
    return {"b": b, "hq": hq, "hkv": hkv, "sq": sq, "sk": sk, "d": d, "dv": dv or d}


def cases(preset, dtypes=None):
    """The preset's cases; `dtypes` (a list) replaces the dtypes of the presets that sweep f32 and bf16."""
    both = dtypes or ("f32", "bf16")
    prefill = [shp(1, 8, 8, 1024, 1024, 64), shp(1, 8, 8, 2048, 2048, 64), shp(1, 16, 16, 4096, 4096, 128)]
    out = []
    if preset == "small":
        # Cache-resident shapes whose calls take about a millisecond: on a shared machine the fastest of many
        # calls is one that nothing interrupted, so the ratio of minima is the cleanest comparison there is.
        for dtype in both:
            for s in (shp(1, 4, 4, 512, 512, 64), shp(1, 2, 2, 512, 512, 128)):
                for mask in ("none", "causal"):
                    out.append({"shape": s, "mask": mask, "dtype": dtype, "ours": ["fa2"]})
    if preset == "prefill":
        # Issue 21's AVX2 grid: the three prefill shapes, f32 and bf16, causal and not, fa2 only.
        for dtype in both:
            for s in prefill:
                for mask in ("none", "causal"):
                    out.append({"shape": s, "mask": mask, "dtype": dtype, "ours": ["fa2"]})
    if preset == "headdims":
        # Issue 21's CPU head-dim sweep at B = 1, H = 8, S = 1024 (bench/presets/headdims.json's headdims-cpu),
        # with D = 64 and 128 as the references the other head dims are held to.
        for dtype in both:
            for d, dv in ((32, 32), (40, 40), (64, 64), (80, 80), (96, 96), (128, 128), (160, 160), (192, 192),
                          (256, 256), (192, 128), (512, 512)):
                for mask in ("none", "causal"):
                    out.append({"shape": shp(1, 8, 8, 1024, 1024, d, dv), "mask": mask, "dtype": dtype,
                                "ours": ["fa2"]})
    if preset == "amx":
        # Issue 21's AMX points: bf16, B = 1, H = 16, S = 4096, D = 128 and 64, causal and not.
        for d in (128, 64):
            for mask in ("none", "causal"):
                out.append({"shape": shp(1, 16, 16, 4096, 4096, d), "mask": mask, "dtype": "bf16", "ours": ["fa2"]})
    if preset == "decode":
        for dtype in both:
            out.append({"shape": shp(1, 32, 32, 1, 4096, 128), "mask": "none", "dtype": dtype,
                        "ours": ["fa2", "splitkv", "unfused"]})
    if preset in ("issue", "quick"):
        for dtype in both:
            for s in (prefill[:1] if preset == "quick" else prefill):
                for mask in ("none", "causal"):
                    ours = ["fa2", "unfused"] if s["sq"] <= 1024 and dtype == "f32" else ["fa2"]
                    out.append({"shape": s, "mask": mask, "dtype": dtype, "ours": ours})
        for dtype in both:
            out.append({"shape": shp(1, 32, 32, 1, 4096, 128), "mask": "none", "dtype": dtype,
                        "ours": ["fa2", "splitkv", "unfused"]})
    return out


def run_ours(binary, case, threads, warmup, reps, check_rows=None, peak_mem=False, env=None):
    s = case["shape"]
    shape = ",".join(str(s[k]) for k in ("b", "hq", "hkv", "sq", "sk", "d", "dv"))
    cmd = [binary, "--shape", shape, "--mask", case["mask"], "--dtype", case["dtype"], "--kernels",
           ",".join(case["ours"]), "--threads", str(threads), "--warmup", str(warmup), "--reps", str(reps)]
    if check_rows:
        cmd += ["--check", str(check_rows)]
    if peak_mem:
        cmd += ["--peak-mem"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **env) if env else None)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {res.stderr.strip()}")
    return json.loads(res.stdout)


def torch_peak_mem(case, kernel, threads):
    """Peak RSS of a fresh Python process that runs one PyTorch call (bytes)."""
    code = (
        "import json,resource,sys;sys.path.insert(0,%r);import pytorch_cpu_sdpa as m;"
        "t=m.Torch(%d);c=json.loads(%r);q,k,v=t.inputs(c['shape'],c['dtype']);"
        "k_=%r;f=t.fn(k_,c['shape'],c['mask']) if k_!='none' else (lambda *a: None);"
        "import torch\nwith torch.inference_mode(): f(q,k,v)\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss*1024)"
    ) % (os.path.dirname(os.path.abspath(__file__)), threads, json.dumps(case), kernel)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if res.returncode != 0:
        return None
    return int(res.stdout.strip().splitlines()[-1])


def render_md(records, meta):
    """A markdown table: our kernels against PyTorch's fused and unfused on each case (ratios of medians and
    of minima), achieved GFLOP/s and GB/s, and the ceilings measured in the same run."""
    def key(r):
        return (json.dumps(r["shape"], sort_keys=True), r["mask"], r["dtype"])
    by = {}
    for r in records:
        if math.isnan(r["time_ms"]["median"]):
            continue
        by.setdefault(key(r), {})[(r["backend"], r["kernel"])] = r
    peak2 = 2 * meta["fma_gflops_1t_median"] if meta.get("fma_gflops_1t_median") else None
    # The ceiling of all threads together, measured at once (newer runs), else twice the one-thread rate.
    peak = meta.get("fma_gflops_threads_median") or peak2
    lines = [
        "| dtype | B,Hq,Hkv,Sq,Sk,D(,Dv) | mask | ours | ours ms (min) | GFLOP/s | % of FMA peak | PyTorch fused ms "
        "(min) | PyTorch GFLOP/s | PyTorch unfused ms (min) | x fused (median / min) | x best PyTorch (median / min) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for k, rs in by.items():
        pf, pu = rs.get(("pytorch", "fused")), rs.get(("pytorch", "unfused"))
        if not pf:
            continue
        for (be, kern), r in sorted(rs.items()):
            if be != "cpu":
                continue
            sh = r["shape"]
            t, tmin = r["time_ms"]["median"], r["time_ms"]["min"]
            best = min([x for x in (pf, pu) if x], key=lambda x: x["time_ms"]["median"])
            bestmin = min(x["time_ms"]["min"] for x in (pf, pu) if x)
            dims = f"{sh['b']},{sh['hq']},{sh['hkv']},{sh['sq']},{sh['sk']},{sh['d']}"
            if sh.get("dv", sh["d"]) != sh["d"]:
                dims += f",{sh['dv']}"
            eff = f"{100 * r['tflops'] * 1e3 / peak:.0f} %" if peak else "-"
            unf = f"{pu['time_ms']['median']:.2f} ({pu['time_ms']['min']:.2f})" if pu else "-"
            lines.append(
                f"| {r['dtype']} | {dims} | {r['mask']} | "
                f"{kern} | {t:.2f} ({tmin:.2f}) | {r['tflops'] * 1e3:.0f} | {eff} | "
                f"{pf['time_ms']['median']:.2f} ({pf['time_ms']['min']:.2f}) | {pf['tflops'] * 1e3:.0f} | {unf} | "
                f"{pf['time_ms']['median'] / t:.2f} / {pf['time_ms']['min'] / tmin:.2f} | "
                f"{best['time_ms']['median'] / t:.2f} / {bestmin / tmin:.2f} |")
    mem = [r for r in records if r.get("peak_mem_bytes")]
    if mem:
        lines += ["", "Peak resident memory of a fresh process running one call at B=1, H=2, Sq=Sk=16384, D=64, f32 "
                  "(inputs and output are 32 MiB of it):", "",
                  "| backend | kernel | peak RSS (MiB) |", "| --- | --- | --- |"]
        for r in mem:
            lines.append(f"| {r['backend']} | {r['kernel']} | {r['peak_mem_bytes'] / 2**20:.0f} |")
    simd = f" ({meta['simd']} path, {meta.get('fma_bits')}-bit FMAs)" if meta.get("simd") else ""
    both = (f"; {meta.get('threads')} threads at once {meta['fma_gflops_threads_median']:.1f}"
            if meta.get("fma_gflops_threads_median") else f" (2 threads: {peak2})")
    lines += ["", f"Ceilings measured in the same run{simd}: single-thread f32 FMA {meta.get('fma_gflops_1t_median')} "
              f"GFLOP/s{both}"
              + (f", read bandwidth (torch sum over 1 GiB, 2 threads) {meta['read_gbps_median']:.1f} GB/s"
                 if meta.get("read_gbps_median") else "")
              + (f", read bandwidth (Rust 512-bit streaming sum, best of 6 passes, same threads) "
                 f"{meta['read_gbps_rust_median']:.1f} GB/s" if meta.get("read_gbps_rust_median") else "")
              + (f"; ATen CPU capability {meta['aten_cpu_capability']}" if meta.get("aten_cpu_capability") else "")
              + f"; 1-minute load average at the start of each round: "
              f"{', '.join(f'{x:.1f}' for x in meta['loadavg_1min_per_round'])}."]
    return "\n".join(lines) + "\n"


def render_sweep(records, meta):
    """The head-dim sweep as issue 21 judges it: per dtype and mask, our GFLOP/s at each head dim, as a fraction of
    the better of D = 64 and D = 128 (the bar: within 15 %), its fraction of the FMA peak measured in the same run,
    and the ratio to PyTorch's fused kernel (median times)."""
    peak = meta.get("fma_gflops_threads_median") or (2 * meta["fma_gflops_1t_median"]
                                                     if meta.get("fma_gflops_1t_median") else None)
    ours, torch = {}, {}
    for r in records:
        sh = r["shape"]
        key = (r["dtype"], r["mask"])
        dim = (sh["d"], sh.get("dv", sh["d"]))
        if r["backend"] == "cpu":
            # Each of our kernels (and `--ours-variant` runs, `fa2@LABEL`) is a sweep of its own.
            ours.setdefault(key + (r["kernel"],), {})[dim] = r
        elif r["kernel"] == "fused":
            torch.setdefault(key, {})[dim] = r
    lines = ["| dtype | mask | ours | D (Dv) | GFLOP/s | of best(D=64, 128) | % of FMA peak | x PyTorch fused |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (dtype, mask, kernel), by in ours.items():
        key = (dtype, mask)
        refs = [by[d]["tflops"] for d in ((64, 64), (128, 128)) if d in by]
        ref = max(refs) if refs else None
        for dim, r in sorted(by.items()):
            g = r["tflops"] * 1e3
            t = torch.get(key, {}).get(dim)
            x = f"{t['time_ms']['median'] / r['time_ms']['median']:.2f}" if t else "-"
            rel = f"{r['tflops'] / ref:.2f}" if ref else "-"
            eff = f"{100 * g / peak:.0f} %" if peak else "-"
            name = f"{dim[0]}" if dim[0] == dim[1] else f"{dim[0]} ({dim[1]})"
            lines.append(f"| {dtype} | {mask} | {kernel} | {name} | {g:.0f} | {rel} | {eff} | {x} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", help="path to sdpa-cpu's cpu_bench example binary")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--dtypes", default=None,
                    help="comma-separated dtypes for the presets that sweep f32 and bf16 (e.g. f32,bf16,f16)")
    ap.add_argument("--preset", default="issue", choices=["issue", "quick", "small", "decode", "prefill", "headdims", "amx"])
    ap.add_argument("--simd", default=os.environ.get("SDPA_CPU_SIMD", ""),
                    help="force one SIMD path on both sides (avx2, avx512, avx512-bf16, scalar)")
    ap.add_argument("--torch-kernels", default="fused,unfused",
                    help="PyTorch's sides to time: fused (F.scaled_dot_product_attention), unfused, or both")
    ap.add_argument("--ours-variant", action="append", default=[], metavar="LABEL:VAR=VALUE",
                    help="also time ours with VAR=VALUE in its environment, right after the plain run of each case "
                         "(records name the kernel KERNEL@LABEL); repeatable")
    ap.add_argument("--no-read-bw", action="store_true", help="skip the read-bandwidth ceilings (compute-bound presets)")
    ap.add_argument("--peak-mem", action="store_true", help="also measure peak memory at Sq = Sk = 16384")
    ap.add_argument("--out", default=None, help="JSON output (default bench/results/cpu/cpu-<date>.json)")
    ap.add_argument("--render", metavar="JSON", help="only print the markdown table of an earlier run")
    ap.add_argument("--render-sweep", metavar="JSON", help="only print an earlier headdims run as the head-dim sweep")
    args = ap.parse_args()
    if args.render or args.render_sweep:
        path = args.render or args.render_sweep
        with open(path) as f:
            recs = json.load(f)
        with open(path.replace(".json", "-meta.json")) as f:
            meta = json.load(f)
        print(render_sweep(recs, meta) if args.render_sweep else render_md(recs, meta))
        return

    simd = args.simd.strip().lower()
    if simd:
        if simd not in ISA_CAPS:
            raise SystemExit(f"pytorch_cpu_sdpa.py: --simd {simd} is not a path ({', '.join(sorted(ISA_CAPS))})")
        # Ours reads SDPA_CPU_SIMD (the child inherits it); PyTorch's caps must be set before torch is imported.
        os.environ["SDPA_CPU_SIMD"] = simd
        for var, cap in ISA_CAPS[simd].items():
            os.environ.setdefault(var, cap)
    torch_kernels = [k for k in args.torch_kernels.split(",") if k]
    if not torch_kernels or any(k not in ("fused", "unfused") for k in torch_kernels):
        raise SystemExit("pytorch_cpu_sdpa.py: --torch-kernels takes fused, unfused or both")
    variants = []
    for v in args.ours_variant:
        label, _, assign = v.partition(":")
        var, eq, val = assign.partition("=")
        if not label or not var or not eq:
            raise SystemExit(f"pytorch_cpu_sdpa.py: --ours-variant {v!r} is not LABEL:VAR=VALUE")
        variants.append((label, {var: val}))
    torch_side = Torch(args.threads)
    machine = cpu_model()
    print(f"pytorch {torch_side.torch.__version__}, {args.threads} threads, machine {machine}", file=sys.stderr)
    cs = cases(args.preset, args.dtypes.split(",") if args.dtypes else None)
    samples = {}  # key -> (all samples, per-round medians)

    def add(key, times):
        a, pr = samples.setdefault(key, ([], []))
        a.extend(times)
        pr.append(statistics.median(times))

    ours_meta = {}
    ceilings = {"fma_gflops_1t": [], "fma_gflops_threads": [], "read_gbps": [], "read_gbps_rust": [], "loadavg": []}
    fma_info = {}
    for rnd in range(args.rounds):
        ceilings["loadavg"].append(os.getloadavg()[0])
        if args.ours:
            out = subprocess.run([args.ours, "--fma-peak", "--threads", str(args.threads)], capture_output=True,
                                 text=True, check=True).stdout
            fma = json.loads(out)
            if fma.get("fma_peak_gflops_1t") is not None:  # null on the scalar path: no vector ceiling
                ceilings["fma_gflops_1t"].append(fma["fma_peak_gflops_1t"])
            if "fma_peak_gflops_threads" in fma:
                ceilings["fma_gflops_threads"].append(fma["fma_peak_gflops_threads"])
                fma_info = {"simd": fma.get("simd"), "fma_bits": fma.get("fma_bits")}
            if not args.no_read_bw:
                out = subprocess.run([args.ours, "--read-bw", "--threads", str(args.threads)], capture_output=True,
                                     text=True, check=True).stdout
                ceilings["read_gbps_rust"].append(json.loads(out)["read_gbps"])
        if not args.no_read_bw:
            ceilings["read_gbps"].append(torch_side.read_bandwidth())
        for c in cs:
            big = c["shape"]["sq"] * c["shape"]["sk"] * c["shape"]["hq"] >= 16 * 4096 * 4096
            reps = max(2, args.reps // 2) if big else args.reps
            key = (json.dumps(c["shape"], sort_keys=True), c["mask"], c["dtype"])
            for kernel in torch_kernels:
                add(("pytorch", kernel) + key, torch_side.time(kernel, c["shape"], c["mask"], c["dtype"],
                                                              args.warmup, reps))
            for label, env in ([(None, None)] + variants) if args.ours else []:
                for r in run_ours(args.ours, c, args.threads, args.warmup, reps,
                                  check_rows=64 if rnd == 0 else None, env=env):
                    k2 = ("cpu", r["kernel"] + (f"@{label}" if label else "")) + key
                    # The runner reports per-rep times only as stats: use its median as this round's sample.
                    add(k2, [r["time_ms"]["median"]])
                    samples[k2][0].extend([r["time_ms"]["min"], r["time_ms"]["max"]])
                    if rnd == 0:
                        ours_meta[k2] = r
            print(f"round {rnd + 1}/{args.rounds}: {c['dtype']} {c['shape']['hq']}x{c['shape']['sq']}x"
                  f"{c['shape']['sk']}x{c['shape']['d']} {c['mask']} done", file=sys.stderr)

    records = []
    for c in cs:
        key = (json.dumps(c["shape"], sort_keys=True), c["mask"], c["dtype"])
        for kernel in torch_kernels:
            a, pr = samples[("pytorch", kernel) + key]
            chk = torch_side.check(kernel, c["shape"], c["mask"], c["dtype"]) if c["shape"]["sq"] * c["shape"]["sk"] \
                <= 4096 * 4096 else None
            records.append(record("pytorch", kernel, torch_side.device, c["dtype"], c["shape"], c["mask"],
                                  args.threads, a, pr, chk, machine))
        for k2, meta in ours_meta.items():
            if k2[2:] != key:
                continue
            a, pr = samples[k2]
            records.append(record("cpu", k2[1], meta["device"], c["dtype"], c["shape"], c["mask"], args.threads,
                                  a, pr, meta.get("check"), machine, {"f32_math": "exact"}))

    if args.peak_mem and args.ours:
        # Two heads: PyTorch's unfused path holds B·H·Sq·Sk scores twice (scores and probabilities), 4 GiB here.
        big = {"shape": shp(1, 2, 2, 16384, 16384, 64), "mask": "none", "dtype": "f32", "ours": ["fa2"]}
        for kernel in ("fa2", "unfused"):
            r = run_ours(args.ours, dict(big, ours=[kernel]), args.threads, 0, 1, peak_mem=True)[0]
            records.append(r)
        for kernel in ("none", "fused", "unfused"):
            # "none": the same process without the call (interpreter, torch and the inputs), for reference.
            pm = torch_peak_mem(big, kernel, args.threads)
            records.append({"backend": "pytorch", "kernel": kernel, "device": torch_side.device, "dtype": "f32",
                            "shape": big["shape"], "mask": "none", "threads": args.threads,
                            "time_ms": {"median": float("nan"), "min": float("nan"), "max": float("nan")},
                            "tflops": 0.0, "gbps": 0.0, "check": None, "peak_mem_bytes": pm,
                            "commit": git_commit(), "machine": machine})

    meta = {
        "fma_gflops_1t_median": statistics.median(ceilings["fma_gflops_1t"]) if ceilings["fma_gflops_1t"] else None,
        "fma_gflops_1t_per_round": ceilings["fma_gflops_1t"],
        "fma_gflops_threads_median": statistics.median(ceilings["fma_gflops_threads"])
        if ceilings["fma_gflops_threads"] else None,
        "fma_gflops_threads_per_round": ceilings["fma_gflops_threads"],
        **fma_info,
        "aten_cpu_capability": torch_side.capability,
        "read_gbps_median": statistics.median(ceilings["read_gbps"]) if ceilings["read_gbps"] else None,
        "read_gbps_per_round": ceilings["read_gbps"],
        "read_gbps_rust_per_round": ceilings["read_gbps_rust"],
        "read_gbps_rust_median": statistics.median(ceilings["read_gbps_rust"]) if ceilings["read_gbps_rust"] else None,
        "loadavg_1min_per_round": ceilings["loadavg"],
        "pytorch": torch_side.torch.__version__, "threads": args.threads, "rounds": args.rounds,
        "command": " ".join([os.path.relpath(sys.executable) if False else "python3"] + sys.argv),
    }
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M")
    out = args.out or os.path.join("bench", "results", "cpu", f"cpu-{date}.json")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(records, f, indent=1, allow_nan=True)
    with open(out.replace(".json", "-meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps(meta), file=sys.stderr)
    print(render_md(records, meta))
    print(out)


if __name__ == "__main__":
    main()
