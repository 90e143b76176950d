#!/usr/bin/env python3
"""Time PyTorch's scaled_dot_product_attention on the shapes of an sdpa bench spec, and write the same
records `sdpa bench` writes, so every comparison with PyTorch is a ratio measured side by side.

Kernels (each one a record per configuration, or a "not run" entry with PyTorch's reason):
  default    PyTorch's own choice (cuDNN on the H100 with PyTorch 2.11)
  flash      SDPBackend.FLASH_ATTENTION (FlashAttention-2 on CUDA; the flash kernel over sgemm on the CPU)
  efficient  SDPBackend.EFFICIENT_ATTENTION (CUTLASS memory-efficient kernel; CUDA only)
  cudnn      SDPBackend.CUDNN_ATTENTION (PyTorch >= 2.4, CUDA only)
  math       SDPBackend.MATH (PyTorch's own unfused composite)
  unfused    the eager-model pattern written out: Q.K^T * scale (+ mask), softmax in f32, cast, P.V
  flex       FlexAttention compiled (torch.compile(flex_attention)), CUDA: a block mask (create_block_mask) for
             causal masks and windows, a score_mod for softcap and ALiBi

Variants (a spec's `variants` list, sdpa_core::Variants: sliding window, softcap, ALiBi; bench/sdpa_common.py
has the translation): on CUDA `flex` runs them natively and the SDPA kernels run with the equivalent explicit
mask (recorded as `default+mask`, `efficient+mask`, ...); on the CPU the SDPA kernels take the explicit mask.
A softcap has no mask form: SDPA kernels are then not run, and `unfused` is the eager Gemma-2 pattern (matmul,
tanh, mask, softmax, matmul). Variant cases run flex, default and unfused on CUDA, default and unfused on the CPU
(unless --kernels says otherwise); on CUDA the plain cases of the same sweep add flex. Each record carries the
same `variants` object as sdpa bench's, diagonal written out, so `sdpa report` pairs them.

Passes (a spec's `passes` list, sdpa_core::backward::Pass; --passes overrides it): `fwd` times the forward (the
default), `bwd` the backward alone (the forward runs once outside the timing; each timed call is
torch.autograd.grad(out, (q, k, v), dO, retain_graph=True)), `fwd+bwd` both in each timed call. Backward cases run
flash, cudnn and efficient on CUDA, flash and math on the CPU (unless --kernels says otherwise); their records carry
`pass`, FLOPs 2·B·Hq·pairs·(3D + 2Dv) (plus the forward's for fwd+bwd), the dQ/dK/dV errors against a float64
recomputation (`grad_check`; `check` is the worst of the three), and the first call's peak memory (`peak_mem_bytes`:
CUDA allocator statistics, or the CPU process's resident-set rise).

Usage:
  python3 bench/pytorch_sdpa.py --spec bench/presets/fa2bench.json --device cuda --out torch.json
  python3 bench/pytorch_sdpa.py --spec bench/presets/backward.json --device cuda --passes bwd --kernels flash,cudnn
  python3 bench/pytorch_sdpa.py --spec spec.json --device cpu --threads 2 --kernels flash,math,unfused
  python3 bench/pytorch_sdpa.py --self-test     # cost model and spec parsing, no torch needed

Timing: warm-up calls, then up to --reps calls within --max-time seconds per configuration; CUDA events
around each call on the GPU, the host clock on the CPU; the median, min and max are recorded. Every
configuration is checked against a float64 recomputation of sampled query rows (the same row sampling and
per-dtype tolerances as sdpa-core's check). TFLOP/s and GB/s follow sdpa-core's cost model (causal masks
count only unmasked pairs); `sdpa bench` recomputes them with the Rust model when it merges these records.
"""

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

# The cost model, tolerances and CPU model, shared with bench/cpu and sdpa-cuda/dev (this file's folder is on
# sys.path when it runs as a script).
from sdpa_common import BWD_TOLERANCE, ELEM_BYTES, PASSES, TOLERANCE, cost, cpu_model, pairs_per_head
from sdpa_common import alibi_slopes, band, diag_offset, normalize_variants, variant_label
from sdpa_common import self_test as cost_self_test

FORMAT = "sdpa-bench-v1"
KERNELS = ["default", "flash", "efficient", "cudnn", "math", "unfused", "flex"]
# The kernels each device runs when --kernels does not say: plain cases, then cases with variants.
PLAIN_KERNELS = {"cuda": ["default", "flash", "efficient", "cudnn", "math", "unfused"],
                 "cpu": ["default", "flash", "math", "unfused"]}
VARIANT_KERNELS = {"cuda": ["flex", "default", "unfused"], "cpu": ["default", "unfused"]}
SDPA_KERNELS = ("default", "flash", "efficient", "cudnn", "math")
DTYPE_ALIASES = {"f32": "f32", "fp32": "f32", "float32": "f32", "f16": "f16", "fp16": "f16", "float16": "f16",
                 "half": "f16", "bf16": "bf16", "bfloat16": "bf16"}
MASK_ALIASES = {"none": "none", "causal": "causal", "causal-tl": "causal", "causal_top_left": "causal",
                "causal-br": "causal-br", "causal_bottom_right": "causal-br", "bool": "bool", "boolean": "bool",
                "additive": "additive"}


# ---------------------------------------------------------------------------------------------------------
# Row sampling (mirrors sdpa_core::check and `sdpa bench`); the cost model is sdpa_common.cost

def check_rows(shape):
    """None (all rows) while the reference work stays under 2e8 multiply-adds, else a spread sample size."""
    per_row = shape["sk"] * (shape["d"] + shape["dv"])
    rows = shape["b"] * shape["hq"] * shape["sq"]
    if rows * per_row <= 2e8:
        return None
    return max(64, min(4096, int(2e8 / per_row)))


def sampled_rows(total, n):
    """`n` row indices spread evenly over `total`, first and last included (sdpa_core::check_output)."""
    if n is None or n >= total:
        return list(range(total))
    n = max(1, n)
    return [k * (total - 1) // max(n - 1, 1) for k in range(n)]


# ---------------------------------------------------------------------------------------------------------
# Spec files (sdpa_core::record::BenchSpec, an array of them, or the analyzer's replay specs)

def normalize_spec(obj, out):
    if isinstance(obj, list):
        for item in obj:
            normalize_spec(item, out)
        return
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object or array")
    if isinstance(obj.get("findings"), list):
        for f in obj["findings"]:
            if isinstance(f, dict) and f.get("replay"):
                normalize_spec(f["replay"], out)
        return
    if "spec" in obj:
        normalize_spec(obj["spec"], out)
        return
    spec = dict(obj)
    spec["_given"] = set(obj) | {many for one, many in [("layout", "layouts")] if one in obj}
    for one, many in [("dtype", "dtypes"), ("mask", "masks"), ("layout", "layouts"), ("variant", "variants"),
                      ("pass", "passes")]:
        if one in spec:
            v = spec.pop(one)
            spec[many] = v if isinstance(v, list) else [v]
    shapes = []
    for s in spec.get("shapes", []):
        missing = [k for k in ("b", "hq", "hkv", "sq", "sk", "d", "dv") if k not in s]
        if missing:
            raise ValueError(f"shape {s} lacks {', '.join(missing)}")
        shapes.append({k: int(s[k]) for k in ("b", "hq", "hkv", "sq", "sk", "d", "dv")})
    spec["shapes"] = shapes
    spec["dtypes"] = [DTYPE_ALIASES[d.lower()] for d in spec.get("dtypes", ["f32"])]
    spec["masks"] = [MASK_ALIASES[m.lower()] for m in spec.get("masks", ["none"])]
    spec["layouts"] = [l.lower() for l in spec.get("layouts", ["bhsd"])]
    spec["passes"] = [str(x).lower() for x in spec.get("passes") or ["fwd"]]
    for x in spec["passes"]:
        if x not in PASSES:
            raise ValueError(f"unknown pass {x!r} (expected one of {', '.join(PASSES)})")
    v = spec.get("variants")
    spec["variants"] = [v] if isinstance(v, dict) else list(v or [{}])  # one object or a list, as BenchSpec reads
    for l in spec["layouts"]:
        if l not in ("bhsd", "bshd"):
            raise ValueError(f"unknown layout {l}")
    batches = spec.get("batches") or []
    batches = [batches] if isinstance(batches, dict) else list(batches)
    # (shape, ragged) per shape and batch: a ragged batch resolves the shape's bounds (0 = the longest given).
    spec["batched_shapes"] = []
    for s in shapes:
        for req in batches or [None]:
            shape, ragged = resolve_batch(req, s) if req else (s, None)
            if min(shape.values()) <= 0 or shape["hq"] % shape["hkv"] != 0:
                raise ValueError(f"invalid shape {shape} (sizes must be positive and Hq a multiple of Hkv)")
            spec["batched_shapes"].append((shape, ragged))
    out.append(spec)


def resolve_batch(req, shape):
    """sdpa_core::RaggedRequest::resolve: per-sequence lengths (absent: the shape's Sq/Sk for every sequence)
    and a page size, against a shape whose B is the number of sequences and whose Sq/Sk bound the lengths (0:
    the longest given). Returns the shape with its bounds and the record's `ragged` object (sdpa_core::Ragged:
    the pages as many as the sequences use, the block table as wide as the longest needs)."""
    unknown = set(req) - {"seqlens_q", "seqlens_k", "page_size"}
    if unknown:
        raise ValueError(f"batch: unknown key(s) {', '.join(sorted(unknown))}")
    b = shape["b"]

    def lengths(key, fallback):
        v = req.get(key)
        if v is None:
            if fallback == 0:
                raise ValueError(f"batch without {key}: every sequence takes the shape's length, which is 0 there")
            return [fallback] * b
        if len(v) != b or any(int(x) != x or x < 0 for x in v):
            raise ValueError(f"{key} {v} must hold {b} non-negative whole lengths (one per sequence)")
        return [int(x) for x in v]
    sq, sk = lengths("seqlens_q", shape["sq"]), lengths("seqlens_k", shape["sk"])
    out = dict(shape)
    out["sq"] = shape["sq"] or max(max(sq), 1)
    out["sk"] = shape["sk"] or max(max(sk), 1)
    if max(sq) > out["sq"] or max(sk) > out["sk"]:
        raise ValueError(f"a length of {sq} / {sk} is beyond the shape's bound Sq={out['sq']} Sk={out['sk']}")
    ragged = {"seqlens_q": sq, "seqlens_k": sk}
    ps = req.get("page_size")
    if ps is not None:
        if not 1 <= int(ps) <= 256:
            raise ValueError(f"page_size {ps} is outside 1..=256")
        ps = int(ps)
        pages = [-(-k // ps) for k in sk]
        ragged["pages"] = {"page_size": ps, "num_pages": max(sum(pages), 1), "max_pages": max(max(pages), 1)}
    return out, ragged


def load_cases(path, passes=None):
    """(dtype, shape, mask, layout, timing, variants, ragged, pass) per configuration, variants normalised ({}
    when plain), ragged the record's `ragged` object (None for a dense batch), pass "fwd", "bwd" or "fwd+bwd"
    (`passes`, when given, replaces every sweep's list)."""
    with open(path) as f:
        raw = json.load(f)
    specs = []
    normalize_spec(raw, specs)
    cases, seen = [], set()
    for sp in specs:
        timing = {k: sp[k] for k in ("warmup", "reps", "max_time_s") if sp.get(k) is not None}
        for dt in sp["dtypes"]:
            for s, ragged in sp["batched_shapes"]:
                for m in sp["masks"]:
                    for raw_v in sp["variants"]:
                        v = normalize_variants(raw_v, m)
                        alibi_slopes(v, s["hq"])  # the slope count against Hq, before anything runs
                        # Ragged batches default to the packed (BSHD) layout, as sdpa bench's do.
                        for l in (sp["layouts"] if "layouts" in sp["_given"] or not ragged else ["bshd"]):
                            for ps in passes or sp["passes"]:
                                key = (dt, tuple(sorted(s.items())), m, l, json.dumps(v, sort_keys=True),
                                       json.dumps(ragged, sort_keys=True), ps)
                                if key not in seen:
                                    seen.add(key)
                                    cases.append((dt, dict(s), m, l, timing, v, ragged, ps))
    return cases


def inputs_key(dtype, s, mask, layout):
    return (dtype, tuple(sorted(s.items())), mask, layout)


def case_kernels(dev_type, variants, in_variant_sweep, asked):
    """The kernels a case runs: --kernels when given, else the device's list for plain or variant cases; the
    plain cases of a variant sweep on CUDA add flex (Flex's plain causal call is the issue's reference)."""
    if asked:
        return asked
    if variants:
        return list(VARIANT_KERNELS[dev_type])
    kernels = list(PLAIN_KERNELS[dev_type])
    if dev_type == "cuda" and in_variant_sweep:
        kernels.append("flex")
    return kernels


def recorded_kernel(kernel, variants):
    """What the record names: SDPA kernels given a variant's mask are `<kernel>+mask`."""
    return f"{kernel}+mask" if variants and kernel in SDPA_KERNELS else kernel


# ---------------------------------------------------------------------------------------------------------
# Machine description

def machine():
    host = platform.node()
    s = f"{cpu_model()} ({os.cpu_count() or 1} threads)"
    return s + (f", host {host}" if host else "")


def git_commit():
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True, text=True)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except OSError:
        return None


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------------------------------------
# Running PyTorch

def torch_dtype(torch, name):
    return {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[name]


def make_inputs(torch, dev, dtype, s, mask, layout, seed, grad=False):
    """Q, K, V as [B, H, S, D] views (BSHD storage transposed when layout is bshd), and the mask. With `grad`,
    Q, K and V require gradients (the views of BSHD storage then are what autograd differentiates against)."""
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    dt = torch_dtype(torch, dtype)

    def tensor(h, n, d):
        if layout == "bshd":
            t = torch.rand((s["b"], n, h, d), generator=gen, device=dev, dtype=torch.float32) * 2 - 1
            return t.to(dt).requires_grad_(grad).transpose(1, 2)
        t = torch.rand((s["b"], h, n, d), generator=gen, device=dev, dtype=torch.float32) * 2 - 1
        return t.to(dt).requires_grad_(grad)

    q = tensor(s["hq"], s["sq"], s["d"])
    k = tensor(s["hkv"], s["sk"], s["d"])
    v = tensor(s["hkv"], s["sk"], s["dv"])
    explicit = None
    full = (s["b"], s["hq"], s["sq"], s["sk"])
    if mask == "bool":
        explicit = torch.rand(full, generator=gen, device=dev) < 0.8
    elif mask == "additive":
        r = torch.rand(full, generator=gen, device=dev)
        explicit = torch.where(r < 0.1, torch.full_like(r, float("-inf")), r * 4 - 2).to(dt)
    return q, k, v, explicit


def backend_context(torch, kernel):
    """A context manager restricting SDPA to one backend, or None when this PyTorch lacks it."""
    import contextlib
    if kernel in ("default", "unfused", "flex"):
        return contextlib.nullcontext()
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return None
    name = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
            "math": "MATH"}[kernel]
    if not hasattr(SDPBackend, name):
        return None
    return sdpa_kernel(getattr(SDPBackend, name))


def variant_mask(torch, q, s, mask, variants, explicit):
    """The explicit mask equivalent to the case's mask and variants, for SDPA and the eager pattern: boolean
    (keys kept) when there is no bias, else additive in Q's dtype ([1, Hq, Sq, Sk] with ALiBi: -slope·distance,
    -inf outside the band). None when nothing masks."""
    dev = q.device
    sq, sk = s["sq"], s["sk"]
    lo, hi = band(mask, variants, sq, sk)
    keep = None
    if lo is not None or hi is not None:
        i = torch.arange(sq, device=dev).view(-1, 1)
        j = torch.arange(sk, device=dev).view(1, -1)
        keep = torch.ones((sq, sk), dtype=torch.bool, device=dev)
        if lo is not None:
            keep &= j >= i + lo
        if hi is not None:
            keep &= j <= i + hi
    if mask == "bool":
        keep = explicit if keep is None else keep & explicit
    slopes = alibi_slopes(variants, s["hq"])
    additive = explicit if mask == "additive" else None
    if slopes is None and additive is None:
        return keep
    # Additive: built per head in f32 and stored in Q's dtype (an f32 [Hq, Sq, Sk] copy would not fit at 32k).
    per_batch = additive is not None or (keep is not None and keep.dim() == 4)
    out = torch.empty((s["b"] if per_batch else 1, s["hq"], sq, sk), dtype=q.dtype, device=dev)
    dist = None
    if slopes is not None:
        i = torch.arange(sq, device=dev, dtype=torch.float32).view(-1, 1)
        j = torch.arange(sk, device=dev, dtype=torch.float32).view(1, -1)
        dist = (j - (i + diag_offset(variants.get("diagonal"), sq, sk))).abs()
    for h in range(s["hq"]):
        for b in range(out.shape[0]):
            x = torch.zeros((sq, sk), dtype=torch.float32, device=dev) if dist is None else dist * -slopes[h]
            if additive is not None:
                x = x + additive[b, h].float()
            if keep is not None:
                kh = keep if keep.dim() == 2 else keep[b, h]
                x = x.masked_fill(~kh, float("-inf"))
            out[b, h] = x.to(q.dtype)
    return out


_FLEX = {}


def compiled_flex(torch):
    """flex_attention compiled once per process."""
    from torch.nn.attention.flex_attention import flex_attention
    if "flex" not in _FLEX:
        # Every case brings its own block mask and score_mod, so dynamo recompiles per case; past its default
        # limit (8) it would fall back to eager flex and time that instead. Static shapes: one kernel per case.
        cfg = torch._dynamo.config
        for name, want in (("recompile_limit", 256), ("cache_size_limit", 256), ("accumulated_recompile_limit", 4096)):
            if hasattr(cfg, name):
                setattr(cfg, name, max(getattr(cfg, name), want))
        _FLEX["flex"] = torch.compile(flex_attention, dynamic=False)
    return _FLEX["flex"]


def flex_call(torch, q, k, v, s, mask, variants, scale):
    """FlexAttention compiled: a block mask for the causal mask and the window, a score_mod for softcap and
    ALiBi (both built here, outside the timed call)."""
    if q.device.type != "cuda":
        raise NotImplementedError("flex runs on CUDA here (the CPU compares with SDPA given the equivalent mask)")
    if mask in ("bool", "additive"):
        raise NotImplementedError("flex: a random explicit mask has no block-sparse form")
    from torch.nn.attention.flex_attention import create_block_mask
    flex = compiled_flex(torch)
    sq, sk = s["sq"], s["sk"]
    lo, hi = band(mask, variants, sq, sk)
    block_mask = None
    if lo is not None or hi is not None:
        def mask_mod(b, h, qi, kj):
            if lo is None:
                return kj <= qi + hi
            if hi is None:
                return kj >= qi + lo
            return (kj >= qi + lo) & (kj <= qi + hi)
        block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=sq, KV_LEN=sk, device=q.device)
    cap = variants.get("softcap")
    slopes = alibi_slopes(variants, s["hq"])
    slopes_t = None if slopes is None else torch.tensor(slopes, dtype=torch.float32, device=q.device)
    off = diag_offset(variants.get("diagonal"), sq, sk)

    def variant_scores(score, b, h, qi, kj):
        if cap is not None:
            score = cap * torch.tanh(score / cap)
        if slopes_t is not None:
            score = score - slopes_t[h] * (kj - (qi + off)).abs()
        return score
    score_mod = variant_scores if cap is not None or slopes_t is not None else None
    gqa = s["hq"] != s["hkv"]

    def run():
        return flex(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa)
    return run


def build_call(torch, kernel, q, k, v, s, mask, explicit, variants=None):
    """A zero-argument function running one forward call."""
    F = torch.nn.functional
    group = s["hq"] // s["hkv"]
    scale = 1.0 / math.sqrt(s["d"])
    variants = variants or {}
    if kernel == "flex":
        return flex_call(torch, q, k, v, s, mask, variants, scale)
    if kernel == "unfused" and variants:
        kk = k.repeat_interleave(group, dim=1) if group > 1 else k
        vv = v.repeat_interleave(group, dim=1) if group > 1 else v
        bias = variant_mask(torch, q, s, mask, variants, explicit)
        if bias is not None and bias.dtype == torch.bool:
            bias = torch.zeros(bias.shape, device=q.device, dtype=q.dtype).masked_fill(~bias, float("-inf"))
        cap = variants.get("softcap")

        def run_eager():
            # Gemma 2's eager attention: scale, cap (tanh) in the working dtype, bias/mask, softmax in f32.
            scores = torch.matmul(q, kk.transpose(-2, -1)) * scale
            if cap is not None:
                scores = torch.tanh(scores / cap) * cap
            if bias is not None:
                scores = scores + bias
            p = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            return torch.matmul(p, vv)
        return run_eager
    if kernel == "unfused":
        kk = k.repeat_interleave(group, dim=1) if group > 1 else k
        vv = v.repeat_interleave(group, dim=1) if group > 1 else v
        bias = None
        if mask in ("causal", "causal-br"):
            i = torch.arange(s["sq"], device=q.device).view(-1, 1)
            j = torch.arange(s["sk"], device=q.device).view(1, -1)
            off = 0 if mask == "causal" else s["sk"] - s["sq"]
            bias = torch.zeros((s["sq"], s["sk"]), device=q.device, dtype=q.dtype)
            bias = bias.masked_fill(j > i + off, float("-inf"))
        elif mask == "bool":
            bias = torch.zeros(explicit.shape, device=q.device, dtype=q.dtype).masked_fill(~explicit, float("-inf"))
        elif mask == "additive":
            bias = explicit

        def run():
            scores = torch.matmul(q, kk.transpose(-2, -1)) * scale
            if bias is not None:
                scores = scores + bias
            p = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            return torch.matmul(p, vv)
        return run

    kwargs = {"scale": scale}
    attn_mask = None
    if variants:
        # The variants as an explicit mask (a window's band, ALiBi's bias); a softcap has no mask form.
        if variants.get("softcap") is not None:
            raise NotImplementedError("a softcap has no mask form in SDPA (see the unfused record: eager matmul, "
                                      "tanh, mask, softmax, matmul)")
        attn_mask = variant_mask(torch, q, s, mask, variants, explicit)
    elif mask == "causal":
        kwargs["is_causal"] = True
    elif mask == "causal-br":
        from torch.nn.attention.bias import causal_lower_right
        attn_mask = causal_lower_right(s["sq"], s["sk"])
    elif mask in ("bool", "additive"):
        attn_mask = explicit
    qq, kk, vv = q, k, v
    if group > 1:
        # enable_gqa (PyTorch >= 2.5) reads K/V by index; older versions need the copies eager code makes.
        major_minor = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
        if major_minor >= (2, 5):
            kwargs["enable_gqa"] = True
        else:
            kk, vv = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

    def run():
        return F.scaled_dot_product_attention(qq, kk, vv, attn_mask=attn_mask, **kwargs)
    return run


def reference_check(torch, q, k, v, out, s, mask, explicit, dtype, variants=None):
    """Compares sampled output rows with a float64 recomputation; sdpa-core's CheckReport fields."""
    group = s["hq"] // s["hkv"]
    scale = 1.0 / math.sqrt(s["d"])
    rows = sampled_rows(s["b"] * s["hq"] * s["sq"], check_rows(s))
    variants = variants or {}
    lo, hi = band(mask, variants, s["sq"], s["sk"])
    slopes = alibi_slopes(variants, s["hq"])
    by_head = {}
    for r in rows:
        i, bh = r % s["sq"], r // s["sq"]
        by_head.setdefault((bh // s["hq"], bh % s["hq"]), []).append(i)
    diff2 = ref2 = 0.0
    max_abs = 0.0
    nan_mismatch = 0
    for (b, h), idx in by_head.items():
        ii = torch.tensor(idx, device=q.device)
        qd = q[b, h].index_select(0, ii).double().cpu()
        kd = k[b, h // group].double().cpu()
        vd = v[b, h // group].double().cpu()
        sc = qd @ kd.T * scale
        ic = torch.tensor(idx).view(-1, 1)
        j = torch.arange(s["sk"]).view(1, -1)
        # sdpa-core's score: softcap, then ALiBi from the diagonal, then the band (causal mask and window).
        if variants.get("softcap") is not None:
            cap = variants["softcap"]
            sc = cap * torch.tanh(sc / cap)
        if slopes is not None:
            sc = sc - slopes[h] * (j - (ic + diag_offset(variants.get("diagonal"), s["sq"], s["sk"]))).abs().double()
        if lo is not None:
            sc = sc.masked_fill(j < ic + lo, float("-inf"))
        if hi is not None:
            sc = sc.masked_fill(j > ic + hi, float("-inf"))
        if mask == "bool":
            sc = sc.masked_fill(~explicit[b, h].index_select(0, ii).cpu(), float("-inf"))
        elif mask == "additive":
            sc = sc + explicit[b, h].index_select(0, ii).double().cpu()
        m = sc.max(dim=-1, keepdim=True).values
        dead = torch.isinf(m) & (m < 0)
        p = torch.exp(sc - torch.where(dead, torch.zeros_like(m), m))
        l = p.sum(dim=-1, keepdim=True)
        # A row with every key masked is zeros (sdpa's convention, DESIGN.md).
        ref = torch.where(dead, torch.zeros_like(l), (p @ vd) / torch.where(dead, torch.ones_like(l), l))
        got = out[b, h].index_select(0, ii).double().cpu()
        got_nan, ref_nan = torch.isnan(got), torch.isnan(ref)
        nan_mismatch += int((got_nan != ref_nan).sum())
        ok = ~(got_nan | ref_nan)
        d = (got - ref)[ok]
        diff2 += float((d * d).sum())
        ref2 += float((ref[ok] * ref[ok]).sum())
        if d.numel():
            max_abs = max(max_abs, float(d.abs().max()))
    rel = math.sqrt(diff2 / ref2) if ref2 > 0 else math.sqrt(diff2)
    tol = TOLERANCE[dtype]
    return {"max_abs_err": max_abs, "rel_err": rel, "tolerance": tol, "nan_mismatches": nan_mismatch,
            "lse_max_abs_err": None, "rows_checked": len(rows), "pass": rel <= tol and nan_mismatch == 0}


# ---------------------------------------------------------------------------------------------------------
# The backward (issue 24). A case's pass (sdpa_core::backward::Pass):
#   fwd      the forward alone (everything above)
#   bwd      the backward alone: the forward runs once outside the timing, and each timed call is
#            torch.autograd.grad(out, (q, k, v), dO, retain_graph=True): PyTorch's backward kernels and autograd's
#            dispatch of them, nothing else (FlashAttention's benchmark_backward times it the same way)
#   fwd+bwd  a forward and its backward in each timed call (a training step's attention)
# Autograd runs the backward of the kernel the forward chose, so sdpa_kernel(FLASH_ATTENTION) around the forward
# picks flash's backward, CUDNN_ATTENTION cuDNN's, and on the CPU FLASH_ATTENTION the fused CPU kernel's. dO is
# seeded uniform(-1, 1) in O's layout. The timed call keeps the graph (retain_graph) in both passes: the eager
# pattern's GQA copy of K/V is made once, outside the call, and its node must survive every repetition.

BWD_KERNELS = {"cuda": ["flash", "cudnn", "efficient"], "cpu": ["flash", "math"]}


def pass_kernels(dev_type, pass_, variants, in_variant_sweep, asked):
    """The kernels a case runs: the forward's lists (case_kernels) for the forward, for --kernels and for cases
    with variants (flex and the eager pattern differentiate them); otherwise the backward's own list."""
    if pass_ == "fwd" or asked or variants:
        return case_kernels(dev_type, variants, in_variant_sweep, asked)
    return list(BWD_KERNELS[dev_type])


def grad_call(torch, fn, inputs, pass_, seed):
    """(timed, grads, dO): the zero-argument function a backward pass times, the gradients (dQ, dK, dV) of its
    first call, and the upstream gradient."""
    out = fn()
    gen = torch.Generator(device=out.device)
    gen.manual_seed(seed + 1)
    d_o = torch.empty_like(out).uniform_(-1.0, 1.0, generator=gen)
    if pass_ == "bwd":
        def timed():
            return torch.autograd.grad(out, inputs, d_o, retain_graph=True)
    else:
        del out

        def timed():
            return torch.autograd.grad(fn(), inputs, d_o, retain_graph=True)
    return timed, timed(), d_o


def grad_check(torch, q, k, v, explicit, grads, d_o, s, mask, dtype, variants):
    """dQ, dK, dV against a float64 recomputation (sdpa_core::backward's math: P from the reference's own LSE,
    Delta = rowsum(dO o O), dS = P (dP - Delta), the softcap's chain rule dX = dS (1 - (s0/cap)^2), dQ = scale dX K,
    dK = scale dX^T Q, dV = P^T dO, dK/dV of a KV head summed over its query heads). Whole KV heads are checked
    (dK and dV of a key need every query row of the group), as many as fit a work budget, spread over B·Hkv.
    Returns {"dq", "dk", "dv": CheckReport fields, "pass": all three pass}."""
    dq, dk, dv = grads
    dev = q.device
    group, scale = s["hq"] // s["hkv"], 1.0 / math.sqrt(s["d"])
    sq, sk = s["sq"], s["sk"]
    work = 2.0 * group * sq * sk * (3 * s["d"] + 2 * s["dv"])
    budget = 5e11 if dev.type == "cuda" else 4e9  # float64 FLOPs: well under a second either way
    heads = sampled_rows(s["b"] * s["hkv"], max(1, min(s["b"] * s["hkv"], int(budget // work))))
    lo, hi = band(mask, variants, sq, sk)
    slopes = alibi_slopes(variants, s["hq"])
    cap = variants.get("softcap")
    off = diag_offset(variants.get("diagonal"), sq, sk)
    tally = {g: {"diff2": 0.0, "ref2": 0.0, "max_abs": 0.0, "nan": 0, "rows": 0} for g in ("dq", "dk", "dv")}

    def add(name, got, ref):
        t = tally[name]
        got = got.double()
        got_nan, ref_nan = torch.isnan(got), torch.isnan(ref)
        t["nan"] += int((got_nan != ref_nan).sum())
        ok = ~(got_nan | ref_nan)
        d = (got - ref)[ok]
        t["diff2"] += float((d * d).sum())
        t["ref2"] += float((ref[ok] * ref[ok]).sum())
        if d.numel():
            t["max_abs"] = max(t["max_abs"], float(d.abs().max()))
        t["rows"] += got.shape[0]

    block = max(1, (1 << 24) // sk)  # query rows per step: [block, Sk] float64 scores stay near 128 MB
    j = torch.arange(sk, device=dev).view(1, -1)
    with torch.no_grad():
        for idx in heads:
            b, g = divmod(idx, s["hkv"])
            kd, vd = k[b, g].double(), v[b, g].double()
            dk_ref, dv_ref = torch.zeros_like(kd), torch.zeros_like(vd)
            for h in range(g * group, (g + 1) * group):
                for r0 in range(0, sq, block):
                    r1 = min(sq, r0 + block)
                    qd, go = q[b, h, r0:r1].double(), d_o[b, h, r0:r1].double()
                    i = torch.arange(r0, r1, device=dev).view(-1, 1)
                    x = qd @ kd.T * scale
                    s0 = cap * torch.tanh(x / cap) if cap is not None else x
                    sc = s0
                    if slopes is not None:
                        sc = sc - slopes[h] * (j - (i + off)).abs().double()
                    if lo is not None:
                        sc = sc.masked_fill(j < i + lo, float("-inf"))
                    if hi is not None:
                        sc = sc.masked_fill(j > i + hi, float("-inf"))
                    if mask == "bool":
                        sc = sc.masked_fill(~explicit[b, h, r0:r1], float("-inf"))
                    elif mask == "additive":
                        sc = sc + explicit[b, h, r0:r1].double()
                    m = sc.max(dim=-1, keepdim=True).values
                    dead = torch.isinf(m) & (m < 0)  # a row that sees no key: zero gradients
                    e = torch.exp(sc - torch.where(dead, torch.zeros_like(m), m))
                    p = torch.where(dead, torch.zeros_like(e), e / e.sum(dim=-1, keepdim=True))
                    delta = (go * (p @ vd)).sum(dim=-1, keepdim=True)
                    dx = p * (go @ vd.T - delta)
                    if cap is not None:
                        dx = dx * (1 - (s0 / cap) ** 2)
                    add("dq", dq[b, h, r0:r1], scale * (dx @ kd))
                    dk_ref += scale * (dx.T @ qd)
                    dv_ref += p.T @ go
            add("dk", dk[b, g], dk_ref)
            add("dv", dv[b, g], dv_ref)
    tol = BWD_TOLERANCE[dtype]
    out = {}
    for name, t in tally.items():
        rel = math.sqrt(t["diff2"] / t["ref2"]) if t["ref2"] > 0 else math.sqrt(t["diff2"])
        out[name] = {"max_abs_err": t["max_abs"], "rel_err": rel, "tolerance": tol, "nan_mismatches": t["nan"],
                     "lse_max_abs_err": None, "rows_checked": t["rows"], "pass": rel <= tol and t["nan"] == 0}
    out["pass"] = all(out[g]["pass"] for g in ("dq", "dk", "dv"))
    return out


def peak_watch(torch, dev):
    """Starts measuring the memory one call adds; returns a function giving the bytes in use rose to since, or
    None. CUDA: PyTorch's allocator statistics (max_memory_allocated over memory_allocated at the start). CPU:
    the process's resident-set high-water mark, reset through /proc/self/clear_refs (Linux), over the resident
    set at the start (as `sdpa bench` measures its host backends)."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)

        def cuda_peak():
            torch.cuda.synchronize(dev)
            return torch.cuda.max_memory_allocated(dev) - base
        return cuda_peak
    return host_peak_watch()


def host_peak_watch():
    """The CPU half of peak_watch (no torch needed)."""
    def status_kib(field):
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith(field):
                        return int(line[len(field):].split()[0])
        except (OSError, ValueError, IndexError):
            pass
        return None
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident set (Linux >= 4.0)
    except OSError:
        return lambda: None
    base = status_kib("VmRSS:")
    if base is None:
        return lambda: None

    def host_peak():
        hwm = status_kib("VmHWM:")
        return None if hwm is None else max(0, (hwm - base) * 1024)
    return host_peak


def worst_gradient(report):
    """The gradient ("dq", "dk" or "dv") furthest from passing: NaN mismatches first, then rel_err / tolerance."""
    return max(("dq", "dk", "dv"), key=lambda g: (report[g]["nan_mismatches"] > 0,
                                                 report[g]["rel_err"] / report[g]["tolerance"]))


def time_calls(torch, dev, fn, warmup, max_reps, budget):
    """Milliseconds per call: a probe sizes the repetitions to the budget (at least 3 unless one call
    alone exceeds it)."""
    cuda = dev.type == "cuda"
    # As sdpa-cuda's event timing and triton's do_bench do: zero a 256 MB buffer before each timed call, so
    # every call starts with a cold L2 and the host's Python dispatch of `fn` overlaps the memset instead of
    # showing up as idle GPU time between the events (which inflated short calls such as decoding).
    flush = torch.empty(256 << 20, dtype=torch.int8, device=dev) if cuda else None

    def one():
        if cuda:
            flush.zero_()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b)
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

    probe = one() * 1e-3
    fit = int(budget / probe) if probe > 0 else max_reps
    reps = max(1, min(max_reps, max(fit, 3 if probe <= budget else 1)))
    if probe * warmup > budget:
        warmup = min(warmup, 1)
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    return [one() for _ in range(reps)]


# SDPA_CPU_SIMD (sdpa-cpu's forced SIMD path) -> the instruction-set caps of ATen's own vector code
# (ATEN_CPU_CAPABILITY), of oneDNN (ONEDNN_MAX_CPU_ISA: its matrix products, AMX included, ignore ATen's cap)
# and of MKL (MKL_ENABLE_INSTRUCTIONS), so that PyTorch's CPU kernels run on the same instruction set when a
# path is measured on its own. All are read when torch is imported; a cap already set in the environment wins.
ISA_CAPS = {
    "amx": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX", "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
    "avx512-bf16": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",
                    "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "scalar": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
}
ISA_CAPS["avx512bf16"] = ISA_CAPS["avx512-bf16"]
ISA_CAPS["avx-512"] = ISA_CAPS["avx512"]


def run(args):
    simd = os.environ.get("SDPA_CPU_SIMD", "").strip().lower()
    if simd:
        if simd not in ISA_CAPS:
            raise SystemExit(f"pytorch_sdpa.py: SDPA_CPU_SIMD={simd} is not a path ({', '.join(sorted(ISA_CAPS))})")
        for var, cap in ISA_CAPS[simd].items():
            os.environ.setdefault(var, cap)
    import torch

    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("pytorch_sdpa.py: --device cuda but torch.cuda.is_available() is False")
    if args.threads:
        torch.set_num_threads(args.threads)
    device_name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_model()
    # efficient and cudnn exist only on CUDA; on the CPU the default lists leave them out (PLAIN_KERNELS).
    asked = [k.strip() for k in (args.kernels or "").split(",") if k.strip()]
    for k in asked:
        if k not in KERNELS and k not in ALL_RAGGED_KERNELS:
            raise SystemExit(f"pytorch_sdpa.py: unknown kernel {k} (expected {', '.join(KERNELS + ALL_RAGGED_KERNELS)})")
    cases = load_cases(args.spec, parse_passes(args.passes))
    # Plain cases whose inputs also run with variants: the plain point of a variant sweep.
    variant_inputs = {inputs_key(c[0], c[1], c[2], c[3]) for c in cases if c[5] and not c[6]}
    commit, date, mach = git_commit(), utc_now(), machine()
    if dev.type == "cpu":
        # The instruction set ATen's CPU kernels dispatched to (ATEN_CPU_CAPABILITY may have lowered it).
        cap = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: None)()
        if cap:
            mach += f", ATen CPU capability {cap}"
        if simd:
            mach += f", oneDNN max ISA {os.environ.get('ONEDNN_MAX_CPU_ISA')}"
    result = {"format": FORMAT, "command": " ".join(["python3"] + sys.argv), "machine": mach, "commit": commit,
              "date": date, "records": [], "skipped": []}
    for n, (dtype, s, mask, layout, timing, variants, ragged, pass_) in enumerate(cases):
        # Flags given on the command line beat the spec's per-sweep values, which beat the defaults.
        warmup = args.warmup if args.warmup is not None else timing.get("warmup", 3)
        reps = args.reps if args.reps is not None else timing.get("reps", 20)
        budget = args.max_time if args.max_time is not None else timing.get("max_time_s", 2.0)
        if ragged and pass_ != "fwd":
            for kern in ragged_kernels(dev.type, ragged, asked):
                result["skipped"].append(skip(kern, dtype, s, mask, layout, f"[{ragged_label(ragged)}] the backward "
                                              "of ragged batches is not timed in PyTorch here", False, variants, pass_))
            continue
        if ragged:
            meta = {"device": device_name, "commit": commit, "date": date, "machine": mach,
                    "progress": f"[{n + 1}/{len(cases)}]"}
            run_ragged_case(torch, dev, args, (dtype, s, mask, layout, variants, ragged), (warmup, reps, budget),
                            asked, meta, result)
            continue
        vlabel = variant_label(variants)
        label = (f"{dtype} {mask}{f' [{vlabel}]' if vlabel else ''} {layout} B={s['b']} Hq={s['hq']} Hkv={s['hkv']} "
                 f"Sq={s['sq']} Sk={s['sk']} D={s['d']}{'' if pass_ == 'fwd' else ' ' + pass_}")
        kernels = pass_kernels(dev.type, pass_, variants, inputs_key(dtype, s, mask, layout) in variant_inputs, asked)
        try:
            q, k, v, explicit = make_inputs(torch, dev, dtype, s, mask, layout, args.seed, grad=pass_ != "fwd")
        except RuntimeError as e:  # out of memory, typically
            for kern in kernels:
                result["skipped"].append(skip(recorded_kernel(kern, variants), dtype, s, mask, layout,
                                              f"inputs: {first_line(e)}", True, variants, pass_))
            continue
        for kern in kernels:
            name = recorded_kernel(kern, variants)
            ctx = backend_context(torch, kern)
            if ctx is None:
                result["skipped"].append(skip(name, dtype, s, mask, layout,
                                              f"this PyTorch ({torch.__version__}) has no {kern} backend", False,
                                              variants, pass_))
                continue
            try:
                with ctx:
                    fn = build_call(torch, kern, q, k, v, s, mask, explicit, variants)
                    grad_report = peak = None
                    if pass_ == "fwd":
                        out = fn()
                        if dev.type == "cuda":
                            torch.cuda.synchronize()
                        check = None if args.no_check else reference_check(torch, q, k, v, out, s, mask, explicit,
                                                                           dtype, variants)
                        del out
                        timed = fn
                    else:
                        # The first call's peak: the forward, what autograd keeps for the backward, the backward.
                        watch = peak_watch(torch, dev)
                        timed, grads, d_o = grad_call(torch, fn, (q, k, v), pass_, args.seed)
                        peak = watch()
                        if not args.no_check:
                            grad_report = grad_check(torch, q, k, v, explicit, grads, d_o, s, mask, dtype, variants)
                        check = grad_report[worst_gradient(grad_report)] if grad_report else None
                        del grads, d_o
                    times = time_calls(torch, dev, timed, warmup, reps, budget)
                    del fn, timed  # an explicit mask can take gigabytes; a kept graph, its saved tensors
            except (RuntimeError, NotImplementedError, ValueError, ImportError) as e:
                # "No available kernel", out of memory and friends: this kernel cannot run this case here.
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
                result["skipped"].append(skip(name, dtype, s, mask, layout, first_line(e), False, variants, pass_))
                print(f"[{n + 1}/{len(cases)}] pytorch {name} {label}: not run: {first_line(e)}", file=sys.stderr)
                continue
            times.sort()
            med = statistics.median(times)
            flops, nbytes = cost(s, mask, dtype, variants, pass_)
            rec = {"backend": "pytorch", "kernel": name, "pass": pass_, "device": device_name, "dtype": dtype,
                   "shape": s, "mask": mask, "layout": layout, "f32_math": "exact" if dtype == "f32" else None,
                   "threads": torch.get_num_threads() if dev.type == "cpu" else None,
                   "time_ms": {"median": med, "min": times[0], "max": times[-1], "reps": len(times)},
                   "tflops": flops / (med * 1e-3) / 1e12, "gbps": nbytes / (med * 1e-3) / 1e9,
                   "check": check, "peak_mem_bytes": peak, "commit": commit, "date": date, "machine": mach}
            if variants:
                rec["variants"] = variants
            if grad_report:
                rec["grad_check"] = grad_report
            result["records"].append(rec)
            status = "" if check is None else (" check pass" if check["pass"] else " check FAIL")
            if grad_report:
                status += " (rel err dQ {:.1e}, dK {:.1e}, dV {:.1e})".format(
                    *(grad_report[g]["rel_err"] for g in ("dq", "dk", "dv")))
            print(f"[{n + 1}/{len(cases)}] pytorch {name} {label}: {med:.4f} ms {rec['tflops']:.3f} TFLOP/s{status}",
                  file=sys.stderr)
        del q, k, v, explicit
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if any(c[6] and c[6].get("pages") for c in cases):
        # What paged decoding's GB/s is held against, measured in the same run (`sdpa report` reads it).
        try:
            result["ceilings"] = {"gbps": measure_bandwidth(torch, dev)}
            print(f"pytorch_sdpa.py: measured bandwidth {result['ceilings']['gbps']:.0f} GB/s on {dev}",
                  file=sys.stderr)
        except RuntimeError as e:
            print(f"pytorch_sdpa.py: bandwidth not measured: {first_line(e)}", file=sys.stderr)
    # NaN and infinities are not JSON: write them as null (readers treat a missing value as unknown).
    text = json.dumps(finite(result), indent=1, allow_nan=False)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


def finite(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [finite(v) for v in x]
    return x


def first_line(e):
    s = str(e).strip()
    return (s.splitlines() or [type(e).__name__])[0][:300]


def skip(kernel, dtype, s, mask, layout, reason, failed, variants=None, pass_="fwd"):
    # A "not run" entry has no variants field: its reason names them (as sdpa bench's do), and a backward pass.
    label = variant_label(variants)
    reason = f"[{label}] {reason}" if label else reason
    return {"backend": "pytorch", "kernel": kernel, "dtype": dtype, "shape": s, "mask": mask, "layout": layout,
            "pass": pass_, "reason": reason if pass_ == "fwd" else f"[{pass_}] {reason}", "failed": failed}


# ---------------------------------------------------------------------------------------------------------
# Ragged (varlen) batches and paged KV caches (issue 23). A case's `ragged` object is sdpa_core::Ragged:
# per-sequence lengths and, for a paged cache, the pages. PyTorch runs the batch packed ([total, H, D] tokens
# with cumulative offsets), as its varlen API takes it; every record carries the same `ragged` object as
# sdpa bench's, so `sdpa report` pairs them.
#   varlen_attn        torch.nn.attention.varlen.varlen_attn (FlashAttention's varlen kernel), when present
#   nested             nested tensors with the jagged layout through scaled_dot_product_attention
#   flex-document      FlexAttention compiled, over the packed tokens with a document mask (block mask built
#                      once, outside the timing)
#   padded+mask        every sequence padded to the longest and SDPA given the padding (and causal) mask: what
#                      a server without varlen kernels runs; its FLOP/s count only the batch's own work
# Paged caches: scaled_dot_product_attention and varlen_attn take contiguous or packed K/V, no block table;
# varlen_attn is used with one when this PyTorch's signature offers `block_table`. Otherwise:
#   flex-paged         FlexAttention over the page pool, a mask that maps each slot to its sequence and position
#   gather+<kernel>    the pages gathered into packed K/V inside the timed call, then varlen_attn (CUDA) or
#                      nested tensors / padded SDPA (CPU)

RAGGED_KERNELS = {"cuda": ["varlen_attn", "nested", "flex-document", "padded+mask"],
                  "cpu": ["nested", "padded+mask"]}
PAGED_KERNELS = {"cuda": ["varlen_attn-paged", "flex-paged", "gather+varlen_attn"],
                 "cpu": ["gather+nested", "gather+padded+mask"]}
ALL_RAGGED_KERNELS = sorted(set(sum(RAGGED_KERNELS.values(), []) + sum(PAGED_KERNELS.values(), [])))


def ragged_label(ragged):
    """`varlen 16 seqs, 65536 q / 65536 k tokens` or `paged 16, 32 seqs, 32 q tokens, 262144 cached`."""
    n, tq, tk = len(ragged["seqlens_q"]), sum(ragged["seqlens_q"]), sum(ragged["seqlens_k"])
    p = ragged.get("pages")
    if p:
        return f"paged {p['page_size']}, {n} seqs, {tq} q tokens, {tk} cached"
    return f"varlen {n} seqs, {tq} q / {tk} k tokens"


def ragged_cost(s, mask, dtype, ragged):
    """sdpa_core::AttentionCost::of_spec for a ragged batch: each sequence's own pairs; each token once."""
    sq, sk = ragged["seqlens_q"], ragged["seqlens_k"]
    pairs = sum(pairs_per_head(a, b, mask) if a and b else 0 for a, b in zip(sq, sk))
    hd = s["d"] + s["dv"]
    flops = 2.0 * s["hq"] * pairs * hd
    return flops, float((sum(sq) * s["hq"] + sum(sk) * s["hkv"]) * hd * ELEM_BYTES[dtype])


def ragged_kernels(dev_type, ragged, asked):
    """--kernels names among the ragged ones when it gives any, else the device's list."""
    table = PAGED_KERNELS if ragged.get("pages") else RAGGED_KERNELS
    mine = [k for k in asked if k in table[dev_type]]
    return mine or list(table[dev_type])


def cumulative(torch, lens, dev):
    out = [0]
    for x in lens:
        out.append(out[-1] + x)
    return torch.tensor(out, dtype=torch.int32, device=dev)


def make_ragged_inputs(torch, dev, dtype, s, ragged, seed):
    """Packed Q [total_q, Hq, D]; K/V packed [total_k, Hkv, D], or pages [num_pages, page_size, Hkv, D] with a
    block table [B, max_pages] placing every used page at a distinct pool page in seeded shuffled order (unused
    columns -1); and the packed slot of every key (for the gather and the check)."""
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    dt = torch_dtype(torch, dtype)

    def rnd(*shape):
        return (torch.rand(shape, generator=gen, device=dev, dtype=torch.float32) * 2 - 1).to(dt)
    sq, sk = ragged["seqlens_q"], ragged["seqlens_k"]
    q = rnd(sum(sq), s["hq"], s["d"])
    p = ragged.get("pages")
    if not p:
        return q, rnd(sum(sk), s["hkv"], s["d"]), rnd(sum(sk), s["hkv"], s["dv"]), None, None
    ps = p["page_size"]
    kp = rnd(p["num_pages"], ps, s["hkv"], s["d"])
    vp = rnd(p["num_pages"], ps, s["hkv"], s["dv"])
    order = torch.randperm(p["num_pages"], generator=torch.Generator().manual_seed(seed + 4))
    table = torch.full((len(sk), p["max_pages"]), -1, dtype=torch.int32)
    slots, nxt = [], 0
    for b, k in enumerate(sk):
        n = -(-k // ps)
        table[b, :n] = order[nxt:nxt + n].to(torch.int32)
        nxt += n
        j = torch.arange(k)
        slots.append(table[b, (j // ps)].long() * ps + j % ps)
    slots = torch.cat(slots).to(dev) if slots else torch.zeros(0, dtype=torch.long, device=dev)
    return q, kp, vp, table.to(dev), slots


def gather_pages(pool, slots):
    """Pages [num_pages, page_size, H, D] -> packed [total_k, H, D] keys in sequence order."""
    return pool.reshape(-1, pool.shape[2], pool.shape[3]).index_select(0, slots)


def causal_offsets(mask, sq, sk):
    """Per sequence, the diagonal's offset: key j is visible to row i iff j <= i + off (None: no causal mask)."""
    if mask == "causal":
        return [0] * len(sq)
    if mask == "causal-br":
        return [b - a for a, b in zip(sq, sk)]
    return None


def varlen_fn(torch, mask, sq, sk, d):
    """varlen_attn with the case's mask as this PyTorch spells it (is_causal, or window_size (-1, 0)); its causal
    mask is FlashAttention's bottom-right one, which is the top-left one only where Sq_b == Sk_b."""
    import inspect
    try:
        from torch.nn.attention import varlen as vl
    except ImportError:
        vl = None
    if vl is None or not hasattr(vl, "varlen_attn"):
        raise NotImplementedError(f"this PyTorch ({torch.__version__}) has no torch.nn.attention.varlen.varlen_attn")
    params = inspect.signature(vl.varlen_attn).parameters
    kw = {"scale": 1.0 / math.sqrt(d)} if "scale" in params else {}
    if mask in ("causal", "causal-br"):
        if mask == "causal" and any(a != b for a, b in zip(sq, sk)):
            raise NotImplementedError("varlen_attn's causal mask is bottom-right; the case is top-left with Sq != Sk")
        if "is_causal" in params:
            kw["is_causal"] = True
        elif "window_size" in params:
            kw["window_size"] = (-1, 0)
        else:
            raise NotImplementedError("varlen_attn takes neither is_causal nor window_size here")
    elif mask != "none":
        raise NotImplementedError(f"varlen_attn has no {mask} mask")
    return vl.varlen_attn, params, kw


def padded(torch, x, lens, maxlen):
    """Packed [total, H, D] -> [B, H, maxlen, D] zero-padded, and the (batch, position) index of every token."""
    bidx = torch.repeat_interleave(torch.arange(len(lens), device=x.device),
                                   torch.tensor(lens, device=x.device))
    starts = torch.tensor([sum(lens[:i]) for i in range(len(lens))], device=x.device, dtype=torch.long)
    pos = torch.arange(x.shape[0], device=x.device) - starts[bidx]
    out = x.new_zeros((len(lens), maxlen, x.shape[1], x.shape[2]))
    out[bidx, pos] = x
    return out.transpose(1, 2), (bidx, pos)


def build_ragged_call(torch, kernel, q, k, v, table, slots, s, mask, ragged):
    """A zero-argument function running one call and a function turning its result into packed
    [total_q, Hq, Dv] output (run outside the timing)."""
    F = torch.nn.functional
    dev = q.device
    sq, sk = ragged["seqlens_q"], ragged["seqlens_k"]
    group = s["hq"] // s["hkv"]
    scale = 1.0 / math.sqrt(s["d"])
    cu_q, cu_k = cumulative(torch, sq, dev), cumulative(torch, sk, dev)
    max_q, max_k = max(sq), max(sk)
    offs = causal_offsets(mask, sq, sk)
    if mask not in ("none", "causal", "causal-br"):
        raise NotImplementedError("explicit masks do not combine with ragged batches")
    packed_kv = (lambda: (gather_pages(k, slots), gather_pages(v, slots))) if table is not None else None
    base = kernel[len("gather+"):] if kernel.startswith("gather+") else kernel
    if table is not None and not kernel.startswith("gather+") and kernel not in ("varlen_attn-paged", "flex-paged"):
        raise NotImplementedError(f"{kernel} takes packed K/V (see the gather+ records)")
    ident = lambda o: o  # noqa: E731

    if kernel == "varlen_attn-paged":
        fn, params, kw = varlen_fn(torch, mask, sq, sk, s["d"])
        if "block_table" not in params:
            raise NotImplementedError(f"no paged SDPA in PyTorch {torch.__version__}: scaled_dot_product_attention "
                                      "and varlen_attn take contiguous or packed K/V, no block table")
        if "seqused_k" in params:
            kw["seqused_k"] = torch.tensor(sk, dtype=torch.int32, device=dev)
        return (lambda: fn(q, k, v, cu_q, cu_k, max_q, max_k, block_table=table, **kw)), ident
    if base == "varlen_attn":
        fn, _, kw = varlen_fn(torch, mask, sq, sk, s["d"])
        if packed_kv:
            return (lambda: fn(q, *packed_kv(), cu_q, cu_k, max_q, max_k, **kw)), ident
        return (lambda: fn(q, k, v, cu_q, cu_k, max_q, max_k, **kw)), ident
    if base == "nested":
        if mask == "causal-br" and any(a != b for a, b in zip(sq, sk)):
            raise NotImplementedError("nested-tensor SDPA's is_causal is top-left; the case is bottom-right, Sq != Sk")
        if 0 in sq or 0 in sk:
            raise NotImplementedError("nested tensors hold no sequence of length 0")
        nt = torch.nested.nested_tensor_from_jagged
        qn = nt(q, offsets=cu_q.long()).transpose(1, 2)
        kw = {"is_causal": offs is not None}
        if group > 1:
            kw["enable_gqa"] = True

        def jagged(kk, vv):
            return nt(kk, offsets=cu_k.long()).transpose(1, 2), nt(vv, offsets=cu_k.long()).transpose(1, 2)
        kv_nested = None if packed_kv else jagged(k, v)

        def run_nested():
            kn, vn = jagged(*packed_kv()) if packed_kv else kv_nested
            return F.scaled_dot_product_attention(qn, kn, vn, scale=scale, **kw)
        return run_nested, lambda o: o.transpose(1, 2).values()
    if base == "padded+mask":
        qp, (qb, qpos) = padded(torch, q, sq, max_q)
        i = torch.arange(max_q, device=dev).view(1, -1, 1)
        j = torch.arange(max_k, device=dev).view(1, 1, -1)
        skt = torch.tensor(sk, device=dev).view(-1, 1, 1)
        keep = j < skt
        if offs is not None:
            keep = keep & (j <= i + torch.tensor(offs, device=dev).view(-1, 1, 1))
        keep = keep.unsqueeze(1)  # [B, 1, max_q, max_k]
        kw = {"enable_gqa": True} if group > 1 else {}

        def run_padded():
            kk, vv = packed_kv() if packed_kv else (k, v)
            kp, _ = padded(torch, kk, sk, max_k)
            vp, _ = padded(torch, vv, sk, max_k)
            return F.scaled_dot_product_attention(qp, kp, vp, attn_mask=keep, scale=scale, **kw)
        return run_padded, lambda o: o.transpose(1, 2)[qb, qpos]
    if kernel in ("flex-document", "flex-paged"):
        if dev.type != "cuda":
            raise NotImplementedError("flex runs on CUDA here")
        from torch.nn.attention.flex_attention import create_block_mask
        flex = compiled_flex(torch)
        doc_q = torch.repeat_interleave(torch.arange(len(sq), device=dev), torch.tensor(sq, device=dev))
        qpos = torch.arange(sum(sq), device=dev) - cu_q.long()[doc_q]
        off_t = torch.tensor(offs or [0] * len(sq), device=dev)
        sk_t = torch.tensor(sk, device=dev)
        if kernel == "flex-document":
            doc_k = torch.repeat_interleave(torch.arange(len(sk), device=dev), sk_t)
            kpos = torch.arange(sum(sk), device=dev) - cu_k.long()[doc_k]
            kv_len, kk, vv = sum(sk), k, v
        else:
            # Each pool slot's sequence (-1: a page no sequence owns) and its position in that sequence.
            ps, npages = k.shape[1], k.shape[0]
            owner = torch.full((npages,), -1, dtype=torch.long, device=dev)
            first = torch.zeros(npages, dtype=torch.long, device=dev)
            for b, n in enumerate(sk):
                cols = table[b, :-(-n // ps)].long()
                owner[cols] = b
                first[cols] = torch.arange(cols.numel(), device=dev) * ps
            slot = torch.arange(npages * ps, device=dev)
            doc_k = owner[slot // ps]
            kpos = first[slot // ps] + slot % ps
            kpos = torch.where((doc_k >= 0) & (kpos < sk_t[doc_k.clamp(min=0)]), kpos, torch.full_like(kpos, 1 << 40))
            kv_len = npages * ps
            kk, vv = k.reshape(kv_len, k.shape[2], k.shape[3]), v.reshape(kv_len, v.shape[2], v.shape[3])
        causal = offs is not None

        def doc_mask(b, h, qi, kj):
            d = doc_q[qi]
            m = (doc_k[kj] == d) & (kpos[kj] < sk_t[d])
            return (m & (kpos[kj] <= qpos[qi] + off_t[d])) if causal else m
        block_mask = create_block_mask(doc_mask, B=None, H=None, Q_LEN=sum(sq), KV_LEN=kv_len, device=dev)
        q4 = q.transpose(0, 1).unsqueeze(0)
        k4, v4 = kk.transpose(0, 1).unsqueeze(0), vv.transpose(0, 1).unsqueeze(0)
        return (lambda: flex(q4, k4, v4, block_mask=block_mask, scale=scale, enable_gqa=group > 1)), \
            lambda o: o[0].transpose(0, 1)
    raise NotImplementedError(f"unknown ragged kernel {kernel}")


def ragged_reference_check(torch, q, k, v, out, s, mask, dtype, ragged):
    """Sampled (head, token) rows of the packed output against a float64 recomputation of their sequence, as
    sdpa_core::check_output samples a ragged batch's [Hq, total_q] rows; K/V packed (pages gathered)."""
    sq, sk = ragged["seqlens_q"], ragged["seqlens_k"]
    tq, group, scale = sum(sq), s["hq"] // s["hkv"], 1.0 / math.sqrt(s["d"])
    per_row = max(sk) * (s["d"] + s["dv"])
    n = None if tq * s["hq"] * per_row <= 2e8 else max(64, min(4096, int(2e8 / per_row)))
    rows = sampled_rows(tq * s["hq"], n)
    cq, ck = [0], [0]
    for a, b in zip(sq, sk):
        cq.append(cq[-1] + a)
        ck.append(ck[-1] + b)
    offs = causal_offsets(mask, sq, sk)
    import bisect
    diff2 = ref2 = max_abs = 0.0
    nan_mismatch = 0
    for r in rows:
        h, t = r // tq, r % tq
        b = bisect.bisect_right(cq, t) - 1
        i = t - cq[b]
        got = out[t, h].double().cpu()
        if sk[b] == 0:
            ref = torch.zeros_like(got)
        else:
            kd = k[ck[b]:ck[b + 1], h // group].double().cpu()
            vd = v[ck[b]:ck[b + 1], h // group].double().cpu()
            sc = (kd @ q[t, h].double().cpu()) * scale
            if offs is not None:
                sc = sc.masked_fill(torch.arange(sk[b]) > i + offs[b], float("-inf"))
            if torch.isinf(sc.max()):
                ref = torch.zeros_like(got)
            else:
                p = torch.exp(sc - sc.max())
                ref = (p @ vd) / p.sum()
        nan_mismatch += int(torch.isnan(got).any())
        d = torch.nan_to_num(got - ref)
        diff2 += float((d * d).sum())
        ref2 += float((ref * ref).sum())
        max_abs = max(max_abs, float(d.abs().max()) if d.numel() else 0.0)
    rel = math.sqrt(diff2 / ref2) if ref2 > 0 else math.sqrt(diff2)
    tol = TOLERANCE[dtype]
    return {"max_abs_err": max_abs, "rel_err": rel, "tolerance": tol, "nan_mismatches": nan_mismatch,
            "lse_max_abs_err": None, "rows_checked": len(rows), "pass": rel <= tol and nan_mismatch == 0}


def measure_bandwidth(torch, dev):
    """GB/s, the median of 10 calls: on CUDA a 1 GiB device-to-device copy counting bytes read and written (the
    copy ceiling of bench/results/gpu), on the CPU a 1 GiB read (a sum over f32 with the threads set)."""
    n = 1 << 30
    if dev.type == "cuda":
        x = torch.empty(n, dtype=torch.uint8, device=dev)
        y = torch.empty_like(x)
        times = time_calls(torch, dev, lambda: y.copy_(x), 3, 10, 10.0)
        return 2 * n / (statistics.median(times) * 1e-3) / 1e9
    x = torch.ones(n // 4, dtype=torch.float32)
    times = time_calls(torch, dev, lambda: x.sum(), 2, 10, 10.0)
    return n / (statistics.median(times) * 1e-3) / 1e9


def run_ragged_case(torch, dev, args, case, timing, asked, meta, result):
    """Times every ragged kernel on one ragged case; appends records and "not run" entries to `result`."""
    dtype, s, mask, layout, variants, ragged = case
    warmup, reps, budget = timing
    label = f"{dtype} {mask} {layout} Hq={s['hq']} Hkv={s['hkv']} D={s['d']} [{ragged_label(ragged)}]"

    def skipped(kernel, reason, failed):
        result["skipped"].append({"backend": "pytorch", "kernel": kernel, "dtype": dtype, "shape": s, "mask": mask,
                                  "layout": layout, "reason": f"[{ragged_label(ragged)}] {reason}",
                                  "failed": failed})
    kernels = ragged_kernels(dev.type, ragged, asked)
    if variants:
        for kern in kernels:
            skipped(kern, "window, softcap and ALiBi are not timed on ragged batches here", False)
        return
    try:
        q, k, v, table, slots = make_ragged_inputs(torch, dev, dtype, s, ragged, args.seed)
    except RuntimeError as e:
        for kern in kernels:
            skipped(kern, f"inputs: {first_line(e)}", True)
        return
    ran_paged = False
    for kern in kernels:
        try:
            fn, to_packed = build_ragged_call(torch, kern, q, k, v, table, slots, s, mask, ragged)
            out = to_packed(fn())
            if dev.type == "cuda":
                torch.cuda.synchronize()
            check = None
            if not args.no_check:
                kk, vv = (gather_pages(k, slots), gather_pages(v, slots)) if table is not None else (k, v)
                check = ragged_reference_check(torch, q, kk, vv, out, s, mask, dtype, ragged)
                del kk, vv
            del out
            times = sorted(time_calls(torch, dev, fn, warmup, reps, budget))
            del fn
        except (RuntimeError, NotImplementedError, ValueError, ImportError, TypeError, AttributeError) as e:
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            skipped(kern, first_line(e), False)
            print(f"{meta['progress']} pytorch {kern} {label}: not run: {first_line(e)}", file=sys.stderr)
            continue
        ran_paged |= kern == "varlen_attn-paged"
        med = statistics.median(times)
        flops, nbytes = ragged_cost(s, mask, dtype, ragged)
        rec = {"backend": "pytorch", "kernel": kern, "device": meta["device"], "dtype": dtype, "shape": s,
               "mask": mask, "layout": layout, "f32_math": "exact" if dtype == "f32" else None,
               "threads": torch.get_num_threads() if dev.type == "cpu" else None,
               "time_ms": {"median": med, "min": times[0], "max": times[-1], "reps": len(times)},
               "tflops": flops / (med * 1e-3) / 1e12, "gbps": nbytes / (med * 1e-3) / 1e9,
               "check": check, "peak_mem_bytes": None, "commit": meta["commit"], "date": meta["date"],
               "machine": meta["machine"], "ragged": ragged}
        result["records"].append(rec)
        status = "" if check is None else (" check pass" if check["pass"] else " check FAIL")
        print(f"{meta['progress']} pytorch {kern} {label}: {med:.4f} ms {rec['tflops']:.3f} TFLOP/s{status}",
              file=sys.stderr)
    if ragged.get("pages") and not ran_paged and not any(x["kernel"] == "sdpa" for x in result["skipped"]
                                                         if x["shape"] == s and x["dtype"] == dtype):
        skipped("sdpa", f"PyTorch {torch.__version__} has no paged SDPA: scaled_dot_product_attention (dense or "
                "nested) and varlen_attn read contiguous or packed K/V and take no block table (only the private, "
                "experimental torch.nn.attention.experimental._paged_attention maps pages for FlexAttention); the "
                "records time FlexAttention over the page pool (flex-paged) and the pages gathered into packed K/V "
                "(gather+...)", False)
    del q, k, v, table, slots
    if dev.type == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------------
# Self-test (no torch): the cost model against figures sdpa-core's tests pin, row sampling, spec parsing.

def self_test():
    cost_self_test()  # sdpa_common's hand-computed values, causal-br with Sq != Sk included
    s = {"b": 2, "hq": 16, "hkv": 16, "sq": 1024, "sk": 1024, "d": 64, "dv": 64}
    f, b = cost(s, "none", "bf16")
    assert f == 4.0 * 2 * 16 * 1024 * 1024 * 64, f
    assert b == 4.0 * 2 * 16 * 1024 * 64 * 2, b
    fc, _ = cost(s, "causal", "bf16")
    assert abs(fc / f - 0.5) < 1e-3
    assert pairs_per_head(1, 4096, "causal-br") == 4096 and pairs_per_head(1, 4096, "causal") == 1
    for sq in (1, 2, 3, 7, 64, 100):
        for sk in (1, 2, 5, 64, 77, 130):
            tl = sum(min(i + 1, sk) for i in range(sq))
            br = sum(max(0, min(sk, i + 1 + sk - sq)) for i in range(sq))
            assert pairs_per_head(sq, sk, "causal") == tl and pairs_per_head(sq, sk, "causal-br") == br
    g = {"b": 1, "hq": 32, "hkv": 8, "sq": 1, "sk": 4096, "d": 128, "dv": 128}
    assert cost(g, "none", "bf16")[1] == (32.0 * 256 + 8 * 4096 * 256) * 2
    assert sampled_rows(100, 5) == [0, 24, 49, 74, 99] and sampled_rows(10, None) == list(range(10))
    assert finite({"a": [float("nan"), 1.0], "b": float("inf")}) == {"a": [None, 1.0], "b": None}
    assert check_rows({"b": 1, "hq": 8, "hkv": 8, "sq": 256, "sk": 256, "d": 64, "dv": 64}) is None
    assert 64 <= check_rows({"b": 1, "hq": 32, "hkv": 32, "sq": 16384, "sk": 16384, "d": 128, "dv": 128}) <= 4096
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "presets")
    n = 0
    for name in sorted(os.listdir(here)):
        if name.endswith(".json"):
            n += len(load_cases(os.path.join(here, name)))
    assert n > 0
    spec = []
    normalize_spec({"command": "x", "spec": {"backends": ["cuda"], "kernels": ["fa2"], "dtype": "bf16",
                    "shapes": [{"b": 2, "hq": 16, "hkv": 8, "sq": 1024, "sk": 1024, "d": 64, "dv": 64}],
                    "mask": "causal", "layout": "bshd"}}, spec)
    assert spec[0]["dtypes"] == ["bf16"] and spec[0]["masks"] == ["causal"] and spec[0]["layouts"] == ["bshd"]
    try:
        normalize_spec({"shapes": [{"b": 1, "hq": 3, "hkv": 2, "sq": 1, "sk": 1, "d": 1, "dv": 1}]}, [])
        raise AssertionError("an invalid GQA shape was accepted")
    except ValueError:
        pass
    variants_self_test(here)
    ragged_self_test(here)
    backward_self_test(here)
    print(f"pytorch_sdpa.py self-test: ok ({n} preset cases parsed)")


def ragged_self_test(presets):
    """Ragged batches: the issue's example resolved as RaggedRequest::resolve does, the cost per sequence, the
    serving preset's cases, the kernels each runs, and refusals."""
    shape = {"b": 3, "hq": 8, "hkv": 2, "sq": 1, "sk": 0, "d": 128, "dv": 128}
    s, r = resolve_batch({"seqlens_k": [1, 4097, 333], "page_size": 16}, shape)
    assert (s["sq"], s["sk"]) == (1, 4097), s
    assert r == {"seqlens_q": [1, 1, 1], "seqlens_k": [1, 4097, 333],
                 "pages": {"page_size": 16, "num_pages": 279, "max_pages": 257}}, r
    assert ragged_label(r) == "paged 16, 3 seqs, 3 q tokens, 4431 cached"
    flops, nbytes = ragged_cost(s, "none", "bf16", r)
    assert flops == 2.0 * 8 * 4431 * 256 and nbytes == (3 * 8 + 4431 * 2) * 256 * 2.0
    # Causal pairs per sequence: 6·7/2 + 8·9/2; a sequence of length 0 does nothing.
    v = {"seqlens_q": [6, 8, 0], "seqlens_k": [6, 8, 0]}
    assert ragged_cost({"b": 3, "hq": 1, "hkv": 1, "sq": 8, "sk": 8, "d": 4, "dv": 4}, "causal", "f32", v)[0] == \
        2.0 * 57 * 8
    for bad in ({"seqlens_k": [1, 2]}, {"seqlens_k": [1, 2, 3], "page_size": 0}, {"seqlens_q": [1, 2, 3]},
                {"seqlens_k": [1, 2, 3], "pages": 4}):
        try:
            resolve_batch(bad, shape)
            raise AssertionError(f"{bad} was accepted")
        except ValueError:
            pass
    cases = load_cases(os.path.join(presets, "serving.json"))
    ragged = [c for c in cases if c[6]]
    assert all(c[3] == "bshd" for c in ragged), "ragged cases default to the packed layout"
    gpu_varlen = [c for c in ragged if c[0] == "bf16" and c[1]["b"] == 16]
    assert len(gpu_varlen) == 2 and sum(gpu_varlen[0][6]["seqlens_q"]) == 65536
    paged = [c for c in ragged if c[6].get("pages") and c[1]["b"] == 32]
    assert len(paged) == 1 and sum(paged[0][6]["seqlens_k"]) == 32 * 8192
    assert ragged_kernels("cuda", paged[0][6], []) == PAGED_KERNELS["cuda"]
    assert ragged_kernels("cpu", gpu_varlen[0][6], ["flash", "nested"]) == ["nested"]
    assert ragged_kernels("cpu", gpu_varlen[0][6], ["flash"]) == RAGGED_KERNELS["cpu"]
    assert causal_offsets("causal-br", [1, 3], [5, 2]) == [4, -1] and causal_offsets("none", [1], [1]) is None


def backward_self_test(presets):
    """The backward preset's cases and passes, the kernels each pass runs, --passes, skips and the cost."""
    cases = load_cases(os.path.join(presets, "backward.json"))
    gpu = [c for c in cases if c[0] == "bf16"]
    cpu = [c for c in cases if c[1]["b"] == 1 and c[1]["hq"] in (8, 16) and c[1]["sq"] <= 4096 and c[0] == "f32"]
    assert len(gpu) == 12 * 2 * 2 + 4 * 2 * 2, len(gpu)  # the GPU grid and the CPU grid's bf16 half
    assert len(cpu) == 4 * 2 * 2 and {c[7] for c in cases} == {"bwd", "fwd+bwd"}
    fa2bench = load_cases(os.path.join(presets, "fa2bench.json"))
    assert {c[7] for c in fa2bench} == {"fwd"}, "a spec without passes times the forward"
    only = load_cases(os.path.join(presets, "backward.json"), ["bwd"])
    assert len(only) == len(cases) // 2 and all(c[7] == "bwd" for c in only)
    assert parse_passes("fwd, fwd+bwd") == ["fwd", "fwd+bwd"] and parse_passes(None) is None
    try:
        parse_passes("backward")
        raise AssertionError("an unknown pass was accepted")
    except ValueError:
        pass
    assert pass_kernels("cuda", "bwd", {}, False, []) == ["flash", "cudnn", "efficient"]
    assert pass_kernels("cpu", "fwd+bwd", {}, False, []) == ["flash", "math"]
    assert pass_kernels("cuda", "fwd", {}, False, []) == PLAIN_KERNELS["cuda"]
    assert pass_kernels("cpu", "bwd", {}, False, ["unfused"]) == ["unfused"]
    assert pass_kernels("cuda", "bwd", {"softcap": 30.0}, True, []) == VARIANT_KERNELS["cuda"]
    sk = skip("flash", "bf16", gpu[0][1], "none", "bhsd", "no kernel", False, {}, "bwd")
    assert sk["reason"] == "[bwd] no kernel" and sk["pass"] == "bwd"
    s = gpu[0][1]
    assert cost(s, "none", "bf16", None, "fwd+bwd")[0] == 3.5 * cost(s, "none", "bf16")[0]
    watch = host_peak_watch()
    block = b"\x01" * (64 << 20)  # touched, so resident
    peak = watch()
    assert peak is None or peak >= 60 << 20, peak
    del block
    spec = []
    normalize_spec({"pass": "bwd", "shapes": [{"b": 1, "hq": 2, "hkv": 1, "sq": 3, "sk": 5, "d": 8, "dv": 8}]}, spec)
    assert spec[0]["passes"] == ["bwd"]
    try:
        normalize_spec({"passes": ["fwd", "grad"], "shapes": []}, [])
        raise AssertionError("an unknown pass was accepted in a spec")
    except ValueError:
        pass


def variants_self_test(presets):
    """The variant cases: the preset's list, the kernels each case runs, what records and skips are named."""
    cases = load_cases(os.path.join(presets, "variants.json"))
    gpu = [c for c in cases if c[0] == "bf16" and c[1]["sq"] in (8192, 32768) and c[1]["hq"] == 16]
    assert len(gpu) == 2 * 5, len(gpu)
    labels = sorted({variant_label(c[5]) for c in gpu})
    assert labels == ["", "alibi standard tl", "softcap 50", "window 4096,0 tl", "window 4096,0 tl · softcap 50"], labels
    # The records carry what sdpa bench's carry: the diagonal written out for windows and ALiBi.
    win = [c[5] for c in gpu if c[5].get("window") and "softcap" not in c[5]][0]
    assert win == {"window": {"left": 4096, "right": 0}, "diagonal": "top-left"}, win
    cpu = [c for c in cases if c[1]["sq"] == 16384]
    assert {c[0] for c in cpu} == {"f32", "bf16"} and len(cpu) == 2 * 4
    variant_inputs = {inputs_key(c[0], c[1], c[2], c[3]) for c in cases if c[5]}
    plain_gpu = [c for c in gpu if not c[5]][0]
    in_sweep = inputs_key(*plain_gpu[:4]) in variant_inputs
    assert in_sweep and "flex" in case_kernels("cuda", {}, in_sweep, [])
    assert "flex" not in case_kernels("cuda", {}, False, []) and "flex" not in case_kernels("cpu", {}, True, [])
    assert case_kernels("cuda", win, True, []) == ["flex", "default", "unfused"]
    assert case_kernels("cpu", win, True, ["math"]) == ["math"]
    assert recorded_kernel("default", win) == "default+mask" and recorded_kernel("flex", win) == "flex"
    assert recorded_kernel("unfused", win) == "unfused" and recorded_kernel("default", {}) == "default"
    sk = skip("flex", "bf16", plain_gpu[1], "causal", "bhsd", "no", False, win)
    assert sk["reason"] == "[window 4096,0 tl] no" and skip("x", "f32", {}, "none", "bhsd", "r", False)["reason"] == "r"
    # A spec sdpa bench writes for one case (a single variants object in a list), and refusals.
    spec = []
    normalize_spec({"dtypes": ["bf16"], "masks": ["none"], "variants": [{"softcap": 30.0}],
                    "shapes": [{"b": 1, "hq": 2, "hkv": 1, "sq": 3, "sk": 5, "d": 8, "dv": 8}]}, spec)
    assert spec[0]["variants"] == [{"softcap": 30.0}]
    spec = []
    normalize_spec({"variants": {"softcap": 30.0}, "shapes": []}, spec)
    assert spec[0]["variants"] == [{"softcap": 30.0}]
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "v.json")
        for bad in ({"alibi": "standard"}, {"alibi": {"slopes": [1.0]}, "diagonal": "br"}):
            with open(path, "w") as f:
                json.dump({"masks": ["none"], "variants": [bad],
                           "shapes": [{"b": 1, "hq": 2, "hkv": 1, "sq": 3, "sk": 5, "d": 8, "dv": 8}]}, f)
            try:
                load_cases(path)
                raise AssertionError(f"{bad} was accepted")
            except ValueError:
                pass


def parse_passes(text):
    """--passes as a list (None when not given); an unknown name is an error."""
    if not text:
        return None
    out = [x.strip().lower() for x in text.split(",") if x.strip()]
    for x in out:
        if x not in PASSES:
            raise ValueError(f"--passes: unknown pass {x!r} (expected one of {', '.join(PASSES)})")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", help="bench spec file (sdpa-core BenchSpec, an array of them, or a replay spec)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--out", help="output file (default: stdout)")
    p.add_argument("--kernels", help="comma-separated: " + ", ".join(KERNELS) +
                   " (default, plain cases: all but flex on cuda, default, flash, math, unfused on cpu; cases with "
                   "variants: flex, default, unfused on cuda, default, unfused on cpu; on cuda the plain cases of a "
                   "variant sweep add flex)")
    p.add_argument("--warmup", type=int, help="untimed calls (default: the spec's, else 3)")
    p.add_argument("--reps", type=int, help="most timed calls per configuration (default: the spec's, else 20)")
    p.add_argument("--max-time", type=float, help="seconds per configuration (default: the spec's, else 2)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads on the CPU")
    p.add_argument("--passes", help="comma-separated: fwd, bwd, fwd+bwd (default: the spec's, else fwd)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-check", action="store_true", help="skip the float64 comparison")
    p.add_argument("--dry-run", action="store_true", help="list the configurations and exit (no torch needed)")
    p.add_argument("--self-test", action="store_true", help="check the cost model and spec parsing (no torch)")
    args = p.parse_args()
    if args.self_test:
        self_test()
        return
    if not args.spec:
        p.error("--spec is required")
    if (args.reps is not None and args.reps < 1) or (args.max_time is not None and args.max_time <= 0) or \
            (args.warmup is not None and args.warmup < 0):
        p.error("--reps must be >= 1, --max-time > 0, --warmup >= 0")
    try:
        cases = load_cases(args.spec, parse_passes(args.passes))
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
        raise SystemExit(f"pytorch_sdpa.py: {args.spec}: {e}")
    if args.dry_run:
        for dtype, s, mask, layout, timing, variants, ragged, pass_ in cases:
            print(pass_, dtype, mask, layout, json.dumps(s), json.dumps(timing), json.dumps(variants),
                  ragged_label(ragged) if ragged else "dense")
        return
    run(args)


if __name__ == "__main__":
    main()
