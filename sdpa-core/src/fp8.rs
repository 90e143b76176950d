//! FP8 E4M3 (the OCP `e4m3fn` format that Hopper's `wgmma` and `cvt` take): exact decoding of all 256 codes,
//! round-to-nearest-even encoding with saturation, and the per-tensor descale factors of an FP8 call.
//!
//! Layout of a code: sign bit, 4 exponent bits (bias 7), 3 mantissa bits. Exponent 0 is subnormal
//! (`m/8 · 2⁻⁶`); `S.1111.111` is NaN; there are no infinities, so the largest finite value is
//! `1.75 · 2⁸ = 448`. Encoding saturates finite values to ±448 (PTX `cvt.rn.satfinite.e4m3x2.f32`, which
//! the kernels use) and keeps NaN.

use crate::error::{Result, SdpaError};
use serde::{Deserialize, Serialize};

/// The largest finite E4M3 value.
pub const E4M3_MAX: f32 = 448.0;

/// The canonical NaN code (positive sign).
pub const E4M3_NAN: u8 = 0x7f;

/// The exact value of an E4M3 code (NaN for `0x7f` and `0xff`).
pub fn e4m3_to_f32(code: u8) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = i32::from((code >> 3) & 0xf);
    let man = f32::from(code & 0x7);
    if exp == 0xf && man == 7.0 {
        return f32::NAN;
    }
    // Every value is a multiple of 2⁻⁹ below 2⁹: exact in f32.
    let mag = if exp == 0 { man / 8.0 * (-6f32).exp2() } else { (1.0 + man / 8.0) * ((exp - 7) as f32).exp2() };
    sign * mag
}

/// The E4M3 code nearest to `x` (ties to the even code), finite values past ±448 saturated to ±448,
/// NaN to [`E4M3_NAN`]; infinities saturate too (E4M3 has none), as `satfinite` does.
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return E4M3_NAN;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    if a >= E4M3_MAX {
        return sign | 0x7e;
    }
    // Positive codes 0x00..=0x7e increase with their value: find the neighbours and round.
    let (mut lo, mut hi) = (0u8, 0x7eu8);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if e4m3_to_f32(mid) <= a {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let (vl, vh) = (e4m3_to_f32(lo), e4m3_to_f32(hi));
    let code = if a - vl < vh - a || (a - vl == vh - a && lo % 2 == 0) { lo } else { hi };
    sign | code
}

/// Per-tensor f32 descale factors of an FP8 call: the value an element stands for is its stored E4M3
/// value times its tensor's factor (`q = stored_q · q`, likewise K and V), as FlashAttention-3 and
/// PyTorch's scaled FP8 matmuls define them. A backend folds Q's and K's into the softmax scale and V's into
/// the final scale of O.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Descale {
    /// Factor of Q.
    pub q: f32,
    /// Factor of K.
    pub k: f32,
    /// Factor of V.
    pub v: f32,
}

impl Default for Descale {
    fn default() -> Self {
        Descale { q: 1.0, k: 1.0, v: 1.0 }
    }
}

impl Descale {
    /// The same factor for Q, K and V.
    pub const fn uniform(x: f32) -> Self {
        Descale { q: x, k: x, v: x }
    }

    /// The factor that maps data of absolute maximum `amax` onto the whole E4M3 range (`amax / 448`), as a
    /// per-tensor quantizer picks it; 1 for an all-zero or non-finite `amax`.
    pub fn for_amax(amax: f32) -> f32 {
        if amax.is_finite() && amax > 0.0 {
            amax / E4M3_MAX
        } else {
            1.0
        }
    }

    /// Checks that every factor is finite and positive.
    pub fn validate(&self) -> Result<()> {
        for (name, x) in [("q", self.q), ("k", self.k), ("v", self.v)] {
            if !(x.is_finite() && x > 0.0) {
                return Err(SdpaError::invalid(format!(
                    "the {name} descale factor must be finite and positive, got {x}"
                )));
            }
        }
        Ok(())
    }
}

impl std::str::FromStr for Descale {
    type Err = String;
    /// `x` (one factor for all three) or `q,k,v`.
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        let parse = |t: &str| t.trim().parse::<f32>().map_err(|e| format!("bad descale factor `{t}`: {e}"));
        let parts: Vec<&str> = s.split(',').collect();
        let d = match parts.as_slice() {
            [x] => Descale::uniform(parse(x)?),
            [q, k, v] => Descale { q: parse(q)?, k: parse(k)?, v: parse(v)? },
            _ => return Err(format!("descale `{s}`: expected one factor or three (q,k,v)")),
        };
        d.validate().map_err(|e| e.to_string())?;
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code against a decoding written independently (from the bit fields through integer arithmetic
    /// in f64), NaN at exactly the two NaN codes.
    #[test]
    fn every_code_decodes_exactly() {
        for code in 0..=255u8 {
            let x = e4m3_to_f32(code);
            let (s, e, m) = (code >> 7, (code >> 3) & 15, code & 7);
            if e == 15 && m == 7 {
                assert!(x.is_nan(), "code {code:#04x}");
                continue;
            }
            // value = (-1)^s · (e == 0 ? m : 8 + m) · 2^(max(e, 1) - 10), an integer times a power of two.
            let int = if e == 0 { f64::from(m) } else { f64::from(8 + m) };
            let want = if s == 1 { -1.0 } else { 1.0 } * int * 2f64.powi(i32::from(e.max(1)) - 10);
            assert_eq!(f64::from(x), want, "code {code:#04x}");
        }
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x80), 0.0);
        assert!(e4m3_to_f32(0x80).is_sign_negative());
    }

    #[test]
    fn every_finite_code_round_trips() {
        for code in (0..=255u8).filter(|c| c & 0x7f != 0x7f) {
            assert_eq!(f32_to_e4m3(e4m3_to_f32(code)), code, "code {code:#04x}");
        }
    }

    #[test]
    fn encoding_rounds_to_nearest_even_and_saturates() {
        // 1.0 = 0x38, next 1.125 = 0x39: the midpoint goes to the even code 0x38, just above it to 0x39.
        assert_eq!(f32_to_e4m3(1.0625), 0x38);
        assert_eq!(f32_to_e4m3(1.0626), 0x39);
        // 1.125 (0x39) and 1.25 (0x3a): the midpoint goes up to the even 0x3a.
        assert_eq!(f32_to_e4m3(1.1875), 0x3a);
        assert_eq!(f32_to_e4m3(1e6), 0x7e);
        assert_eq!(f32_to_e4m3(-1e6), 0xfe);
        assert_eq!(f32_to_e4m3(f32::INFINITY), 0x7e);
        assert_eq!(f32_to_e4m3(f32::NAN), E4M3_NAN);
        // Below half the smallest subnormal: zero; just above: the smallest subnormal.
        assert_eq!(f32_to_e4m3(2f32.powi(-11)), 0x00);
        assert_eq!(f32_to_e4m3(2f32.powi(-10) * 1.01), 0x01);
        // The error of a normal value is at most half a step: 2⁻⁴ relative.
        for i in 1..1000 {
            let x = i as f32 * 0.37;
            let y = e4m3_to_f32(f32_to_e4m3(x));
            assert!(((y - x) / x).abs() <= 0.0625 + 1e-7 || x > 448.0, "{x} -> {y}");
        }
    }

    #[test]
    fn descales_parse_and_refuse_nonsense() {
        assert_eq!("0.5".parse::<Descale>().unwrap(), Descale::uniform(0.5));
        assert_eq!("1,2,3".parse::<Descale>().unwrap(), Descale { q: 1.0, k: 2.0, v: 3.0 });
        assert!("0".parse::<Descale>().is_err());
        assert!("1,2".parse::<Descale>().is_err());
        assert!("nan".parse::<Descale>().is_err());
        assert_eq!(Descale::for_amax(448.0), 1.0);
        assert_eq!(Descale::for_amax(0.0), 1.0);
    }
}
