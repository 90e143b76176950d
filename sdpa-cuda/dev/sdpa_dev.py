"""The pieces the study scripts of sdpa-cuda/dev share, so each script holds only its own experiment.

- `Params`: the ctypes mirror of `AttnParams` (src/checked/params.rs, kernels/common.cuh), and `fill_params`, which
  fills it from torch tensors; `DevLib` loads an nvcc-built harness library (fa1_host.cu, fa2_host.cu,
  tf32_host.cu: `<prefix>_params_size/count/entry/launch`, dev_host.cuh) and launches its entries.
- `reference`, `rel_err`, `lse_err`: the float64 check of a kernel's output and LSE.
- `bench` (triton's do_bench median), `time_events` and `flush` (event timing after either L2 flush of the
  Rust backend), `copy_gbps` and `gemm_tflops` (the ceilings measured in the same run), `env_info`.
- `cost`, `TOLERANCE` (bench/sdpa_common.py: sdpa-core's cost model and tolerances) and `point`,
  `run_points`, `key` (bench/gpu/cuda_driver.py: the Rust driver `cuda_kernels` on a list of points).

torch and triton are imported on first use, so `python3 sdpa-cuda/dev/sdpa_dev.py` (the self-test: the
Params layout and the cost model) runs on a machine without them.
"""
import ctypes
import math
import os
import statistics
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.join(_HERE, "..", "..")
for _d in (os.path.join(_ROOT, "bench"), os.path.join(_ROOT, "bench", "gpu")):
    if _d not in sys.path:
        sys.path.insert(0, _d)

from cuda_driver import key, point, run_points, unique_keys, write_points  # noqa: E402
from sdpa_common import ELEM_BYTES, TOLERANCE, cost  # noqa: E402

__all__ = [
    # re-exported from bench/sdpa_common.py and bench/gpu/cuda_driver.py
    "ELEM_BYTES", "TOLERANCE", "cost", "key", "point", "run_points", "unique_keys", "write_points",
    # the launch argument and harness libraries
    "LOG2E", "MASK_KIND", "Params", "PARAMS_SIZE", "causal_offset", "fill_params", "DevLib", "Problem",
    # correctness
    "reference", "rel_err", "lse_err",
    # timing, ceilings, run description
    "bench", "torch_call_ms", "FLUSHES", "flush", "time_events", "copy_gbps", "gemm_tflops", "exact_f32", "env_info",
    "kv_bytes",
    "harness_parser", "save", "log",
    # PyTorch's side
    "torch_sdpa_ms", "uniform", "f64_err", "cuda_kernel_names",
]

LOG2E = 1.4426950408889634
# `mask_kind` of AttnParams (src/checked/params.rs MASK_*) per mask name; causal-br is causal with offset Sk - Sq.
MASK_KIND = {"none": 0, "causal": 1, "causal-br": 1, "bool": 2, "additive": 2}


def log(*a):
    print(*a, flush=True)


def kv_bytes(p):
    """Bytes of a point's K and V (Hkv heads, D = Dv, at its dtype's size): what a decoding call must stream,
    the figure the copy and read ceilings are compared with (`cost` adds Q and O)."""
    return 2 * p["b"] * p["hkv"] * p["sk"] * p["d"] * ELEM_BYTES[p["dtype"]]


# ---- the kernels' launch argument ---------------------------------------------------------------------------

class Params(ctypes.Structure):
    """AttnParams (src/checked/params.rs, kernels/common.cuh), field for field: 7 pointers, 4 x 3 and 1 x 4 int64
    strides, 10 ints, 2 floats, 5 ints, 1 float, 1 pointer; 264 bytes (asserted on both sides and by DevLib)."""
    _fields_ = ([(n, ctypes.c_void_p) for n in ("q", "k", "v", "o", "mask", "lse", "workspace")]
                + [(n, ctypes.c_longlong * 3) for n in ("q_stride", "k_stride", "v_stride", "o_stride")]
                + [("mask_stride", ctypes.c_longlong * 4)]
                + [(n, ctypes.c_int) for n in ("b", "hq", "hkv", "group", "sq", "sk", "d", "dv", "mask_kind",
                                               "causal_offset")]
                + [("scale", ctypes.c_float), ("scale_log2", ctypes.c_float), ("num_splits", ctypes.c_int),
                   ("extra", ctypes.c_int), ("band_lo", ctypes.c_int), ("band_hi", ctypes.c_int),
                   ("diag_offset", ctypes.c_int), ("softcap", ctypes.c_float), ("alibi", ctypes.c_void_p)])


PARAMS_SIZE = 264  # src/checked/params.rs ATTN_PARAMS_SIZE


def causal_offset(mask, sq, sk):
    """AttnParams.causal_offset: 0 top-left, Sk - Sq bottom-right (0 for the other masks)."""
    return {"causal": 0, "causal-br": sk - sq}.get(mask, 0)


def fill_params(q, k, v, o, mask="none", lse=None, add=None, workspace=None, num_splits=1, extra=0):
    """Params for logical [B, H, S, D] torch views q, k, v, o (any batch/head/seq strides, D contiguous): the
    mask by name (`add`: the additive f32 tensor of an explicit mask, broadcast dims of size 1), `lse`
    ([B, Hq, Sq] f32) and `workspace` tensors or None."""
    p = Params()
    p.q, p.k, p.v, p.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
    p.lse = lse.data_ptr() if lse is not None else None
    p.mask = add.data_ptr() if add is not None else None
    p.workspace = workspace.data_ptr() if workspace is not None else None
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o)):
        sb, sh, ss, sd = t.stride()
        assert sd == 1, f"{name}: the head dim must be contiguous"
        setattr(p, f"{name}_stride", (ctypes.c_longlong * 3)(sb, sh, ss))
    if add is not None:
        p.mask_stride = (ctypes.c_longlong * 4)(*[0 if n == 1 else s for n, s in zip(add.shape, add.stride())])
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    p.b, p.hq, p.hkv, p.sq, p.sk = B, Hq, Hkv, Sq, Sk
    p.group = Hq // Hkv
    p.d, p.dv = D, v.shape[3]
    p.mask_kind = MASK_KIND[mask]
    p.causal_offset = causal_offset(mask, Sq, Sk)
    # The key band of the mask (sdpa_core::KeyBand::clamped): causal masks bound it above; no variants here.
    p.band_lo = -Sq
    p.band_hi = p.causal_offset if mask in ("causal", "causal-br") else Sk
    p.diag_offset = p.causal_offset
    p.num_splits, p.extra = num_splits, extra
    p.scale = 1.0 / math.sqrt(D)
    p.scale_log2 = p.scale * LOG2E
    return p


class DevLib:
    """An nvcc-built harness library (dev_host.cuh's `<prefix>_params_size/count/entry/launch`): checks the
    Params layout, reads the entry table (`nfields` ints per entry) into `rows`, and launches entries on the
    current torch stream."""

    def __init__(self, path, prefix, nfields):
        self.lib = ctypes.CDLL(path)
        self.prefix = prefix
        size = getattr(self.lib, f"{prefix}_params_size")()
        assert size == ctypes.sizeof(Params) == PARAMS_SIZE, f"AttnParams layout mismatch ({size} bytes)"
        self._launch = getattr(self.lib, f"{prefix}_launch")
        self._launch.argtypes = [ctypes.c_int, ctypes.POINTER(Params), ctypes.c_void_p]
        buf = (ctypes.c_int * nfields)()
        self.rows = []
        for i in range(getattr(self.lib, f"{prefix}_count")()):
            getattr(self.lib, f"{prefix}_entry")(i, buf)
            self.rows.append(list(buf))

    def launch(self, i, params, what=None):
        """Launches entry `i` with `params` on torch's current stream; raises on a launch error."""
        import torch
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        rc = self._launch(i, ctypes.byref(params), stream)
        if rc != 0:
            raise RuntimeError(f"launch failed rc={rc} {what if what is not None else i}")


class Problem:
    """One attention call's tensors: logical [B, H, S, D] views over BHSD or BSHD storage, drawn from
    torch.randn in this order: Q, K, V, O, then an explicit mask (bool: 80 % of keys kept; additive: values in
    [-2, 2) with 10 % -inf; `mask_dims` default [B, Hq, Sq, Sk], 1 for broadcast dims) as additive f32."""

    def __init__(self, B, Hq, Hkv, Sq, Sk, D, dt, layout="bhsd", mask="none", mask_dims=None, seed=0):
        import torch
        g = torch.Generator(device="cuda").manual_seed(seed)
        tdt = getattr(torch, TORCH_DTYPE_NAMES[dt])

        def mk(H, S):
            if layout == "bhsd":
                return torch.randn(B, H, S, D, device="cuda", generator=g).to(tdt)
            return torch.randn(B, S, H, D, device="cuda", generator=g).to(tdt).transpose(1, 2)

        self.q, self.k, self.v = mk(Hq, Sq), mk(Hkv, Sk), mk(Hkv, Sk)
        self.o = mk(Hq, Sq)
        self.B, self.Hq, self.Hkv, self.Sq, self.Sk, self.D, self.dt = B, Hq, Hkv, Sq, Sk, D, dt
        self.layout, self.mask = layout, mask
        self.lse = torch.empty(B, Hq, Sq, device="cuda", dtype=torch.float32)
        self.add = None
        if mask in ("bool", "additive"):
            dims = mask_dims or (B, Hq, Sq, Sk)
            if mask == "bool":
                keep = torch.rand(dims, device="cuda", generator=g) < 0.8
                self.add = torch.where(keep, 0.0, float("-inf")).float()
            else:
                vals = torch.rand(dims, device="cuda", generator=g) * 4 - 2
                drop = torch.rand(dims, device="cuda", generator=g) < 0.1
                self.add = torch.where(drop, float("-inf"), vals).float().contiguous()

    def params(self, lse=True, workspace=None, num_splits=1, extra=0):
        return fill_params(self.q, self.k, self.v, self.o, self.mask, self.lse if lse else None, self.add,
                           workspace, num_splits, extra)

    def reference(self, b=None, heads=None, head_chunk=None):
        """float64 output and LSE, optionally of batch element b and query heads [0, heads) only."""
        bs = slice(None) if b is None else slice(b, b + 1)
        hs = slice(None) if heads is None else slice(0, heads)
        add = self.add
        if add is not None and add.shape[0] != 1:
            add = add[bs, hs]
        return reference(self.q[bs, hs], self.k[bs], self.v[bs], self.mask, add, self.Hq // self.Hkv, head_chunk)


# ---- correctness ----------------------------------------------------------------------------------------------

def reference(q, k, v, mask="none", add=None, group=None, head_chunk=None):
    """float64 output and LSE of attention over [B, H, S, D] views, K and V with Hkv heads: query head h reads
    kv head h // group (default Hq / Hkv; pass it when q holds only the first heads of a problem). `add` is
    added to the scores (broadcast dims of size 1); a row that sees no key is zeros with LSE -inf.
    `head_chunk` query heads at a time bound the memory of long sequences."""
    import torch
    G = group or q.shape[1] // k.shape[1]
    Sq, Sk = q.shape[2], k.shape[2]
    off = causal_offset(mask, Sq, Sk)
    hq = q.shape[1]
    step = head_chunk or hq
    outs, lses = [], []
    for h0 in range(0, hq, step):
        hs = slice(h0, min(hq, h0 + step))
        kv = torch.arange(hs.start, hs.stop, device=q.device) // G
        s = q[:, hs].double() @ k[:, kv].double().transpose(-1, -2) * (1.0 / math.sqrt(q.shape[3]))
        if mask in ("causal", "causal-br"):
            i = torch.arange(Sq, device=q.device)[:, None]
            j = torch.arange(Sk, device=q.device)[None, :]
            s = s.masked_fill(j > i + off, float("-inf"))
        if add is not None:
            s = s + (add if add.shape[1] == 1 else add[:, hs]).double()
        m = s.amax(-1, keepdim=True)
        m0 = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
        pm = torch.exp(s - m0)
        l = pm.sum(-1, keepdim=True)
        outs.append(torch.where(l > 0, (pm @ v[:, kv].double()) / l, torch.zeros_like(l)))
        lses.append(torch.where(l > 0, m0 + torch.log(l), torch.full_like(l, float("-inf"))).squeeze(-1))
        del s, pm
    return torch.cat(outs, 1), torch.cat(lses, 1)


def rel_err(got, want):
    """(relative L2 error over the entries where neither is NaN, number of entries NaN on one side only)."""
    import torch
    got, want = got.double(), want.double()
    nan_mismatch = int((torch.isnan(got) != torch.isnan(want)).sum())
    ok = ~torch.isnan(want) & ~torch.isnan(got)
    d = (got - want)[ok]
    return float(d.norm() / want[ok].norm().clamp_min(1e-300)), nan_mismatch


def lse_err(got, want):
    """(max abs LSE error over finite reference rows, number of non-finite reference rows not matched)."""
    import torch
    fin = torch.isfinite(want)
    bad = int(((~fin) & (got.double() != want)).sum())
    e = float((got.double() - want)[fin].abs().max()) if fin.any() else 0.0
    return e, bad


# ---- timing ------------------------------------------------------------------------------------------------------

def bench(fn, warmup=10, rep=50):
    """triton's do_bench median (ms): it writes 256 MB before each call (L2 flushed, left dirty)."""
    from triton.testing import do_bench
    return do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def torch_call_ms(fn, log_refusal=None, backends=None):
    """`bench` medians of `fn` (a call of F.scaled_dot_product_attention) under each (name, backend) of `backends`
    (an SDPBackend, or None for PyTorch's own choice; default: FLASH_ATTENTION and the default choice, which is
    cuDNN on the H100): {name: ms}, None where a backend refuses the call (a data point, passed to
    `log_refusal(name, exception)` when given)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    out = {}
    for name, be in backends or [("flash", SDPBackend.FLASH_ATTENTION), ("default", None)]:
        try:
            if be is None:
                out[name] = bench(fn)
            else:
                with sdpa_kernel([be]):
                    out[name] = bench(fn)
        except Exception as e:  # noqa: BLE001 - a backend refusing a shape is a data point
            out[name] = None
            if log_refusal:
                log_refusal(name, e)
        torch.cuda.empty_cache()
    return out


FLUSHES = ["dirty", "clean"]
_flush_bufs = {}


def flush(kind):
    """The L2 flush of the Rust backend (sdpa-cuda/src/backend.rs, L2Flush) as a callable: "dirty" writes 256 MB
    (as do_bench), "clean" reads 256 MB from a buffer nothing else touches (L2 left holding clean lines)."""
    import torch
    if not _flush_bufs:
        _flush_bufs["dirty"] = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        _flush_bufs["clean"] = torch.zeros(64 << 20, dtype=torch.float32, device="cuda")
    buf = _flush_bufs[kind]
    return (lambda: buf.zero_()) if kind == "dirty" else (lambda: buf.sum())


def time_events(fn, flush_fn, reps=100, warmup=10, queue_ahead=True):
    """Median ms of `reps` event-timed calls, each after `flush_fn` (outside the events), after `warmup` untimed
    ones (as do_bench). queue_ahead: a ~50 us spin kernel before each flush keeps the GPU's queue ahead of the
    host, so that a call whose host side takes longer than the flush is not timed with the GPU waiting for it,
    and the host synchronizes once at the end; without it, the host synchronizes after every call."""
    import torch
    for _ in range(warmup):
        flush_fn()
        fn()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in ev:
        if queue_ahead:
            torch.cuda._sleep(100_000)
        flush_fn()
        s.record()
        fn()
        e.record()
        if not queue_ahead:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in ev)


def torch_sdpa_ms(shapes, backends, also=None):
    """do_bench medians (ms) of PyTorch's SDPA on each shape `key` (bench/gpu/cuda_driver.py: b, hq, hkv, sq, sk, d,
    dtype, mask, dv) under each (name, backend) of `backends` (an SDPBackend, or None for PyTorch's own choice):
    {shape: {name: ms or None}}, None where the backend refuses the call or runs out of memory. Inputs are
    torch.randn in [B, H, S, D], seeded 0; "causal" is PyTorch's is_causal (top-left); GQA through enable_gqa.
    `also(shape, fn)`, when given, returns more entries for the shape's dict from the same call `fn` (on the
    same inputs, e.g. the kernels it launches)."""
    import torch
    import torch.nn.functional as F
    dt = {"bf16": torch.bfloat16, "f16": torch.float16}
    out = {}
    for shape in shapes:
        b, hq, hkv, sq, sk, d, dname, mask, dv = shape
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, hq, sq, d, device="cuda", generator=g, dtype=dt[dname])
        k = torch.randn(b, hkv, sk, d, device="cuda", generator=g, dtype=dt[dname])
        v = torch.randn(b, hkv, sk, dv, device="cuda", generator=g, dtype=dt[dname])
        causal = mask == "causal"

        def fn():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv)
        ms = torch_call_ms(fn, lambda name, e: log("torch", name, shape, "failed:", repr(e)[:100]), backends)
        if also:
            ms.update(also(shape, fn))
        out[shape] = ms
        del q, k, v
        torch.cuda.empty_cache()
    return out


def copy_gbps(timer=bench, nbytes=2**30):
    """Device-to-device copy of `nbytes` (bytes read + written per second, GB/s), timed by `timer(fn)`."""
    import torch
    x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    gbps = 2 * x.numel() / timer(lambda: y.copy_(x)) / 1e6
    del x, y
    torch.cuda.empty_cache()
    return gbps


def gemm_tflops(dtype, timer=bench, n=8192):
    """An n^3 GEMM through cuBLAS (torch) in `dtype`, TFLOP/s; f32 follows torch's allow_tf32 setting."""
    import torch
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    tf = 2 * n ** 3 / timer(lambda: a @ b) / 1e9
    del a, b
    torch.cuda.empty_cache()
    return tf


def exact_f32():
    """PyTorch's f32 matmuls and SDPA without TF32 (issue 4's exact-f32 comparison)."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def env_info(date=True):
    """torch, CUDA, device name, SM count, argv (and the UTC date) of this run."""
    import torch
    p = torch.cuda.get_device_properties(0)
    env = dict(torch=torch.__version__, cuda=torch.version.cuda, name=p.name, sms=p.multi_processor_count,
               argv=sys.argv)
    if date:
        env["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return env


def harness_parser():
    """The arguments every nvcc-harness driver takes: --lib, --check, --bench, --out ($OUT by default)."""
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="the harness library built by nvcc")
    ap.add_argument("--check", action="store_true", help="check every entry against the float64 reference")
    ap.add_argument("--bench", action="store_true", help="time the entries against PyTorch, same run")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    return ap


def save(res, out, name):
    """Writes `res` as JSON to out/name (values JSON lacks as strings)."""
    import json
    with open(os.path.join(out, name), "w") as f:
        json.dump(res, f, indent=1, default=str)


# ---- PyTorch's side ------------------------------------------------------------------------------------------------

TORCH_DTYPE_NAMES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def uniform(shape, dtype="f32", generator=None):
    """Uniform in [-sqrt(3), sqrt(3)] (unit variance), as sdpa-core's HostInputs::random, cast to `dtype`."""
    import torch
    t = (torch.rand(shape, device="cuda", generator=generator) * 2 - 1) * 3 ** 0.5
    return t.to(getattr(torch, TORCH_DTYPE_NAMES[dtype]))


def f64_err(fn, q, k, v, causal):
    """Relative L2 error of `fn()`'s first batch element against PyTorch's SDPA in float64."""
    import torch.nn.functional as F
    ref = F.scaled_dot_product_attention(q[:1].double(), k[:1].double(), v[:1].double(), is_causal=causal,
                                         enable_gqa=q.shape[1] != k.shape[1])
    return ((fn()[:1].double() - ref).norm() / ref.norm()).item()


def cuda_kernel_names(fn, n=2, width=50):
    """The first `n` names (cut at `width`) of the CUDA kernels one call of `fn` launches (torch profiler)."""
    import torch
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name[:width] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})[:n]


def self_test():
    assert ctypes.sizeof(Params) == PARAMS_SIZE
    # Field order of src/checked/params.rs (and common.cuh, which the Rust test checks against it).
    names = [f[0] for f in Params._fields_]
    assert names == ["q", "k", "v", "o", "mask", "lse", "workspace", "q_stride", "k_stride", "v_stride", "o_stride",
                     "mask_stride", "b", "hq", "hkv", "group", "sq", "sk", "d", "dv", "mask_kind", "causal_offset",
                     "scale", "scale_log2", "num_splits", "extra", "band_lo", "band_hi", "diag_offset",
                     "softcap", "alibi"], names
    assert Params.b.offset == 7 * 8 + 16 * 8 and Params.scale.offset == Params.b.offset + 40
    assert causal_offset("causal-br", 3, 10) == 7 and causal_offset("causal", 3, 10) == 0
    flops, nbytes = cost(dict(b=1, hq=2, hkv=1, sq=3, sk=5, d=4, dv=2), "causal-br", "bf16")
    assert (flops, nbytes) == (288.0, 132.0)


if __name__ == "__main__":
    self_test()
    print("sdpa_dev.py self-test: ok")
