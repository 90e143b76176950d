//! The portable fallback: one f32 per "vector", plain Rust arithmetic.

use super::Simd;

/// Token for the scalar path; always available.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scalar;

impl Simd for Scalar {
    const LANES: usize = 1;
    const QK_KEYS: usize = 4;
    const QK_QVECS: usize = 4;
    const PV_ROWS: usize = 4;
    const PV_VECS: usize = 4;
    type V = f32;

    #[inline(always)]
    fn zero(self) -> f32 {
        0.0
    }
    #[inline(always)]
    fn splat(self, x: f32) -> f32 {
        x
    }
    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> f32 {
        // SAFETY: the caller guarantees one readable f32 at `p`.
        unsafe { *p }
    }
    #[inline(always)]
    unsafe fn load_part(self, p: *const f32, n: usize) -> f32 {
        if n == 0 {
            0.0
        } else {
            // SAFETY: n >= 1 readable values at `p`.
            unsafe { *p }
        }
    }
    #[inline(always)]
    unsafe fn load_bf16(self, p: *const u16) -> f32 {
        // SAFETY: the caller guarantees one readable u16 at `p`.
        f32::from_bits((unsafe { *p } as u32) << 16)
    }
    #[inline(always)]
    unsafe fn load_bf16_part(self, p: *const u16, n: usize) -> f32 {
        if n == 0 {
            0.0
        } else {
            // SAFETY: n >= 1 readable values at `p`.
            f32::from_bits((unsafe { *p } as u32) << 16)
        }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: f32) {
        // SAFETY: the caller guarantees one writable f32 at `p`.
        unsafe { *p = v }
    }
    #[inline(always)]
    fn fma(self, a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
    #[inline(always)]
    fn mul(self, a: f32, b: f32) -> f32 {
        a * b
    }
    #[inline(always)]
    fn add(self, a: f32, b: f32) -> f32 {
        a + b
    }
    #[inline(always)]
    fn sub(self, a: f32, b: f32) -> f32 {
        a - b
    }
    #[inline(always)]
    fn max(self, a: f32, b: f32) -> f32 {
        if b.is_nan() || b > a {
            b
        } else {
            a
        }
    }
    #[inline(always)]
    fn min(self, a: f32, b: f32) -> f32 {
        if b.is_nan() || b < a {
            b
        } else {
            a
        }
    }
    #[inline(always)]
    fn all_lt(self, a: f32, b: f32) -> bool {
        a < b
    }
    #[inline(always)]
    fn recip(self, x: f32) -> f32 {
        1.0 / x
    }
    #[inline(always)]
    fn select_lt(self, a: f32, b: f32, x: f32, y: f32) -> f32 {
        if a < b {
            x
        } else {
            y
        }
    }
    #[inline(always)]
    fn exp(self, x: f32) -> f32 {
        x.exp()
    }
    #[inline(always)]
    fn exp2_short_nonpositive(self, t: f32) -> f32 {
        t.exp2()
    }
    #[inline(always)]
    fn neg_inf_to_zero(self, v: f32) -> f32 {
        if v == f32::NEG_INFINITY {
            0.0
        } else {
            v
        }
    }
    #[inline(always)]
    fn reduce_sum(self, v: f32) -> f32 {
        v
    }
    #[inline(always)]
    fn reduce_max(self, v: f32) -> f32 {
        v
    }
}
