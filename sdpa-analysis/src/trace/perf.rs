//! The per-op performance model: FLOPs and bytes from sdpa-core's cost model at the real element size
//! (the pairs that the causal mask and a sliding window leave, counted exactly by the call's `KeyBand`, Sq != Sk
//! allowed: a windowed call is judged on the work it does, not on Sq·Sk), achieved TFLOP/s and TB/s from the
//! measured kernel time, roofline efficiency on the device, and the expected band for the number of keys a
//! row sees (Sk, or the window's average).
//!
//! Varlen and paged calls are costed from their token totals ([`crate::trace::attention::ragged`]): exactly when
//! the trace pins every sequence's length, otherwise as a bound that [`Perf::work`] names, and judged at the keys
//! a row sees on average.
//!
//! Backward: FLOPs are 2.5x the forward (five matrix products instead of two: dV, dP, dS·K, dSᵀ·Q and the
//! recomputed QKᵀ) and bytes 2x (Q, K, V, O, dO read; dQ, dK, dV written). Decoding (Sq <= 16 against a
//! longer cache) is judged by bandwidth, with its own band; a dense 16-bit backward, where published backward
//! rates exist for the device, by [`crate::trace::frontier::backward_band`] (FlashAttention-2's to -3's rate);
//! everything else by the seed table of [`sdpa_core::expected_band`] on the key length. The primary judgement
//! of a fused op is its standing against the best known rate ([`crate::trace::frontier`]); these bands are
//! the fallback.

use crate::trace::attention::ragged::{Ragged, RowMask, Work, WorkBound};
use crate::trace::attention::{core_dtype, elem_bytes, MaskInfo, Phase};
use sdpa_core::{expected_band, AttentionCost, AttentionSpec, Bound, DType, F32Math, HardwareSpec, Shape, Variants};
use serde::Serialize;

/// An efficiency band, fraction of peak.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Band {
    /// Lower edge.
    pub low: f64,
    /// Upper edge.
    pub high: f64,
    /// Where it comes from.
    pub label: String,
}

/// Query lengths up to this are decoding (judged by bandwidth).
pub const DECODE_MAX_SQ: usize = 16;

/// The band a call is judged against.
pub fn band_for(shape: &Shape) -> Band {
    if is_decode(shape) {
        Band {
            low: 0.50,
            high: 0.85,
            label: "decode (Sq <= 16): bandwidth-bound; flash-decoding reached 63-84 % of HBM bandwidth on H100 \
                    (ANCHORS.md)"
                .into(),
        }
    } else {
        let b = expected_band(shape.sk);
        Band { low: b.low, high: b.high, label: format!("seed table, {}", b.label) }
    }
}

/// True for decoding-like calls: few queries against a longer key sequence.
pub fn is_decode(shape: &Shape) -> bool {
    shape.sq <= DECODE_MAX_SQ && shape.sk > 4 * shape.sq
}

/// Cost and achieved rates of one call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Perf {
    /// FLOPs of one call.
    pub flops: f64,
    /// Minimal bytes of one call.
    pub bytes: f64,
    /// Achieved TFLOP/s.
    pub tflops: f64,
    /// Achieved TB/s of the minimal bytes.
    pub tbps: f64,
    /// Roofline time / measured time, when the device and dtype are known.
    pub efficiency: Option<f64>,
    /// Binding resource on the roofline.
    pub bound: Option<Bound>,
    /// The band it is judged against.
    pub band: Band,
    /// `below`, `within` or `above` the band (when efficiency is known).
    pub band_status: Option<&'static str>,
    /// Whether FLOPs and bytes (and so the rates and efficiency) are exact or bound the truth.
    pub work: WorkBound,
    /// For a varlen or paged call: why its work is exact, or how the bound follows.
    pub work_why: Option<String>,
}

/// Computes the model for one call of `mean_us` microseconds under `mask` and `variants` (only the window
/// changes the work: softcap and ALiBi cost no FLOPs the model counts). A varlen or paged call (`ragged`) is
/// costed from its token totals, exactly or as a bound ([`Ragged::work`]). `kv_dtype`, when the keys and
/// values are read in another type than Q (an FP8 cache), sets their bytes.
#[allow(clippy::too_many_arguments)] // the call's facts, each from its own place in the trace
pub fn model(
    shape: &Shape,
    mask: &MaskInfo,
    variants: &Variants,
    dtype: Option<&str>,
    phase: Phase,
    mean_us: f64,
    hw: Option<&HardwareSpec>,
    ragged: Option<&Ragged>,
    kv_dtype: Option<&str>,
) -> Option<Perf> {
    if mean_us <= 0.0 {
        return None;
    }
    let eb = dtype.map(elem_bytes).unwrap_or(2.0);
    // The spec only carries the band (causal alignment and window); its dtype plays no part in it.
    let band_of = |sq: usize, sk: usize| {
        AttentionSpec::new(Shape { sq, sk, ..*shape }, DType::BF16)
            .with_mask(mask.to_core())
            .with_variants(variants.clone())
            .band()
    };
    let keys = band_of(shape.sq, shape.sk);
    let (mut fwd, work) = match ragged {
        None => (AttentionCost::of_band(shape, &keys, eb), None),
        Some(r) => {
            let w = r.work(row_mask(mask), variants.window.is_some(), |sq, sk| band_of(sq, sk).pairs(sq, sk));
            (ragged_cost(shape, r, &w, eb), Some(w))
        }
    };
    // K and V read at their own element size (an FP8 cache under bf16 queries: one byte each).
    if let Some(kv_eb) = kv_dtype.map(elem_bytes).filter(|&k| k != eb) {
        let key_tokens = work.as_ref().map(|w| w.key_tokens).unwrap_or((shape.b * shape.sk) as f64);
        fwd.bytes += key_tokens * shape.hkv as f64 * (shape.d + shape.dv) as f64 * (kv_eb - eb);
    }
    let cost = match phase {
        Phase::Fwd => fwd,
        Phase::Bwd => AttentionCost { flops: fwd.flops * 2.5, bytes: fwd.bytes * 2.0 },
    };
    let ms = mean_us * 1e-3;
    let band = match (&work, ragged) {
        (Some(w), Some(r)) if !is_decode(shape) && r.total_q > 0 => {
            // Judge a packed batch at the keys its rows see on average, not at its longest sequence.
            let per_row = (w.pairs_per_head / r.total_q as f64).ceil().max(1.0) as usize;
            let mut b = band_for(&Shape { sk: per_row, ..*shape });
            b.label = format!("{}, at {}{per_row} keys per row on average", b.label, w.bound.sign());
            b
        }
        _ => plain_band(shape, variants, &keys),
    };
    // A dense, unwindowed 16-bit backward has its own band where published backward rates exist.
    let sixteen_bit = dtype.and_then(core_dtype).is_some_and(|d| d != DType::F32);
    let band = match phase {
        Phase::Bwd if ragged.is_none() && variants.window.is_none() && sixteen_bit && !is_decode(shape) => {
            crate::trace::frontier::backward_band(hw, shape.sk).unwrap_or(band)
        }
        _ => band,
    };
    let (efficiency, bound) = match (hw, dtype.and_then(core_dtype)) {
        (Some(hw), Some(dt)) => {
            let r = cost.roofline(hw, dt, F32Math::Exact);
            (Some(r.efficiency(ms)), Some(r.bound))
        }
        _ => (None, None),
    };
    let band_status = efficiency.map(|e| {
        if e < band.low {
            "below"
        } else if e > band.high {
            "above"
        } else {
            "within"
        }
    });
    Some(Perf {
        flops: cost.flops,
        bytes: cost.bytes,
        tflops: cost.tflops(ms),
        tbps: cost.gbps(ms) / 1e3,
        efficiency,
        bound,
        band,
        band_status,
        work: work.as_ref().map(|w| w.bound).unwrap_or_default(),
        work_why: work.map(|w| w.why),
    })
}

/// The mask a packed call applies in each sequence.
fn row_mask(mask: &MaskInfo) -> RowMask {
    match mask {
        MaskInfo::CausalTopLeft => RowMask::CausalTopLeft,
        MaskInfo::CausalBottomRight => RowMask::CausalBottomRight,
        _ => RowMask::Full,
    }
}

/// FLOPs of the pairs and the minimal bytes of a packed call: Q and O for every query token, K and V for every
/// key token read (with Hkv heads).
fn ragged_cost(shape: &Shape, r: &Ragged, w: &Work, eb: f64) -> AttentionCost {
    let (hq, hkv, dsum) = (shape.hq as f64, shape.hkv as f64, shape.d as f64 + shape.dv as f64);
    let flops = 2.0 * hq * w.pairs_per_head * dsum;
    let elems = r.total_q as f64 * hq * dsum + w.key_tokens * hkv * dsum;
    AttentionCost { flops, bytes: elems * eb }
}

/// The band of a dense call: the seed table at its key length, or at the keys a window leaves per row.
fn plain_band(shape: &Shape, variants: &Variants, keys: &sdpa_core::KeyBand) -> Band {
    match variants.window {
        Some(_) if shape.sq > 0 => {
            // A window bounds the keys per row: judge it as attention over that many keys.
            let per_row = (keys.pairs(shape.sq, shape.sk) as f64 / shape.sq as f64).ceil() as usize;
            let mut b = band_for(&Shape { sk: per_row.max(1), ..*shape });
            b.label = format!("{}, at the window's {per_row} keys per row on average", b.label);
            b
        }
        _ => band_for(shape),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The model of a dense forward call of 10 µs with no device.
    fn fwd(s: &Shape, mask: &MaskInfo, v: &Variants, dtype: &str) -> Perf {
        model(s, mask, v, Some(dtype), Phase::Fwd, 10.0, None, None, None).unwrap()
    }

    #[test]
    fn causal_flops_are_exact_and_dtype_sets_bytes() {
        let s = Shape::new(2, 8, 1024, 1024, 64);
        let p = fwd(&s, &MaskInfo::CausalTopLeft, &Variants::default(), "c10::BFloat16");
        // 2 * B*H * S(S+1)/2 * (D + Dv)
        assert_eq!(p.flops, 2.0 * 16.0 * (1024.0 * 1025.0 / 2.0) * 128.0);
        assert_eq!(p.bytes, 4.0 * 2.0 * 8.0 * 1024.0 * 64.0 * 2.0);
        let f32p = fwd(&s, &MaskInfo::None, &Variants::default(), "float");
        assert_eq!(f32p.bytes, 2.0 * p.bytes, "fp32 moves 4-byte elements");
        // Sq != Sk with causal does not fail (TraceLens drops such ops).
        let r = Shape { sq: 100, ..s };
        assert!(model(
            &r,
            &MaskInfo::CausalBottomRight,
            &Variants::default(),
            Some("c10::Half"),
            Phase::Fwd,
            1.0,
            None,
            None,
            None
        )
        .is_some());
    }

    #[test]
    fn an_fp8_cache_counts_one_byte_per_key_and_value() {
        // GQA decode: B = 4, 32/8 heads, D = 128, 4096 cached tokens; K/V are 8 heads, not 32.
        let s = Shape { b: 4, hq: 32, hkv: 8, sq: 1, sk: 4096, d: 128, dv: 128 };
        let v = Variants::default();
        let bf16 = model(&s, &MaskInfo::None, &v, Some("c10::BFloat16"), Phase::Fwd, 50.0, None, None, None).unwrap();
        let kv = 4.0 * 8.0 * 4096.0 * 256.0;
        let q_o = 4.0 * 32.0 * 256.0;
        assert_eq!(bf16.bytes, (kv + q_o) * 2.0);
        let fp8 = model(&s, &MaskInfo::None, &v, Some("c10::BFloat16"), Phase::Fwd, 50.0, None, None, Some("fp8_e4m3"))
            .unwrap();
        assert_eq!(fp8.bytes, kv + q_o * 2.0, "keys and values at one byte, Q and O at two");
    }

    #[test]
    fn windows_are_costed_on_the_pairs_they_leave() {
        // Causal window of 256 keys back at S = 2048: row i sees min(i + 1, 257) keys.
        let s = Shape { b: 1, hq: 8, hkv: 4, sq: 2048, sk: 2048, d: 128, dv: 128 };
        let v = Variants {
            window: Some(sdpa_core::Window::left(256)),
            diagonal: Some(sdpa_core::Diagonal::TopLeft),
            ..Variants::default()
        };
        let pairs = 257.0 * 2048.0 - 256.0 * 257.0 / 2.0;
        let p = fwd(&s, &MaskInfo::CausalTopLeft, &v, "c10::BFloat16");
        assert_eq!(p.flops, 2.0 * 8.0 * pairs * 256.0);
        let full = fwd(&s, &MaskInfo::CausalTopLeft, &Variants::default(), "c10::BFloat16");
        assert!(full.flops > 3.5 * p.flops, "the window leaves about a quarter of causal's work");
        assert!(p.band.label.contains("241 keys per row"), "{}", p.band.label);
        // A softcap alone changes nothing the model counts.
        let cap = Variants { softcap: Some(50.0), ..Variants::default() };
        let c = model(&s, &MaskInfo::None, &cap, Some("c10::BFloat16"), Phase::Bwd, 10.0, None, None, None).unwrap();
        assert_eq!(c.flops, 2.5 * 2.0 * 8.0 * 2048.0 * 2048.0 * 256.0);
    }

    #[test]
    fn decoding_is_judged_by_bandwidth() {
        let hw = HardwareSpec::find("h100-sxm");
        let s = Shape { b: 8, hq: 32, hkv: 32, sq: 1, sk: 4096, d: 128, dv: 128 };
        // ANCHORS: cuDNN decodes this shape in 190 µs, 2.8 TB/s.
        let p =
            model(&s, &MaskInfo::None, &Variants::default(), Some("c10::BFloat16"), Phase::Fwd, 190.0, hw, None, None)
                .unwrap();
        assert_eq!(p.bound, Some(Bound::Memory));
        assert!((p.tbps - 2.83).abs() < 0.05, "{}", p.tbps);
        assert_eq!(p.band_status, Some("within"));
    }
}
