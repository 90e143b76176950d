//! x86-64 tokens: AVX-512 and AVX2 + FMA, and the `#[target_feature]` entries that instantiate kernels.

use super::{Simd, SimdKernel};
use std::arch::x86_64::*;

pub(crate) fn avx512_supported() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512dq")
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
}

pub(crate) fn avx512bf16_supported() -> bool {
    is_x86_feature_detected!("avx512bf16")
}

/// Whether the CPU's vendor string (CPUID leaf 0) is Intel's.
pub(crate) fn intel() -> bool {
    // SAFETY: CPUID leaf 0 exists on every x86-64 CPU.
    #[allow(unused_unsafe)]
    let r = unsafe { std::arch::x86_64::__cpuid(0) };
    // The vendor string's 12 bytes, in EBX, EDX, ECX order.
    [r.ebx, r.edx, r.ecx] == [*b"Genu", *b"ineI", *b"ntel"].map(u32::from_le_bytes)
}

/// AVX2 and FMA, and F16C (f16 K/V tiles widened in vectors), which every CPU with AVX2 also has.
pub(crate) fn avx2_supported() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

/// Token proving the CPU runs AVX-512 F/VL/BW/DQ; built only by [`run_avx512`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx512(());

impl Avx512 {
    /// The token, for code that already runs under `#[target_feature(enable = "avx512f,...")]`.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F/VL/BW/DQ, AVX2 and FMA.
    #[inline(always)]
    pub(crate) unsafe fn new_unchecked() -> Avx512 {
        Avx512(())
    }
}

/// Token proving the CPU runs AVX2, FMA and F16C; built only by [`run_avx2`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx2(());

/// Runs `k` with AVX-512 code generation.
///
/// # Safety
/// The CPU must support AVX-512 F/VL/BW/DQ, AVX2 and FMA ([`avx512_supported`]).
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")]
pub(crate) unsafe fn run_avx512<K: SimdKernel>(k: K) -> K::Output {
    k.run(Avx512(()))
}

/// Runs `k` with AVX2 + FMA (+ F16C) code generation.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C ([`avx2_supported`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn run_avx2<K: SimdKernel>(k: K) -> K::Output {
    k.run(Avx2(()))
}

// Taylor coefficients of 2^f = e^(f ln 2) on f in [-0.5, 0.5]; degree 6 leaves a relative error of about
// 1.2e-7, two f32 ulps.
const C1: f32 = std::f32::consts::LN_2;
const C2: f32 = 0.240_226_5;
const C3: f32 = 0.055_504_11;
const C4: f32 = 0.009_618_129;
const C5: f32 = 0.001_333_355_8;
const C6: f32 = 0.000_154_035_3;
const LOG2E: f32 = std::f32::consts::LOG2_E;

/// `2^f` for the fraction `f` in [-1/2, 1/2] (degree 6, the coefficients above), 16 lanes.
/// # Safety
/// AVX-512 F and FMA (the token's features; inlined into its kernels).
#[inline(always)]
unsafe fn exp2_fraction_512(f: __m512) -> __m512 {
    // SAFETY: register-only arithmetic under the caller's features.
    unsafe {
        let mut p = _mm512_set1_ps(C6);
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(C5));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(C4));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(C3));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(C2));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(C1));
        _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0))
    }
}

/// [`exp2_fraction_512`] on 8 lanes.
/// # Safety
/// AVX and FMA (the token's features; inlined into its kernels).
#[inline(always)]
unsafe fn exp2_fraction_256(f: __m256) -> __m256 {
    // SAFETY: register-only arithmetic under the caller's features.
    unsafe {
        let mut p = _mm256_set1_ps(C6);
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(C5));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(C4));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(C3));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(C2));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(C1));
        _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0))
    }
}

/// `2^t` for `t <= 0` (or -inf, or NaN), 8 lanes, the fraction by [`exp2_short_fraction_256`] when `SHORT`,
/// else by [`exp2_fraction_256`] (a const parameter, not a function argument, so both stay inlined): `t` is
/// clamped to [-127, 0], so no upper clamp, and rounded by one add of ROUND_BIAS = 1.5·2^23 + 127: the sum's
/// low mantissa bits hold n + 127 (0..=127), which a shift moves into the exponent field (the bits above it
/// shift out), giving 2^n, or exactly 0 at n = -127; subtracting the bias again gives n itself. Two operations
/// fewer than `exp`'s general rounding.
/// # Safety
/// AVX2 and FMA (the token's features; inlined into its kernels).
#[inline(always)]
unsafe fn pow2_nonpositive_256<const SHORT: bool>(t: __m256) -> __m256 {
    // SAFETY: register-only arithmetic under the caller's features.
    unsafe {
        const ROUND_BIAS: f32 = 12_583_039.0;
        let t = _mm256_max_ps(_mm256_set1_ps(-127.0), t);
        let y = _mm256_add_ps(t, _mm256_set1_ps(ROUND_BIAS));
        let n = _mm256_sub_ps(y, _mm256_set1_ps(ROUND_BIAS));
        let scale = _mm256_slli_epi32::<23>(_mm256_castps_si256(y));
        let f = _mm256_sub_ps(t, n);
        let p = if SHORT { exp2_short_fraction_256(f) } else { exp2_fraction_256(f) };
        _mm256_mul_ps(p, _mm256_castsi256_ps(scale))
    }
}

// Degree-4 coefficients of 2^f on [-1/2, 1/2] with the constant term held at 1 (so an exponent of exactly
// 0, the row maximum's when the caller forms x - max first, gives exactly 1), fitted by iterated weighted
// least squares on the relative error: about 3e-6, where the degree-6 ones above reach 1.2e-7, for two FMAs
// fewer.
const E1: f32 = 0.693_124_2;
const E2: f32 = 0.240_241;
const E3: f32 = 0.055_906_43;
const E4: f32 = 0.009_582_851;

/// `2^t` for `t <= 0` to about 3e-6 relative (the degree-4 fraction above, `vscalefps` for the integer
/// part), 16 lanes: lanes below -150 (masked keys: -inf) give exactly 0; NaN passes through. Shared by the
/// AMX kernel and [`Simd::exp2_short_nonpositive`].
///
/// # Safety
/// AVX-512 F (the caller's features).
#[inline(always)]
pub(crate) unsafe fn exp2_short_512(t: __m512) -> __m512 {
    // SAFETY: register-only arithmetic under the caller's features.
    unsafe {
        // The constant goes first so a NaN `t` passes through; -inf becomes -150, which scalef takes to 0.
        let t = _mm512_max_ps(_mm512_set1_ps(-150.0), t);
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
        _mm512_scalef_ps(exp2_short_fraction_512(_mm512_sub_ps(t, n)), n)
    }
}

/// `2^f` for `f` in [-1/2, 1/2] to about 3e-6 relative (degree 4, the coefficients above), 16 lanes.
/// # Safety
/// AVX-512 F and FMA (the caller's features).
#[inline(always)]
unsafe fn exp2_short_fraction_512(f: __m512) -> __m512 {
    // SAFETY: register-only arithmetic under the caller's features.
    unsafe {
        let p = _mm512_fmadd_ps(_mm512_set1_ps(E4), f, _mm512_set1_ps(E3));
        let p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(E2));
        let p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(E1));
        _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0))
    }
}

/// [`exp2_short_fraction_512`] on 8 lanes.
/// # Safety
/// AVX and FMA (the caller's features).
#[inline(always)]
unsafe fn exp2_short_fraction_256(f: __m256) -> __m256 {
    // SAFETY: register-only arithmetic under the caller's features.
    unsafe {
        let p = _mm256_fmadd_ps(_mm256_set1_ps(E4), f, _mm256_set1_ps(E3));
        let p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(E2));
        let p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(E1));
        _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0))
    }
}

// SAFETY (for every `unsafe` block in the two impls below): the token types are only constructed inside
// `run_avx512` / `run_avx2`, which are only called after the matching `*_supported()` check, so the
// intrinsics' target features are present; pointer validity is the caller's contract on the `unsafe fn`s.
impl Simd for Avx512 {
    const LANES: usize = 16;
    const QK_KEYS: usize = 12;
    const QK_QVECS: usize = 2;
    const PV_ROWS: usize = 8;
    const PV_VECS: usize = 2;
    type V = __m512;

    #[inline(always)]
    fn zero(self) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    fn splat(self, x: f32) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> __m512 {
        // SAFETY: 16 readable f32 at `p` (caller), feature present (token).
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load_part(self, p: *const f32, n: usize) -> __m512 {
        let m = ((1u32 << n.min(16)) - 1) as u16;
        // SAFETY: masked-off lanes are not accessed; `n` readable f32 at `p` (caller).
        unsafe { _mm512_maskz_loadu_ps(m, p) }
    }
    #[inline(always)]
    unsafe fn load_bf16(self, p: *const u16) -> __m512 {
        // SAFETY: 16 readable u16 at `p` (caller).
        unsafe { _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast())))) }
    }
    #[inline(always)]
    unsafe fn load_bf16_part(self, p: *const u16, n: usize) -> __m512 {
        let m = ((1u32 << n.min(16)) - 1) as u16;
        // SAFETY: masked-off lanes are not accessed (AVX-512 BW/VL); `n` readable u16 at `p` (caller).
        unsafe {
            let w = _mm256_maskz_loadu_epi16(m, p.cast());
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(w)))
        }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: __m512) {
        // SAFETY: 16 writable f32 at `p` (caller).
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    fn fma(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn mul(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    fn add(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    fn sub(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    fn max(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl comment. `vmaxps` returns its second operand when either is NaN.
        unsafe { _mm512_max_ps(a, b) }
    }
    #[inline(always)]
    fn min(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl comment. `vminps` returns its second operand when either is NaN.
        unsafe { _mm512_min_ps(a, b) }
    }
    #[inline(always)]
    fn all_lt(self, a: __m512, b: __m512) -> bool {
        // SAFETY: see the impl comment.
        unsafe { _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b) == 0xFFFF }
    }
    #[inline(always)]
    fn recip(self, x: __m512) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe {
            // 14-bit estimate; r(2 − x·r) squares its relative error (about 2^-28, below an f32 ulp).
            let r = _mm512_rcp14_ps(x);
            _mm512_mul_ps(r, _mm512_fnmadd_ps(x, r, _mm512_set1_ps(2.0)))
        }
    }
    #[inline(always)]
    fn select_lt(self, a: __m512, b: __m512, x: __m512, y: __m512) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe {
            let lt = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b);
            _mm512_mask_blend_ps(lt, y, x)
        }
    }
    #[inline(always)]
    fn exp(self, x: __m512) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe {
            let t = _mm512_mul_ps(x, _mm512_set1_ps(LOG2E));
            // Clamp keeps scalef exact; the constant goes first so a NaN `t` passes through.
            let t = _mm512_max_ps(_mm512_set1_ps(-150.0), t);
            let t = _mm512_min_ps(_mm512_set1_ps(128.0), t);
            let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
            let f = _mm512_sub_ps(t, n);
            // p * 2^n, rounding to 0 below the denormal range (2^-150 -> 0).
            _mm512_scalef_ps(exp2_fraction_512(f), n)
        }
    }
    #[inline(always)]
    fn exp_nonpositive(self, x: __m512) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe {
            // As `exp` without the upper clamp: x <= 0 keeps t <= 0.
            let t = _mm512_mul_ps(x, _mm512_set1_ps(LOG2E));
            let t = _mm512_max_ps(_mm512_set1_ps(-150.0), t);
            let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
            let f = _mm512_sub_ps(t, n);
            _mm512_scalef_ps(exp2_fraction_512(f), n)
        }
    }
    #[inline(always)]
    fn exp2_short_nonpositive(self, t: __m512) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe { exp2_short_512(t) }
    }
    #[inline(always)]
    fn neg_inf_to_zero(self, v: __m512) -> __m512 {
        // SAFETY: see the impl comment.
        unsafe {
            let is_ninf = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(v, _mm512_set1_ps(f32::NEG_INFINITY));
            _mm512_mask_blend_ps(is_ninf, v, _mm512_setzero_ps())
        }
    }
    #[inline(always)]
    fn reduce_sum(self, v: __m512) -> f32 {
        // SAFETY: see the impl comment.
        unsafe { _mm512_reduce_add_ps(v) }
    }
    #[inline(always)]
    fn reduce_max(self, v: __m512) -> f32 {
        // SAFETY: see the impl comment.
        unsafe { _mm512_reduce_max_ps(v) }
    }
    #[inline(always)]
    unsafe fn widen_bf16(self, src: *const u16, dst: *mut f32, n: usize) {
        let full = n / 16 * 16;
        // SAFETY: `n` values at `src` and `dst` (caller); vectors cover i..i+16 <= full <= n, and the masked
        // tail touches only lanes below n - full.
        unsafe {
            let mut i = 0;
            while i < full {
                let w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(src.add(i).cast()));
                _mm512_storeu_ps(dst.add(i), _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w)));
                i += 16;
            }
            if full < n {
                // The last n - full values in one masked load and store (AVX-512 BW and VL): element by
                // element, a 40-column V row's last 8 took a tenth of a bf16 call at D = 40 (widened row by
                // row into the 48-column tile).
                let k: __mmask16 = (1u32 << (n - full)) as u16 - 1;
                let w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, src.add(full).cast()));
                _mm512_mask_storeu_ps(dst.add(full), k, _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w)));
            }
        }
    }
    #[inline(always)]
    unsafe fn widen_f16(self, src: *const u16, dst: *mut f32, n: usize) {
        let full = n / 16 * 16;
        // SAFETY: as `widen_bf16`.
        unsafe {
            let mut i = 0;
            while i < full {
                _mm512_storeu_ps(dst.add(i), _mm512_cvtph_ps(_mm256_loadu_si256(src.add(i).cast())));
                i += 16;
            }
            if full < n {
                let k: __mmask16 = (1u32 << (n - full)) as u16 - 1;
                let h = _mm256_maskz_loadu_epi16(k, src.add(full).cast());
                _mm512_mask_storeu_ps(dst.add(full), k, _mm512_cvtph_ps(h));
            }
        }
    }
}

// AVX2's tiles fit 16 ymm registers: scores 6 keys x 2 query vectors (12 accumulators, 2 Q vectors, 1
// broadcast) and P·V 6 rows x 2 value vectors (12 accumulators, 2 V vectors, 1 broadcast). Twelve chains
// cover the FMA latency on two units; 4 x 3 tiles (16 registers with no spare) spilled and ran 30 % slower,
// and the 4-row P·V tile (8 chains) ran a few percent slower (bench/studies/cpu-avx2/).
impl Simd for Avx2 {
    const LANES: usize = 8;
    const QK_KEYS: usize = 6;
    const QK_QVECS: usize = 2;
    const PV_ROWS: usize = 6;
    const PV_VECS: usize = 2;
    // Its P·V tile reads one 64-byte line of each V row per key; rows 512 bytes apart (D = 128, 256) read in
    // place ran 3-5 % under D ± 8 on Zen 4, and 3 % faster from the copy (bench/results/cpu/avx2.md).
    const PV_COPIES_ALIASED_V: bool = true;
    type V = __m256;

    #[inline(always)]
    fn zero(self) -> __m256 {
        // SAFETY: see the impl comment.
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    fn splat(self, x: f32) -> __m256 {
        // SAFETY: see the impl comment.
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> __m256 {
        // SAFETY: 8 readable f32 at `p` (caller).
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load_part(self, p: *const f32, n: usize) -> __m256 {
        // SAFETY: lanes whose mask is clear are not accessed; `n` readable f32 at `p` (caller).
        unsafe {
            let m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            _mm256_maskload_ps(p, m)
        }
    }
    #[inline(always)]
    unsafe fn load_bf16(self, p: *const u16) -> __m256 {
        // SAFETY: 8 readable u16 at `p` (caller).
        unsafe { _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast())))) }
    }
    #[inline(always)]
    unsafe fn load_bf16_part(self, p: *const u16, n: usize) -> __m256 {
        let mut tmp = [0u16; 8];
        // SAFETY: `n < 8` readable u16 at `p` (caller); `tmp` holds 8.
        unsafe {
            std::ptr::copy_nonoverlapping(p, tmp.as_mut_ptr(), n.min(8));
            self.load_bf16(tmp.as_ptr())
        }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: __m256) {
        // SAFETY: 8 writable f32 at `p` (caller).
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    fn fma(self, a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: see the impl comment.
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn mul(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: see the impl comment.
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    fn add(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: see the impl comment.
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    fn sub(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: see the impl comment.
        unsafe { _mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    fn max(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: see the impl comment. `vmaxps` returns its second operand when either is NaN.
        unsafe { _mm256_max_ps(a, b) }
    }
    #[inline(always)]
    fn min(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: see the impl comment. `vminps` returns its second operand when either is NaN.
        unsafe { _mm256_min_ps(a, b) }
    }
    #[inline(always)]
    fn all_lt(self, a: __m256, b: __m256) -> bool {
        // SAFETY: see the impl comment.
        unsafe { _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(a, b)) == 0xFF }
    }
    #[inline(always)]
    fn recip(self, x: __m256) -> __m256 {
        // SAFETY: see the impl comment.
        unsafe {
            // 12-bit estimate; r(2 − x·r) squares its relative error (about 2^-23, an f32 ulp or two).
            let r = _mm256_rcp_ps(x);
            _mm256_mul_ps(r, _mm256_fnmadd_ps(x, r, _mm256_set1_ps(2.0)))
        }
    }
    #[inline(always)]
    fn select_lt(self, a: __m256, b: __m256, x: __m256, y: __m256) -> __m256 {
        // SAFETY: see the impl comment.
        unsafe { _mm256_blendv_ps(y, x, _mm256_cmp_ps::<_CMP_LT_OQ>(a, b)) }
    }
    #[inline(always)]
    fn exp(self, x: __m256) -> __m256 {
        // SAFETY: see the impl comment.
        unsafe {
            let t = _mm256_mul_ps(x, _mm256_set1_ps(LOG2E));
            // Below -127 the result is exactly 0 (a zero exponent field); NaN passes through the clamps.
            let t = _mm256_max_ps(_mm256_set1_ps(-127.0), t);
            let t = _mm256_min_ps(_mm256_set1_ps(127.0), t);
            let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
            let f = _mm256_sub_ps(t, n);
            let p = exp2_fraction_256(f);
            let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)));
            _mm256_mul_ps(p, _mm256_castsi256_ps(bits))
        }
    }
    #[inline(always)]
    fn exp_nonpositive(self, x: __m256) -> __m256 {
        // SAFETY: see the impl comment.
        unsafe { pow2_nonpositive_256::<false>(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E))) }
    }
    #[inline(always)]
    fn exp2_short_nonpositive(self, t: __m256) -> __m256 {
        // SAFETY: see the impl comment.
        unsafe { pow2_nonpositive_256::<true>(t) }
    }
    #[inline(always)]
    fn neg_inf_to_zero(self, v: __m256) -> __m256 {
        // SAFETY: see the impl comment.
        unsafe {
            let is_ninf = _mm256_cmp_ps::<_CMP_EQ_OQ>(v, _mm256_set1_ps(f32::NEG_INFINITY));
            _mm256_blendv_ps(v, _mm256_setzero_ps(), is_ninf)
        }
    }
    #[inline(always)]
    fn reduce_sum(self, v: __m256) -> f32 {
        // SAFETY: see the impl comment.
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }
    }
    #[inline(always)]
    unsafe fn widen_bf16(self, src: *const u16, dst: *mut f32, n: usize) {
        let full = n / 8 * 8;
        // SAFETY: `n` values at `src` and `dst` (caller); vectors cover i..i+8 <= full <= n.
        unsafe {
            let mut i = 0;
            while i < full {
                let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(src.add(i).cast()));
                _mm256_storeu_ps(dst.add(i), _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w)));
                i += 8;
            }
            for i in full..n {
                *dst.add(i) = f32::from_bits((*src.add(i) as u32) << 16);
            }
        }
    }
    #[inline(always)]
    unsafe fn widen_f16(self, src: *const u16, dst: *mut f32, n: usize) {
        let full = n / 8 * 8;
        // SAFETY: as `widen_bf16` (F16C is part of the AVX2 path's features).
        unsafe {
            let mut i = 0;
            while i < full {
                _mm256_storeu_ps(dst.add(i), _mm256_cvtph_ps(_mm_loadu_si128(src.add(i).cast())));
                i += 8;
            }
            for i in full..n {
                *dst.add(i) = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(*src.add(i) as i32)));
            }
        }
    }
    #[inline(always)]
    fn reduce_max(self, v: __m256) -> f32 {
        // SAFETY: see the impl comment.
        unsafe {
            let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_max_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }
    }
}
