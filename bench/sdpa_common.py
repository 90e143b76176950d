"""What the Python benchmark scripts share with sdpa-core: the cost model (sdpa-core/src/cost.rs), the per-dtype
tolerances (sdpa_core::check::tolerance), the attention variants (sdpa-core/src/variants.rs: sliding windows,
softcap, ALiBi, and the diagonal they measure from) and the machine's CPU model. Pure Python, no torch, so that
`bench/pytorch_sdpa.py --self-test` runs anywhere.

Importers: bench/pytorch_sdpa.py (same folder), bench/cpu/pytorch_cpu_sdpa.py and sdpa-cuda/dev/sdpa_dev.py
(which put this folder on sys.path). One formula source, so a drift between the scripts and the Rust cost
model shows up in one place: `python3 bench/sdpa_common.py` runs the self-test below.
"""

import math
import platform

# sdpa-core's check::tolerance (relative L2 error), f32 exact.
TOLERANCE = {"f32": 1e-5, "f16": 2e-3, "bf16": 1.6e-2}
# The backward's tolerance on each of dQ, dK and dV (relative L2 against float64), sdpa-core's
# backward::backward_tolerance: f32 exact as the forward (the issue's bar), f16 and bf16 twice the forward's (the
# backward chains two more products; the issue's own bar for them, "no worse than 2x the same-dtype unfused
# backward", is what sdpa's tests check).
BWD_TOLERANCE = {"f32": 1e-5, "f16": 2 * TOLERANCE["f16"], "bf16": 2 * TOLERANCE["bf16"]}
ELEM_BYTES = {"f32": 4, "f16": 2, "bf16": 2}
# sdpa-core's Mask names as the scripts spell them: "causal" is top-left, "causal-br" bottom-right; "bool" and
# "additive" are explicit masks (every pair computed).
MASKS = ("none", "causal", "causal-br", "bool", "additive")
# sdpa_core::backward::Pass names: the forward alone, the backward alone (given O, LSE and dO), both in one step.
PASSES = ("fwd", "bwd", "fwd+bwd")


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


def cost(shape, mask, dtype, variants=None, pass_="fwd"):
    """(FLOPs, minimal bytes) of one call, as sdpa_core::cost::AttentionCost. `shape`: a dict with b, hq, hkv,
    sq, sk, d and dv (dv defaults to d). With `variants` (normalised by `normalize_variants`), the pairs are those
    the causal mask and the window leave.
      fwd      FLOPs 2·B·Hq·pairs·(D + Dv); bytes: Q and O with Hq heads, K and V with Hkv heads, each read or
               written once at the dtype's element size (AttentionCost::of_spec).
      bwd      FLOPs 2·B·Hq·pairs·(3D + 2Dv): S recomputed, dV, dP, dQ and dK (AttentionCost::backward_of_spec);
               bytes: Q, K, V, O, dO and the f32 LSE read, dQ, dK, dV written.
      fwd+bwd  the sum of the two (a training step's attention)."""
    if pass_ not in PASSES:
        raise ValueError(f"unknown pass {pass_!r} (expected one of {', '.join(PASSES)})")
    s = shape
    d, dv = s["d"], s.get("dv", s["d"])
    if variants and variants.get("window"):
        lo, hi = band(mask, variants, s["sq"], s["sk"])
        pairs = band_pairs(lo, hi, s["sq"], s["sk"])
    else:
        pairs = pairs_per_head(s["sq"], s["sk"], mask)
    q_rows, kv_rows = s["b"] * s["hq"] * s["sq"], s["b"] * s["hkv"] * s["sk"]
    fwd_flops = 2.0 * s["b"] * s["hq"] * pairs * (d + dv)
    fwd_bytes = float((q_rows + kv_rows) * (d + dv) * ELEM_BYTES[dtype])
    bwd_flops = 2.0 * s["b"] * s["hq"] * pairs * (3 * d + 2 * dv)
    # Read Q, O, dO (query rows) and K, V; write dQ, dK, dV; the LSE is f32, one per query row.
    bwd_elems = q_rows * (d + dv + dv) + kv_rows * (d + dv) + q_rows * d + kv_rows * (d + dv)
    bwd_bytes = float(bwd_elems * ELEM_BYTES[dtype] + q_rows * 4)
    if pass_ == "fwd":
        return fwd_flops, fwd_bytes
    if pass_ == "bwd":
        return bwd_flops, bwd_bytes
    return fwd_flops + bwd_flops, fwd_bytes + bwd_bytes


# ---------------------------------------------------------------------------------------------------------
# Variants (sdpa-core/src/variants.rs), in the JSON form of sdpa_core::Variants:
#   {"window": {"left": 4096, "right": 0}, "softcap": 50.0, "alibi": "standard" | {"slopes": [...]},
#    "diagonal": "top-left" | "bottom-right"}     (every key optional; {} is plain attention)
# The score of query row i and key j:
#   x = scale·q_i·k_j;  x' = cap·tanh(x/cap) (softcap);  s = x' − slope_h·|j − diag(i)| (ALiBi) + explicit mask
#   key j takes part iff i + lo <= j <= i + hi (`band`: causal mask and window), diag(i) = i (top-left) or
#   i + Sk − Sq (bottom-right, FlashAttention's).

DIAGONALS = {"top-left": "top-left", "tl": "top-left", "bottom-right": "bottom-right", "br": "bottom-right"}
MASK_DIAGONAL = {"causal": "top-left", "causal-br": "bottom-right"}


def normalize_variants(v, mask):
    """A validated copy of one variants object with the diagonal written out (as sdpa bench records carry it),
    or {} for plain attention. Raises ValueError with the reason, as sdpa-core's validation does."""
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ValueError(f"variants {v!r} must be an object")
    unknown = set(v) - {"window", "softcap", "alibi", "diagonal"}
    if unknown:
        raise ValueError(f"variants: unknown key(s) {', '.join(sorted(unknown))}")
    out = {}
    w = v.get("window")
    if w is not None:
        if not isinstance(w, dict) or set(w) - {"left", "right"}:
            raise ValueError(f"window {w!r} must be {{\"left\": L, \"right\": R}} (null = unbounded)")
        side = lambda x: None if x is None or x == -1 else int(x)
        left, right = side(w.get("left")), side(w.get("right"))
        if (left is not None and left < 0) or (right is not None and right < 0):
            raise ValueError(f"window {w!r}: sides are key counts (or null/-1 for unbounded)")
        out["window"] = {"left": left, "right": right}
    c = v.get("softcap")
    if c is not None:
        c = float(c)
        if not (math.isfinite(c) and c > 0):
            raise ValueError(f"softcap {c} must be finite and > 0")
        out["softcap"] = c
    a = v.get("alibi")
    if a is not None:
        if a == "standard":
            out["alibi"] = "standard"
        elif isinstance(a, dict) and isinstance(a.get("slopes"), list):
            slopes = [float(x) for x in a["slopes"]]
            if not all(math.isfinite(x) for x in slopes):
                raise ValueError("ALiBi slopes must be finite")
            out["alibi"] = {"slopes": slopes}
        else:
            raise ValueError(f"alibi {a!r} must be \"standard\" or {{\"slopes\": [...]}}")
    if not out:
        return {}
    named = v.get("diagonal")
    if named is not None:
        if named not in DIAGONALS:
            raise ValueError(f"unknown diagonal {named!r} (expected top-left or bottom-right)")
        named = DIAGONALS[named]
    from_mask = MASK_DIAGONAL.get(mask)
    if from_mask and named and named != from_mask:
        raise ValueError(f"the mask {mask} aligns the diagonal {from_mask} but the variants name {named}")
    diagonal = from_mask or named
    if ("window" in out or "alibi" in out) and diagonal is None:
        raise ValueError("a window or ALiBi measures from the diagonal: name it (top-left or bottom-right) or use "
                         "a causal mask")
    if diagonal:
        out["diagonal"] = diagonal
    return out


def diag_offset(diagonal, sq, sk):
    """diag(i) − i."""
    return sk - sq if diagonal == "bottom-right" else 0


def band(mask, variants, sq, sk):
    """(lo, hi): row i sees keys i + lo ..= i + hi by position (None = unbounded), as AttentionSpec::band."""
    lo = hi = None
    if mask in MASK_DIAGONAL:
        hi = diag_offset(MASK_DIAGONAL[mask], sq, sk)
    w = (variants or {}).get("window")
    if w:
        off = diag_offset(variants.get("diagonal"), sq, sk)
        if w["left"] is not None:
            lo = off - w["left"]
        if w["right"] is not None:
            h = off + w["right"]
            hi = h if hi is None else min(hi, h)
    return lo, hi


def key_range(lo, hi, i, sk):
    """Keys row i may see: range(a, b), clamped to 0..sk (empty when none), as KeyBand::range."""
    a = 0 if lo is None else min(max(i + lo, 0), sk)
    b = sk if hi is None else min(max(i + hi + 1, 0), sk)
    return range(a, max(a, b))


def band_pairs(lo, hi, sq, sk):
    """Visible (query, key) pairs per head (row by row: exact, and fast enough for 32k rows)."""
    return sum(len(key_range(lo, hi, i, sk)) for i in range(sq))


def standard_alibi_slopes(h):
    """The ALiBi paper's slopes for h heads (sdpa_core::standard_alibi_slopes)."""
    def pow2(n):
        return [2.0 ** (-8.0 * (k + 1) / n) for k in range(n)]
    if h <= 0:
        return []
    if h & (h - 1) == 0:
        return pow2(h)
    p = 1 << (h.bit_length() - 1)
    return pow2(p) + pow2(2 * p)[0::2][: h - p]


def alibi_slopes(variants, hq):
    """Slope per query head, or None without ALiBi; the count must equal Hq."""
    a = (variants or {}).get("alibi")
    if a is None:
        return None
    slopes = standard_alibi_slopes(hq) if a == "standard" else list(a["slopes"])
    if len(slopes) != hq:
        raise ValueError(f"{len(slopes)} ALiBi slopes given for Hq = {hq} query heads")
    return slopes


def variant_label(variants):
    """`window 4096,0 tl · softcap 50 · alibi standard`, or "" (sdpa_core::Variants::label)."""
    v = variants or {}
    d = {"top-left": "tl", "bottom-right": "br"}.get(v.get("diagonal"), "")
    diag = f" {d}" if d else ""
    parts = []
    if v.get("window"):
        side = lambda x: "-1" if x is None else str(x)
        parts.append(f"window {side(v['window']['left'])},{side(v['window']['right'])}{diag}")
    if v.get("softcap") is not None:
        c = v["softcap"]
        parts.append(f"softcap {int(c) if c == int(c) else c}")
    if v.get("alibi") is not None:
        name = "standard" if v["alibi"] == "standard" else "slopes"
        parts.append(f"alibi {name}{'' if v.get('window') else diag}")
    return " · ".join(parts)


def score(x, i, j, h, sq, sk, variants, slopes):
    """One score after the variants (no mask): softcap then ALiBi, as the f64 reference computes it."""
    v = variants or {}
    if v.get("softcap") is not None:
        x = v["softcap"] * math.tanh(x / v["softcap"])
    if slopes is not None:
        x -= slopes[h] * abs(j - (i + diag_offset(v.get("diagonal"), sq, sk)))
    return x


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
    # The backward: 2.5x the forward's FLOPs at D = Dv (S recomputed, dV, dP, dQ, dK), 2·B·Hq·pairs·(3D + 2Dv).
    assert cost(big, "none", "bf16", pass_="bwd")[0] == 2.5 * cost(big, "none", "bf16")[0]
    assert cost(s, "causal", "f32", pass_="bwd")[0] == 2 * 2 * 6 * (3 * 4 + 2 * 2) == 384
    # Bytes: Q, O, dO, dQ (query rows 2·3, D/Dv/Dv/D = 12 per row) and K, V, dK, dV (5 rows, 12 per row), the f32 LSE.
    assert cost(s, "none", "f32", pass_="bwd")[1] == (6 * 12 + 5 * 12) * 4 + 6 * 4
    both = cost(s, "causal-br", "bf16", pass_="fwd+bwd")
    assert both == tuple(a + b for a, b in zip(cost(s, "causal-br", "bf16"), cost(s, "causal-br", "bf16", pass_="bwd")))
    try:
        cost(s, "none", "f32", pass_="backward")
        raise AssertionError("an unknown pass was accepted")
    except ValueError:
        pass
    try:
        pairs_per_head(1, 1, "causal_top_left")
        raise AssertionError("an unknown mask name was accepted")
    except ValueError:
        pass
    assert cpu_model()
    variants_self_test()


def variants_self_test():
    """The variant translation against the semantics written out key by key."""
    # The band against the definition: diag(i) − left <= j <= diag(i) + right, and j <= diag(i) when causal.
    for sq, sk in ((5, 5), (3, 8), (8, 3), (1, 7)):
        for mask in ("none", "causal", "causal-br"):
            for w in (None, (2, 0), (0, 1), (None, 0), (1, None), (100, 100)):
                for diag in ("top-left", "bottom-right"):
                    if mask in MASK_DIAGONAL:
                        diag = MASK_DIAGONAL[mask]
                    raw = {"diagonal": diag}
                    if w:
                        raw["window"] = {"left": w[0], "right": w[1]}
                    v = normalize_variants(raw, mask)
                    lo, hi = band(mask, v, sq, sk)
                    off = diag_offset(diag, sq, sk)
                    for i in range(sq):
                        want = [j for j in range(sk)
                                if (mask == "none" or j <= i + off)
                                and (not w or ((w[0] is None or j >= i + off - w[0])
                                               and (w[1] is None or j <= i + off + w[1])))]
                        assert list(key_range(lo, hi, i, sk)) == want, (sq, sk, mask, w, diag, i)
                    assert band_pairs(lo, hi, sq, sk) == sum(len(key_range(lo, hi, i, sk)) for i in range(sq))
    # A window wider than Sk is no window; a causal window (None, 0) is the causal mask.
    s = {"b": 1, "hq": 2, "hkv": 1, "sq": 64, "sk": 64, "d": 8, "dv": 8}
    wide = normalize_variants({"window": {"left": 1000, "right": 1000}, "diagonal": "tl"}, "none")
    assert cost(s, "none", "f32", wide) == cost(s, "none", "f32")
    causal = normalize_variants({"window": {"left": -1, "right": 0}, "diagonal": "br"}, "none")
    assert cost(s, "none", "f32", causal) == cost(s, "causal", "f32")
    # Window 4096 at 32k, causal: 4097 keys per row, fewer for the first 4096 rows.
    w = normalize_variants({"window": {"left": 4096, "right": 0}}, "causal")
    assert w == {"window": {"left": 4096, "right": 0}, "diagonal": "top-left"}
    n = 32768
    assert band_pairs(*band("causal", w, n, n), n, n) == n * 4097 - 4096 * 4097 // 2
    assert variant_label(w) == "window 4096,0 tl"
    both = normalize_variants({"window": {"left": 4096, "right": 0}, "softcap": 50, "alibi": "standard"}, "causal-br")
    assert variant_label(both) == "window 4096,0 br · softcap 50 · alibi standard", variant_label(both)
    assert variant_label(normalize_variants({"alibi": "standard"}, "causal")) == "alibi standard tl"
    assert normalize_variants({}, "causal") == {} and normalize_variants({"diagonal": "br"}, "none") == {}
    assert normalize_variants({"softcap": 30}, "none") == {"softcap": 30.0}
    for bad, mask in (({"window": {"left": 4, "right": 0}}, "none"), ({"alibi": "standard"}, "bool"),
                      ({"window": {"left": 4, "right": 0}, "diagonal": "br"}, "causal"), ({"softcap": 0}, "none"),
                      ({"softcap": float("inf")}, "none"), ({"alibi": "bloom", "diagonal": "tl"}, "none"),
                      ({"windw": {}}, "none"), ({"window": {"left": -3, "right": 0}, "diagonal": "tl"}, "none")):
        try:
            normalize_variants(bad, mask)
            raise AssertionError(f"{bad} with mask {mask} was accepted")
        except ValueError:
            pass
    # Standard slopes: 2^(-8(k+1)/n) for powers of two; 12 heads take 8's and every other of 16's.
    assert standard_alibi_slopes(8) == [2.0 ** -(k + 1) for k in range(8)]
    assert standard_alibi_slopes(12) == standard_alibi_slopes(8) + [2.0 ** (-(2 * k + 1) / 2) for k in range(4)]
    assert alibi_slopes({"alibi": {"slopes": [0.5, 0.25]}}, 2) == [0.5, 0.25] and alibi_slopes({}, 4) is None
    try:
        alibi_slopes({"alibi": {"slopes": [0.5]}}, 2)
        raise AssertionError("a wrong slope count was accepted")
    except ValueError:
        pass
    # Scores: softcap bounds them by the cap; ALiBi subtracts slope·distance from the diagonal.
    v = normalize_variants({"softcap": 50, "alibi": "standard"}, "causal-br")
    sl = alibi_slopes(v, 2)
    assert abs(score(1e4, 3, 5, 0, 4, 8, v, sl) - (50 * math.tanh(200) - 0.0625 * abs(5 - 7))) < 1e-12
    assert abs(score(-1e4, 0, 0, 1, 4, 8, v, sl) - (-50 * math.tanh(200) - 0.00390625 * 4)) < 1e-12


if __name__ == "__main__":
    self_test()
    print("sdpa_common.py self-test: ok")
