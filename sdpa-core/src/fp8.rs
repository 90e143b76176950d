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
    let round_half_even =
        |keep: u32, rem: u32, half: u32| keep + u32::from(rem > half || (rem == half && keep & 1 == 1));
    let code = if a < 2f32.powi(-6) {
        // Subnormal range: a multiple of 2⁻⁹ (exact in f32: a power-of-two scaling), rounded to an integer
        // 0..=8 (8 is the smallest normal, whose code is 8 as well).
        let units = a * 512.0;
        let n = units.trunc();
        let rem = units - n;
        let n = n as u32;
        if rem > 0.5 || (rem == 0.5 && n & 1 == 1) {
            n + 1
        } else {
            n
        }
    } else {
        // Normal: exponent -6..=8, the 23-bit mantissa rounded to 3 bits; a carry moves into the exponent.
        let bits = a.to_bits();
        let exp = (bits >> 23) as i32 - 127;
        let mant = bits & 0x7f_ffff;
        (((exp + 7) as u32) << 3) + round_half_even(mant >> 20, mant & 0xf_ffff, 0x8_0000)
    };
    sign | code.min(0x7e) as u8
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

    /// The factors of the random inputs the CLI, the benchmarks and the tests generate when none is given:
    /// the draws (uniform, |x| < sqrt(3), unit variance) spread over the whole E4M3 range (`for_amax(sqrt(3))`
    /// for each tensor), as a per-tensor quantizer would store them.
    pub fn for_random_inputs() -> Self {
        Descale::uniform(Descale::for_amax(3f32.sqrt()))
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

    /// The bit-level encoder against the definition (the nearest code by value, ties to the even code) on
    /// every code, every midpoint between neighbours, and points just either side of them.
    #[test]
    fn encoding_is_the_nearest_code_ties_to_even() {
        let nearest = |x: f32| -> u8 {
            let a = x.abs().min(E4M3_MAX);
            let best = (0u8..=0x7e)
                .min_by(|&p, &q| {
                    let (dp, dq) = ((e4m3_to_f32(p) - a).abs(), (e4m3_to_f32(q) - a).abs());
                    dp.total_cmp(&dq).then((p % 2).cmp(&(q % 2)))
                })
                .unwrap_or(0);
            best | if x.is_sign_negative() { 0x80 } else { 0 }
        };
        let mut xs = Vec::new();
        for c in 0..0x7eu8 {
            let (lo, hi) = (e4m3_to_f32(c), e4m3_to_f32(c + 1));
            let mid = (lo + hi) / 2.0;
            xs.extend([lo, mid, mid * (1.0 + 1e-6), mid * (1.0 - 1e-6) + 1e-12, hi]);
        }
        xs.extend([447.9, 448.0, 500.0, 1e-30, 0.0]);
        for x in xs.iter().flat_map(|&x| [x, -x]) {
            assert_eq!(f32_to_e4m3(x), nearest(x), "{x:e}");
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
