"""What the Python benchmark scripts share with sdpa-core: the cost model (sdpa-core/src/cost.rs), the per-dtype
tolerances (sdpa_core::check::tolerance) and the machine's CPU model. Pure Python, no torch, so that
`bench/pytorch_sdpa.py --self-test` runs anywhere.

Importers: bench/pytorch_sdpa.py (same folder), bench/cpu/pytorch_cpu_sdpa.py and sdpa-cuda/dev/sdpa_dev.py
(which put this folder on sys.path). One formula source, so a drift between the scripts and the Rust cost
model shows up in one place: `python3 bench/sdpa_common.py` runs the self-test below.
"""

import platform

# sdpa-core's check::tolerance (relative L2 error), f32 exact.
TOLERANCE = {"f32": 1e-5, "f16": 2e-3, "bf16": 1.6e-2}
ELEM_BYTES = {"f32": 4, "f16": 2, "bf16": 2}
# sdpa-core's Mask names as the scripts spell them: "causal" is top-left, "causal-br" bottom-right; "bool" and
# "additive" are explicit masks (every pair computed).
MASKS = ("none", "causal", "causal-br", "bool", "additive")


def pairs_per_head(sq, sk, mask):
    """(query, key) pairs one head computes, exactly as sdpa_core::cost::pairs_per_head counts them: causal masks
    count only unmasked pairs, and the two alignments differ when Sq != Sk; other masks count every pair."""
    tri = lambda n: n * (n + 1) // 2
    if mask == "causal":  # row i sees min(i + 1, Sk) keys
        return tri(sq) if sq <= sk else tri(sk) + (sq - sk) * sk
    if mask == "causal-br":  # row i sees clamp(i + 1 + Sk - Sq, 0, Sk) keys
        return sq * (sk - sq) + tri(sq) if sq <= sk else tri(sk)
    if mask not in MASKS:
        raise ValueError(f"unknown mask {mask!r} (expected one of {', '.join(MASKS)})")
    return sq * sk


def cost(shape, mask, dtype):
    """(FLOPs, minimal bytes) of one forward call, as sdpa_core::cost::AttentionCost: FLOPs
    2·B·Hq·pairs·(D + Dv); bytes: Q and O with Hq heads, K and V with Hkv heads, each read or written once at
    the dtype's element size. `shape`: a dict with b, hq, hkv, sq, sk, d and dv (dv defaults to d)."""
    s = shape
    d, dv = s["d"], s.get("dv", s["d"])
    flops = 2.0 * s["b"] * s["hq"] * pairs_per_head(s["sq"], s["sk"], mask) * (d + dv)
    elems = s["b"] * (s["hq"] * s["sq"] * (d + dv) + s["hkv"] * s["sk"] * (d + dv))
    return flops, float(elems * ELEM_BYTES[dtype])


def cpu_model():
    """The CPU's model name (/proc/cpuinfo), else what the platform module knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def self_test():
    """The cost model against hand-computed values and against a row-by-row count."""
    # Hand-computed: B=1, Hq=2, Hkv=1, Sq=3, Sk=5, D=4, Dv=2.
    s = {"b": 1, "hq": 2, "hkv": 1, "sq": 3, "sk": 5, "d": 4, "dv": 2}
    # none: 15 pairs; causal top-left: rows see 1, 2, 3 keys = 6; bottom-right: rows see 3, 4, 5 keys = 12.
    assert [pairs_per_head(3, 5, m) for m in ("none", "causal", "causal-br", "bool")] == [15, 6, 12, 15]
    assert cost(s, "none", "f32")[0] == 2 * 1 * 2 * 15 * 6 == 360
    assert cost(s, "causal", "bf16")[0] == 2 * 2 * 6 * 6 == 144
    assert cost(s, "causal-br", "f16")[0] == 2 * 2 * 12 * 6 == 288
    # bytes: Q + O = 2·3·6 = 36 elements, K + V = 1·5·6 = 30 elements; 66 at the element size.
    assert cost(s, "causal-br", "bf16")[1] == 66 * 2 and cost(s, "none", "f32")[1] == 66 * 4
    # Sq > Sk: top-left rows see 1, 2, 3, 3, 3 = 12 keys, bottom-right rows see 0, 0, 1, 2, 3 = 6.
    assert pairs_per_head(5, 3, "causal") == 12 and pairs_per_head(5, 3, "causal-br") == 6
    # Decoding one query against 4096 keys: bottom-right sees every key, top-left one.
    assert pairs_per_head(1, 4096, "causal-br") == 4096 and pairs_per_head(1, 4096, "causal") == 1
    # Square causal: S(S+1)/2 pairs in either alignment.
    assert pairs_per_head(1024, 1024, "causal") == pairs_per_head(1024, 1024, "causal-br") == 1024 * 1025 // 2
    for sq in (1, 2, 3, 7, 64, 100):
        for sk in (1, 2, 5, 64, 77, 130):
            tl = sum(min(i + 1, sk) for i in range(sq))
            br = sum(max(0, min(sk, i + 1 + sk - sq)) for i in range(sq))
            assert pairs_per_head(sq, sk, "causal") == tl and pairs_per_head(sq, sk, "causal-br") == br, (sq, sk)
    # sdpa-core's own test figures (cost.rs `flops_and_bytes_match_the_textbook_formulas`).
    big = {"b": 2, "hq": 16, "hkv": 16, "sq": 1024, "sk": 1024, "d": 64, "dv": 64}
    assert cost(big, "none", "bf16") == (4.0 * 2 * 16 * 1024 * 1024 * 64, 4.0 * 2 * 16 * 1024 * 64 * 2)
    gqa = {"b": 1, "hq": 32, "hkv": 8, "sq": 1, "sk": 4096, "d": 128}
    assert cost(gqa, "none", "bf16")[1] == (32.0 * 256 + 8 * 4096 * 256) * 2
    try:
        pairs_per_head(1, 1, "causal_top_left")
        raise AssertionError("an unknown mask name was accepted")
    except ValueError:
        pass
    assert cpu_model()


if __name__ == "__main__":
    self_test()
    print("sdpa_common.py self-test: ok")
