//! The cost model: FLOPs, minimal bytes, arithmetic intensity, roofline time and efficiency, and the
//! expected flash-attention efficiency band for a sequence length (DESIGN.md, "Cost model").

use crate::backend::F32Math;
use crate::dtype::DType;
use crate::hardware::HardwareSpec;
use crate::spec::{AttentionSpec, Mask, Shape};
use crate::variants::KeyBand;
use serde::{Deserialize, Serialize};

/// Number of (query, key) pairs one head computes under `mask`, counted exactly: causal masks count only
/// unmasked pairs, and the two alignments differ when `Sq != Sk`. Explicit masks count every pair (kernels
/// compute them all). Exact in `u128` for any `usize` lengths.
pub fn pairs_per_head(sq: usize, sk: usize, mask: &Mask) -> u128 {
    let (q, k) = (sq as u128, sk as u128);
    let tri = |n: u128| n * (n + 1) / 2;
    match mask {
        Mask::None | Mask::Explicit(_) => q * k,
        // Row i sees min(i + 1, Sk) keys.
        Mask::CausalTopLeft => {
            if q <= k {
                tri(q)
            } else {
                tri(k) + (q - k) * k
            }
        }
        // Row i sees clamp(i + 1 + Sk - Sq, 0, Sk) keys.
        Mask::CausalBottomRight => {
            if q <= k {
                q * (k - q) + tri(q)
            } else {
                tri(k)
            }
        }
    }
}

/// FLOPs and minimal bytes of one forward call.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AttentionCost {
    /// Floating-point operations of the two matrix products: `2·pairs·(D + Dv)` summed over batch and heads.
    pub flops: f64,
    /// Bytes to read Q, K, V once and write O once at the dtype's size (K and V with Hkv heads).
    pub bytes: f64,
}

impl AttentionCost {
    /// Cost of a shape under a mask at a dtype (usable without strides, e.g. from a profiler trace).
    pub fn of(shape: &Shape, mask: &Mask, dtype: DType) -> Self {
        Self::with_elem_bytes(shape, mask, dtype.size_bytes() as f64)
    }

    /// Same with an explicit element size (traces may report dtypes we do not run, e.g. fp8).
    pub fn with_elem_bytes(shape: &Shape, mask: &Mask, elem_bytes: f64) -> Self {
        Self::of_pairs(shape, pairs_per_head(shape.sq, shape.sk, mask), elem_bytes)
    }

    /// Cost of a shape whose rows see the keys of `band` (a causal mask and a window together): the work
    /// actually done by a kernel that skips what the band excludes.
    pub fn of_band(shape: &Shape, band: &KeyBand, elem_bytes: f64) -> Self {
        Self::of_pairs(shape, band.pairs(shape.sq, shape.sk), elem_bytes)
    }

    fn of_pairs(shape: &Shape, pairs_per_head: u128, elem_bytes: f64) -> Self {
        let s = shape;
        let bh = (s.b as f64) * (s.hq as f64);
        let pairs = pairs_per_head as f64;
        let flops = 2.0 * bh * pairs * (s.d as f64 + s.dv as f64);
        let elems = (s.b as f64)
            * ((s.hq as f64) * (s.sq as f64) * (s.d as f64 + s.dv as f64)
                + (s.hkv as f64) * (s.sk as f64) * (s.d as f64 + s.dv as f64));
        AttentionCost { flops, bytes: elems * elem_bytes }
    }

    /// Cost of a spec: the pairs its causal mask and window leave (explicit masks count every pair).
    pub fn of_spec(spec: &AttentionSpec) -> Self {
        let elem = spec.dtype.size_bytes() as f64;
        let mut cost = match &spec.ragged {
            None => Self::of_band(&spec.shape, &spec.band(), elem),
            Some(r) => Self::of_ragged(spec, r, elem),
        };
        // O is written at its own type (`DType::output`: bf16 for f8e4m3 inputs), not the inputs'.
        let out = spec.out_dtype().size_bytes() as f64;
        if out != elem {
            let s = &spec.shape;
            let q_rows = spec.ragged.as_ref().map_or(s.b as f64 * s.sq as f64, |r| r.total_q() as f64);
            cost.bytes += q_rows * s.hq as f64 * s.dv as f64 * (out - elem);
        }
        cost
    }

    /// A ragged batch: each sequence's band over its own lengths, and each token read or written once
    /// (a paged cache's keys counted by cache length, whatever pages they share).
    fn of_ragged(spec: &AttentionSpec, r: &crate::ragged::Ragged, elem_bytes: f64) -> Self {
        let s = &spec.shape;
        let pairs: f64 =
            r.seqlens_q.iter().zip(&r.seqlens_k).map(|(&sq, &sk)| spec.band_for(sq, sk).pairs(sq, sk) as f64).sum();
        let hd = s.d as f64 + s.dv as f64;
        let flops = 2.0 * s.hq as f64 * pairs * hd;
        let elems = r.total_q() as f64 * s.hq as f64 * hd + r.total_k() as f64 * s.hkv as f64 * hd;
        AttentionCost { flops, bytes: elems * elem_bytes }
    }

    /// Cost of the backward of a spec: five products over the pairs the forward computes (S recomputed,
    /// dV = PᵀdO, dP = dO·Vᵀ, dQ = dS·K, dK = dSᵀQ), `2·pairs·(3D + 2Dv)` FLOPs, 2.5x the forward at
    /// `D = Dv` (the count FlashAttention's benchmarks use); bytes read Q, K, V, O, dO and the f32 LSE and
    /// write dQ, dK, dV once each.
    pub fn backward_of_spec(spec: &AttentionSpec) -> Self {
        let fwd = Self::of_spec(spec);
        let s = &spec.shape;
        let (d, dv) = (s.d as f64, s.dv as f64);
        let flops = fwd.flops * (3.0 * d + 2.0 * dv) / (d + dv);
        let elem = spec.dtype.size_bytes() as f64;
        let (q_rows, k_rows) = match &spec.ragged {
            Some(r) => (r.total_q() as f64, r.total_k() as f64),
            None => ((s.b * s.sq) as f64, (s.b * s.sk) as f64),
        };
        // Forward bytes cover Q, K, V, O; the backward adds dO, the LSE, dQ, dK and dV.
        let extra = q_rows * s.hq as f64 * ((dv + d) * elem + 4.0) + k_rows * s.hkv as f64 * (d + dv) * elem;
        AttentionCost { flops, bytes: fwd.bytes + extra }
    }

    /// Cost of `pass`: the forward, the backward, or both together.
    pub fn of_pass(spec: &AttentionSpec, pass: crate::backward::Pass) -> Self {
        use crate::backward::Pass;
        match pass {
            Pass::Fwd => Self::of_spec(spec),
            Pass::Bwd => Self::backward_of_spec(spec),
            Pass::FwdBwd => {
                let (f, b) = (Self::of_spec(spec), Self::backward_of_spec(spec));
                AttentionCost { flops: f.flops + b.flops, bytes: f.bytes + b.bytes }
            }
        }
    }

    /// FLOPs per byte.
    pub fn arithmetic_intensity(&self) -> f64 {
        if self.bytes > 0.0 {
            self.flops / self.bytes
        } else {
            0.0
        }
    }

    /// Achieved TFLOP/s for a measured time in milliseconds.
    pub fn tflops(&self, time_ms: f64) -> f64 {
        self.flops / (time_ms * 1e-3) / 1e12
    }

    /// Achieved GB/s of the minimal bytes for a measured time in milliseconds.
    pub fn gbps(&self, time_ms: f64) -> f64 {
        self.bytes / (time_ms * 1e-3) / 1e9
    }

    /// Roofline for this cost on `hw` at the peak that applies to `dtype` and `f32_math`.
    pub fn roofline(&self, hw: &HardwareSpec, dtype: DType, f32_math: F32Math) -> Roofline {
        let peak = hw.peak_tflops(dtype, f32_math) * 1e12;
        let bw = hw.mem_bandwidth_gbs * 1e9;
        let compute_s = self.flops / peak;
        let memory_s = self.bytes / bw;
        Roofline {
            compute_s,
            memory_s,
            time_s: compute_s.max(memory_s),
            bound: if compute_s >= memory_s { Bound::Compute } else { Bound::Memory },
            ridge_intensity: peak / bw,
        }
    }
}

/// Which resource limits a call on the roofline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Bound {
    /// FLOPs / peak exceeds bytes / bandwidth.
    Compute,
    /// Bytes / bandwidth exceeds FLOPs / peak (decoding, tiny head dims).
    Memory,
}

/// The roofline floor of one call on one device.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Roofline {
    /// FLOPs / peak, seconds.
    pub compute_s: f64,
    /// Bytes / bandwidth, seconds.
    pub memory_s: f64,
    /// The larger of the two: no kernel runs faster.
    pub time_s: f64,
    /// Which one it is.
    pub bound: Bound,
    /// Arithmetic intensity (FLOP/byte) where the two meet on this device.
    pub ridge_intensity: f64,
}

impl Roofline {
    /// Roofline time over measured time, in [0, 1] for an honest measurement.
    pub fn efficiency(&self, measured_ms: f64) -> f64 {
        self.time_s / (measured_ms * 1e-3)
    }
}

/// Expected efficiency range of a good flash-attention kernel at a sequence length (the seed table).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EfficiencyBand {
    /// Lower edge, fraction of peak.
    pub low: f64,
    /// Upper edge, fraction of peak.
    pub high: f64,
    /// The seed table row it comes from.
    pub label: &'static str,
}

/// The band for sequence length `n` (the key length for attention ops). The seed table gives
/// N < 512: 5-15 %, N = 1024: 20-40 %, N = 2048: 40-60 %, N > 4096: 50-70 %; lengths between its rows take
/// the nearer row below: 512..1024 → the 1024 row, 1024..2048 → the 1024 row, 2048..=4096 → the 2048 row.
pub fn expected_band(n: usize) -> EfficiencyBand {
    match n {
        0..=511 => EfficiencyBand { low: 0.05, high: 0.15, label: "N < 512" },
        512..=2047 => EfficiencyBand { low: 0.20, high: 0.40, label: "N ~ 1024" },
        2048..=4096 => EfficiencyBand { low: 0.40, high: 0.60, label: "N ~ 2048" },
        _ => EfficiencyBand { low: 0.50, high: 0.70, label: "N > 4096" },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{ExplicitMask, MaskValues};

    fn brute(sq: usize, sk: usize, mask: &Mask) -> u128 {
        (0..sq).map(|i| mask.causal_limit(i, sq, sk).unwrap_or(sk) as u128).sum()
    }

    #[test]
    fn causal_pairs_are_exact_in_both_alignments() {
        for sq in [1, 2, 3, 7, 64, 100] {
            for sk in [1, 2, 5, 64, 77, 130] {
                for m in [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight] {
                    assert_eq!(pairs_per_head(sq, sk, &m), brute(sq, sk, &m), "{sq} {sk} {m:?}");
                }
            }
        }
        // Decoding one token against a 4096 cache: bottom-right sees all keys, top-left sees one.
        assert_eq!(pairs_per_head(1, 4096, &Mask::CausalBottomRight), 4096);
        assert_eq!(pairs_per_head(1, 4096, &Mask::CausalTopLeft), 1);
        let ex = Mask::Explicit(ExplicitMask { values: MaskValues::Boolean, dims: [1, 1, 3, 4] });
        assert_eq!(pairs_per_head(3, 4, &ex), 12);
    }

    /// The closed form of `KeyBand::pairs` against a count row by row, over bands that cross every edge.
    #[test]
    fn band_pairs_are_exact() {
        let bounds = [None, Some(-300), Some(-5), Some(-1), Some(0), Some(1), Some(3), Some(64), Some(500)];
        for sq in [1usize, 2, 7, 64, 100] {
            for sk in [1usize, 3, 64, 77, 130] {
                for lo in bounds {
                    for hi in bounds {
                        let band = KeyBand { lo, hi };
                        let brute: u128 = (0..sq).map(|i| band.range(i, sk).len() as u128).sum();
                        assert_eq!(band.pairs(sq, sk), brute, "sq {sq} sk {sk} {band:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_window_costs_its_work_not_sk_squared() {
        use crate::variants::{Diagonal, Window};
        let shape = Shape::new(1, 16, 32768, 32768, 128);
        let spec = AttentionSpec::new(shape, DType::BF16).with_mask(Mask::CausalBottomRight);
        let full = AttentionCost::of_spec(&spec);
        let win = AttentionCost::of_spec(&spec.clone().with_window(Window::left(4095)));
        // 4096 keys per row (fewer for the first 4095 rows) against (S + 1) / 2 on average.
        let expect = (32768.0 * 4096.0 - 4095.0 * 4096.0 / 2.0) / (32768.0 * 32769.0 / 2.0);
        assert!((win.flops / full.flops - expect).abs() < 1e-12, "{}", win.flops / full.flops);
        let tl = spec.with_mask(Mask::None).with_window(Window { left: Some(0), right: Some(0) });
        assert_eq!(AttentionCost::of_spec(&tl.with_diagonal(Diagonal::TopLeft)).flops, 2.0 * 16.0 * 32768.0 * 256.0);
    }

    /// Regression: an f8e4m3 call's minimal bytes counted O at one byte per element, though O is written in
    /// bf16 (`DType::output`), so FP8 records understated their GB/s; Q, K and V stay at one byte.
    #[test]
    fn fp8_calls_count_o_at_its_bf16_size() {
        let shape = Shape { hkv: 2, dv: 32, ..Shape::new(2, 8, 100, 300, 64) };
        let fp8 = AttentionCost::of_spec(&AttentionSpec::new(shape, DType::F8E4M3));
        let (q, k, v, o) =
            (2.0 * 8.0 * 100.0 * 64.0, 2.0 * 2.0 * 300.0 * 64.0, 2.0 * 2.0 * 300.0 * 32.0, 2.0 * 8.0 * 100.0 * 32.0);
        assert_eq!(fp8.bytes, q + k + v + 2.0 * o);
        let bf16 = AttentionCost::of_spec(&AttentionSpec::new(shape, DType::BF16));
        assert_eq!((bf16.bytes, fp8.flops), (2.0 * (q + k + v + o), bf16.flops));
        // A ragged batch: O's rows are its query tokens.
        let r = crate::Ragged::new(vec![10, 90], vec![100, 300]);
        let ragged = AttentionSpec::new(Shape { sq: 90, ..shape }, DType::F8E4M3).with_ragged(r, crate::Layout::Bshd);
        let c = AttentionCost::of_spec(&ragged);
        assert_eq!(c.bytes, 100.0 * 8.0 * 96.0 + 400.0 * 2.0 * 96.0 + 100.0 * 8.0 * 32.0);
    }

    #[test]
    fn flops_and_bytes_match_the_textbook_formulas() {
        let shape = Shape::new(2, 16, 1024, 1024, 64);
        let c = AttentionCost::of(&shape, &Mask::None, DType::BF16);
        assert_eq!(c.flops, 4.0 * 2.0 * 16.0 * 1024.0 * 1024.0 * 64.0);
        assert_eq!(c.bytes, 4.0 * 2.0 * 16.0 * 1024.0 * 64.0 * 2.0);
        let causal = AttentionCost::of(&shape, &Mask::CausalTopLeft, DType::BF16);
        // S(S+1)/2 pairs, slightly more than half.
        assert!((causal.flops / c.flops - 0.5).abs() < 1e-3);
        let f32c = AttentionCost::of(&shape, &Mask::None, DType::F32);
        assert_eq!(f32c.bytes, 2.0 * c.bytes);

        // GQA reads fewer K/V bytes; Dv changes both terms.
        let gqa = Shape { b: 1, hq: 32, hkv: 8, sq: 1, sk: 4096, d: 128, dv: 128 };
        let g = AttentionCost::of(&gqa, &Mask::None, DType::BF16);
        assert_eq!(g.bytes, (32.0 * 256.0 + 8.0 * 4096.0 * 256.0) * 2.0);
    }

    #[test]
    fn roofline_picks_the_binding_resource() {
        let h100 = HardwareSpec::find("NVIDIA H100 80GB HBM3").unwrap();
        let big = AttentionCost::of(&Shape::new(4, 16, 4096, 4096, 128), &Mask::None, DType::BF16);
        let r = big.roofline(h100, DType::BF16, F32Math::Exact);
        assert_eq!(r.bound, Bound::Compute);
        let decode = AttentionCost::of(&Shape::new(8, 32, 1, 4096, 128), &Mask::None, DType::BF16);
        let r = decode.roofline(h100, DType::BF16, F32Math::Exact);
        assert_eq!(r.bound, Bound::Memory);
        assert!((r.efficiency(r.time_s * 2e3) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn bands_follow_the_seed_table() {
        assert_eq!(expected_band(128).high, 0.15);
        assert_eq!(expected_band(1024).low, 0.20);
        assert_eq!(expected_band(2048).low, 0.40);
        assert_eq!(expected_band(8192).high, 0.70);
    }
}
