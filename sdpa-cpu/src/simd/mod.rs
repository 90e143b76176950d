//! SIMD paths chosen at run time from the CPU actually present.
//!
//! Every kernel is written once, generic over a [`Simd`] token whose methods are `#[inline(always)]`; a
//! small entry function per path carries `#[target_feature]`, so the generic body is compiled with that
//! path's instructions while the rest of the crate stays a baseline x86-64 (or any other) build. A token
//! is only constructed after the CPU has been checked for its features, which is what makes the
//! `unsafe` intrinsic calls inside the token sound.

pub(crate) mod scalar;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

use std::fmt;
use std::str::FromStr;

/// One way of running the micro-kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SimdPath {
    /// AMX (AMX-TILE, AMX-BF16, the OS's tile-data permission) on top of `Avx512Bf16`: bf16 Q·Kᵀ and P·V
    /// on tiles with `TDPBF16PS`, softmax on AVX-512; other dtypes, paged K/V and decoding items run the
    /// AVX-512 kernels with f32 FMAs, as on `Avx512` (see `amx`).
    Amx,
    /// AVX-512 plus AVX512_BF16: bf16 inputs multiply pairs with `vdpbf16ps` (twice the products per
    /// instruction, P rounded to bf16 before P·V as GPU kernels do); other dtypes run as `Avx512`. Not
    /// chosen on Intel CPUs, where `Avx512` runs bf16 faster (`SimdPath::passed_over`).
    Avx512Bf16,
    /// AVX-512 (F, VL, BW, DQ): 16 f32 lanes, 32 registers, `vscalefps` exp.
    Avx512,
    /// AVX2 + FMA (and F16C): 8 f32 lanes, 16 registers.
    Avx2,
    /// Portable Rust, one lane at a time: correct everywhere, slow.
    Scalar,
}

impl SimdPath {
    /// Every path, fastest first.
    pub const ALL: [SimdPath; 5] =
        [SimdPath::Amx, SimdPath::Avx512Bf16, SimdPath::Avx512, SimdPath::Avx2, SimdPath::Scalar];

    /// Lowercase name as shown by `sdpa devices` and in `device_name()`.
    pub fn name(self) -> &'static str {
        match self {
            SimdPath::Amx => "amx",
            SimdPath::Avx512Bf16 => "avx512-bf16",
            SimdPath::Avx512 => "avx512",
            SimdPath::Avx2 => "avx2",
            SimdPath::Scalar => "scalar",
        }
    }

    /// True when this CPU can run the path.
    pub fn is_supported(self) -> bool {
        match self {
            SimdPath::Scalar => true,
            SimdPath::Amx => crate::amx::status().is_ok(),
            #[cfg(target_arch = "x86_64")]
            SimdPath::Avx512Bf16 => x86::avx512_supported() && x86::avx512bf16_supported(),
            #[cfg(target_arch = "x86_64")]
            SimdPath::Avx512 => x86::avx512_supported(),
            #[cfg(target_arch = "x86_64")]
            SimdPath::Avx2 => x86::avx2_supported(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The fastest path this CPU supports: the first of [`SimdPath::ALL`] that it runs and that
    /// [`SimdPath::passed_over`] does not set aside.
    pub fn detect() -> SimdPath {
        SimdPath::ALL.into_iter().find(|p| p.is_supported() && p.passed_over().is_none()).unwrap_or(SimdPath::Scalar)
    }

    /// Why [`SimdPath::detect`] skips this path on this CPU although the CPU runs it (it can still be forced
    /// with [`SIMD_ENV`]), or `None`.
    ///
    /// `avx512-bf16` on Intel cores: `vdpbf16ps` does twice the products of an f32 FMA per instruction, but
    /// Intel cores issue it at half the FMA's rate, so the products cost the same and the pairs path adds
    /// its packing of P and V. Measured on an Intel Xeon with AVX512_BF16 and AVX512_FP16 but no AMX
    /// (bf16, 2 threads, B = 1, S = 1024..2048, D = 64 and 128, causal and not): `avx512` ran 1.28-1.70x
    /// the GFLOP/s of `avx512-bf16` (`bench/results/cpu/cpu.md`, "bf16 on Intel without AMX"). AMD's
    /// Zen 4, where the pairs path was built and timed, keeps it.
    pub fn passed_over(self) -> Option<&'static str> {
        match self {
            #[cfg(target_arch = "x86_64")]
            SimdPath::Avx512Bf16 if x86::intel() => {
                Some("slower here than avx512: Intel cores issue vdpbf16ps at half the f32 FMA's rate")
            }
            _ => None,
        }
    }

    /// The path the CPU backend runs: [`SIMD_ENV`] (`SDPA_CPU_SIMD=avx2`, ...) when set, so that every path
    /// can be measured on any machine that has it, else the fastest ([`SimdPath::detect`]). A name that is
    /// not a path, or a path this CPU lacks, is an error naming what it has.
    pub fn chosen() -> Result<SimdPath, String> {
        match std::env::var(SIMD_ENV) {
            Err(_) => Ok(SimdPath::detect()),
            Ok(v) if v.trim().is_empty() => Ok(SimdPath::detect()),
            Ok(v) => {
                let path: SimdPath = v.trim().parse().map_err(|e| format!("{SIMD_ENV}: {e}"))?;
                if path.is_supported() {
                    Ok(path)
                } else {
                    let why = match path {
                        SimdPath::Amx => crate::amx::status().err().map(|e| format!(" ({e})")).unwrap_or_default(),
                        _ => String::new(),
                    };
                    Err(format!("{SIMD_ENV}={v}: this CPU has {} only{why}", simd_paths().join(", ")))
                }
            }
        }
    }

    /// Whether [`SIMD_ENV`] chose the path (for `sdpa devices` and records).
    pub fn forced() -> bool {
        std::env::var(SIMD_ENV).is_ok_and(|v| !v.trim().is_empty())
    }
}

/// The environment variable that forces a SIMD path ([`SimdPath::chosen`]).
pub const SIMD_ENV: &str = "SDPA_CPU_SIMD";

impl fmt::Display for SimdPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SimdPath {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "amx" => Ok(SimdPath::Amx),
            "avx512-bf16" | "avx512bf16" => Ok(SimdPath::Avx512Bf16),
            "avx512" | "avx-512" => Ok(SimdPath::Avx512),
            "avx2" => Ok(SimdPath::Avx2),
            "scalar" => Ok(SimdPath::Scalar),
            other => Err(format!("unknown simd path `{other}` (expected amx, avx512-bf16, avx512, avx2 or scalar)")),
        }
    }
}

/// Names of the SIMD paths this CPU supports, fastest first (the scalar fallback is always last).
pub fn simd_paths() -> Vec<&'static str> {
    supported_paths().into_iter().map(SimdPath::name).collect()
}

/// The SIMD paths this CPU supports, fastest first.
pub fn supported_paths() -> Vec<SimdPath> {
    SimdPath::ALL.into_iter().filter(|p| p.is_supported()).collect()
}

/// The vector operations the micro-kernels need. Implementations are zero-sized tokens; all methods are
/// `#[inline(always)]` so they melt into the `#[target_feature]` entry that instantiates the kernel.
///
/// Pointer methods are `unsafe`: the caller guarantees that `LANES` (or `n`) f32 values are readable or
/// writable at the pointer.
pub(crate) trait Simd: Copy + Send + Sync + 'static {
    /// f32 lanes per vector.
    const LANES: usize;
    /// Keys per score micro-tile.
    const QK_KEYS: usize;
    /// Query vectors per score micro-tile (registers: `QK_KEYS * QK_QVECS` accumulators).
    const QK_QVECS: usize;
    /// Rows per P·V micro-tile.
    const PV_ROWS: usize;
    /// Value vectors per P·V micro-tile.
    const PV_VECS: usize;
    /// Whether `fa2` copies f32 V tiles whose rows lie a multiple of 512 bytes apart into its aligned
    /// scratch instead of reading them in place (`fa2::copies_v`).
    const PV_COPIES_ALIASED_V: bool = false;
    /// A vector of `LANES` f32.
    type V: Copy;

    fn zero(self) -> Self::V;
    fn splat(self, x: f32) -> Self::V;
    /// # Safety
    /// `LANES` f32 readable at `p`.
    unsafe fn load(self, p: *const f32) -> Self::V;
    /// Loads `n < LANES` values, the rest zero.
    /// # Safety
    /// `n` f32 readable at `p`.
    unsafe fn load_part(self, p: *const f32, n: usize) -> Self::V;
    /// # Safety
    /// `LANES` f32 writable at `p`.
    unsafe fn store(self, p: *mut f32, v: Self::V);
    fn fma(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    fn mul(self, a: Self::V, b: Self::V) -> Self::V;
    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    fn sub(self, a: Self::V, b: Self::V) -> Self::V;
    /// Lane-wise maximum; where a lane of `b` is NaN the result is NaN.
    fn max(self, a: Self::V, b: Self::V) -> Self::V;
    /// Lane-wise minimum; where a lane of `b` is NaN the result is NaN.
    fn min(self, a: Self::V, b: Self::V) -> Self::V;
    /// Lane-wise `1 / x` for finite `x` of normal range to within about 2 ulps (a hardware estimate and
    /// one Newton step: cheaper than a division); NaN stays NaN.
    fn recip(self, x: Self::V) -> Self::V;
    /// Lane-wise `x` where `a < b`, else `y` (a NaN in `a` or `b` picks `y`).
    fn select_lt(self, a: Self::V, b: Self::V, x: Self::V, y: Self::V) -> Self::V;
    /// True when `a < b` in every lane (false where either is NaN).
    fn all_lt(self, a: Self::V, b: Self::V) -> bool;
    /// `e^x` lane-wise: relative error about 2e-7, exactly 0 for `-inf` and very negative `x`, NaN stays
    /// NaN.
    fn exp(self, x: Self::V) -> Self::V;
    /// [`Simd::exp`] for arguments known to be `<= 0` (or `-inf`, or NaN): the online softmax's
    /// `x - max`. The vector paths skip the upper clamp and round more cheaply there; same accuracy, same
    /// exact 0 for very negative `x`, NaN stays NaN.
    #[inline(always)]
    fn exp_nonpositive(self, x: Self::V) -> Self::V {
        self.exp(x)
    }
    /// `2^t` lane-wise for `t <= 0` (or `-inf`, or NaN), to about 3e-6 relative on the vector paths (a
    /// degree-4 polynomial, two FMAs fewer than [`Simd::exp_nonpositive`]'s): for probabilities whose
    /// products end in a bf16 or f16 output (unit roundoff 2^-8, 2^-11). Exactly 1 at 0, exactly 0 for very
    /// negative `t` and `-inf`, NaN stays NaN. The scalar path is exact (`exp2`).
    fn exp2_short_nonpositive(self, t: Self::V) -> Self::V;
    /// Lanes equal to `-inf` become 0, others pass unchanged (NaN included).
    fn neg_inf_to_zero(self, v: Self::V) -> Self::V;
    /// Sum of the lanes.
    fn reduce_sum(self, v: Self::V) -> f32;
    /// Largest lane (a NaN lane may or may not win; callers treat any NaN alike).
    fn reduce_max(self, v: Self::V) -> f32;

    /// Loads `LANES` bf16 (raw bits) as f32.
    /// # Safety
    /// `LANES` u16 readable at `p`.
    unsafe fn load_bf16(self, p: *const u16) -> Self::V;
    /// Loads `n < LANES` bf16 (raw bits) as f32, the other lanes zero.
    /// # Safety
    /// `n` u16 readable at `p`.
    unsafe fn load_bf16_part(self, p: *const u16, n: usize) -> Self::V;

    /// Widens `n` bf16 (raw bits) to f32: a bf16 is the top half of an f32.
    /// # Safety
    /// `n` u16 readable at `src`, `n` f32 writable at `dst`.
    #[inline(always)]
    unsafe fn widen_bf16(self, src: *const u16, dst: *mut f32, n: usize) {
        for i in 0..n {
            // SAFETY: i < n (caller's extents).
            unsafe { *dst.add(i) = f32::from_bits((*src.add(i) as u32) << 16) };
        }
    }

    /// Widens `n` f16 (raw bits) to f32, exactly.
    /// # Safety
    /// `n` u16 readable at `src`, `n` f32 writable at `dst`.
    #[inline(always)]
    unsafe fn widen_f16(self, src: *const u16, dst: *mut f32, n: usize) {
        for i in 0..n {
            // SAFETY: i < n (caller's extents).
            unsafe { *dst.add(i) = half::f16::from_bits(*src.add(i)).to_f32() };
        }
    }
}

/// A computation generic over the SIMD token (the pulp `WithSimd` pattern): `run` must be
/// `#[inline(always)]` so it is compiled inside the path's `#[target_feature]` entry.
pub(crate) trait SimdKernel {
    type Output;
    fn run<S: Simd>(self, s: S) -> Self::Output;
}

/// Runs `k` on `path`. Falls back to the scalar path when `path` is not supported by this CPU (callers
/// check support first and report it; this keeps the function sound on its own).
pub(crate) fn dispatch<K: SimdKernel>(path: SimdPath, k: K) -> K::Output {
    match path {
        #[cfg(target_arch = "x86_64")]
        SimdPath::Avx512 | SimdPath::Avx512Bf16 | SimdPath::Amx if x86::avx512_supported() => {
            // SAFETY: the CPU supports the features `run_avx512` enables (checked just above).
            unsafe { x86::run_avx512(k) }
        }
        #[cfg(target_arch = "x86_64")]
        SimdPath::Avx2 if x86::avx2_supported() => {
            // SAFETY: the CPU supports AVX2, FMA and F16C (checked just above).
            unsafe { x86::run_avx2(k) }
        }
        _ => k.run(scalar::Scalar),
    }
}

/// Asks the CPU to bring the cache line holding `p` into L2 (`prefetcht1`) ahead of its use: a hint that
/// never faults, whatever the address. No-op off x86-64.
#[inline(always)]
pub(crate) fn prefetch_l2<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        // SSE is part of every x86-64 CPU (newer compilers call the intrinsic safe, hence the allow).
        #[allow(unused_unsafe)]
        // SAFETY: a prefetch accesses no memory architecturally, so any address is sound.
        unsafe {
            _mm_prefetch::<_MM_HINT_T1>(p.cast::<i8>())
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Evaluates `exp` and `exp_nonpositive` lane by lane over `xs` (a multiple of 16 long) on one path.
    struct Exps<'a> {
        xs: &'a [f32],
    }
    impl SimdKernel for Exps<'_> {
        type Output = (Vec<f32>, Vec<f32>, Vec<f32>);
        #[inline(always)]
        fn run<S: Simd>(self, s: S) -> Self::Output {
            let n = self.xs.len();
            let (mut a, mut b, mut c) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
            for i in (0..self.xs.len()).step_by(S::LANES) {
                // SAFETY: i + LANES <= len (the length is a multiple of 16, every path's lanes divide it).
                unsafe {
                    let v = s.load(self.xs.as_ptr().add(i));
                    s.store(a.as_mut_ptr().add(i), s.exp(v));
                    s.store(b.as_mut_ptr().add(i), s.exp_nonpositive(v));
                    // The short exponential in base 2, as the online softmax calls it: (x - max)·log2 e.
                    let t = s.mul(v, s.splat(std::f32::consts::LOG2_E));
                    s.store(c.as_mut_ptr().add(i), s.exp2_short_nonpositive(t));
                }
            }
            (a, b, c)
        }
    }

    /// `detect` takes the first path of `ALL` that runs here and is not passed over, so every path ahead of
    /// it is one or the other; `avx512-bf16` is passed over exactly on Intel CPUs.
    #[test]
    fn detect_takes_the_first_path_not_passed_over() {
        let d = SimdPath::detect();
        assert!(d.is_supported() && d.passed_over().is_none(), "{d}");
        for p in SimdPath::ALL.into_iter().take_while(|&p| p != d) {
            assert!(!p.is_supported() || p.passed_over().is_some(), "{p} runs here and comes before {d}");
        }
        #[cfg(target_arch = "x86_64")]
        assert_eq!(SimdPath::Avx512Bf16.passed_over().is_some(), x86::intel());
    }

    /// The softmax's exponential on every path this CPU has: as close to f64's as `exp` over the range
    /// the online softmax feeds it (x - max <= 0), the same values as `exp` up to rounding, exactly 0 at -inf
    /// and far below the normal range (a masked key's weight), exactly 1 at 0 (the row maximum's weight), and
    /// NaN kept.
    #[test]
    fn exp_nonpositive_matches_f64_on_every_path() {
        let mut xs: Vec<f32> = (0..4000).map(|i| -(i as f32) * 0.0291).collect(); // 0 down to -116.3
        xs.extend([0.0, -0.0, -1e-30, -87.3, -87.4, -88.0, -88.7, -103.0, -104.0, -200.0, f32::NEG_INFINITY]);
        xs.extend([f32::NAN, -f32::MIN_POSITIVE, -0.5 * std::f32::consts::LN_2, -1.5 * std::f32::consts::LN_2]);
        while !xs.len().is_multiple_of(16) {
            xs.push(-3.25);
        }
        for path in supported_paths() {
            let (plain, fast, _) = dispatch(path, Exps { xs: &xs });
            for (i, &x) in xs.iter().enumerate() {
                let (e, f) = (plain[i], fast[i]);
                if x.is_nan() {
                    assert!(e.is_nan() && f.is_nan(), "{path}: exp(NaN) = {e}, {f}");
                    continue;
                }
                let want = (x as f64).exp();
                if want < f32::MIN_POSITIVE as f64 {
                    // Below the normal range both are 0 or a value as small as the true one (never more).
                    assert!(f >= 0.0 && (f as f64) <= 2.0 * want + 1e-45, "{path}: exp({x}) = {f}, want {want}");
                    if x < -104.0 {
                        assert_eq!(f, 0.0, "{path}: exp({x}) must be exactly 0");
                    }
                    continue;
                }
                // The polynomial's 2e-7, plus the rounding of x·log2(e) to f32 (relative 6e-8 of the exponent,
                // about 6e-8 |x| of the result).
                let tol = 3e-7 + 1e-7 * (x as f64).abs();
                let rel = ((f as f64) - want).abs() / want;
                assert!(rel < tol, "{path}: exp_nonpositive({x}) = {f}, want {want} (rel {rel:.2e})");
                let rel_plain = ((e as f64) - want).abs() / want;
                assert!(rel_plain < tol, "{path}: exp({x}) = {e}, want {want} (rel {rel_plain:.2e})");
                assert!((f - e).abs() <= 4.0 * f32::EPSILON * e, "{path}: exp({x}): {f} against {e}");
            }
            let at = |v: f32| xs.iter().position(|&x| x == v || (x.is_nan() && v.is_nan())).map(|i| fast[i]);
            assert_eq!(at(0.0), Some(1.0), "{path}: e^0 must be exactly 1");
            assert_eq!(at(f32::NEG_INFINITY), Some(0.0), "{path}: e^-inf must be exactly 0");
        }
    }

    /// The short exponential (bf16/f16 outputs' probabilities) on every path: within 4e-6 of f64's `e^x`
    /// over the softmax's range (its 3e-6 and the rounding of x·log2 e), exactly 1 at 0, exactly 0 at -inf
    /// and far below the normal range, never above the true value's double there, NaN kept; and 1 within
    /// the same error for exponents a few ulps above 0 (no caller forms them; the polynomial allows them).
    #[test]
    fn exp2_short_nonpositive_is_within_its_error_on_every_path() {
        let mut xs: Vec<f32> = (0..4000).map(|i| -(i as f32) * 0.0291).collect();
        xs.extend([0.0, -0.0, -1e-30, -87.3, -88.7, -103.0, -104.0, -200.0, f32::NEG_INFINITY, f32::NAN]);
        xs.extend([1e-7, 3e-7, -0.5 * std::f32::consts::LN_2, -1.5 * std::f32::consts::LN_2]);
        while !xs.len().is_multiple_of(16) {
            xs.push(-3.25);
        }
        for path in supported_paths() {
            let (_, _, short) = dispatch(path, Exps { xs: &xs });
            for (&x, &f) in xs.iter().zip(&short) {
                if x.is_nan() {
                    assert!(f.is_nan(), "{path}: 2^NaN = {f}");
                    continue;
                }
                let want = (x as f64).exp();
                if want < f32::MIN_POSITIVE as f64 {
                    assert!(f >= 0.0 && (f as f64) <= 2.0 * want + 1e-45, "{path}: e^{x} = {f}, want {want}");
                    if x < -104.0 {
                        assert_eq!(f, 0.0, "{path}: e^{x} must be exactly 0");
                    }
                    continue;
                }
                let rel = ((f as f64) - want).abs() / want;
                assert!(rel < 4e-6 + 1e-7 * (x as f64).abs(), "{path}: short e^{x} = {f}, want {want} (rel {rel:.2e})");
            }
            let at = |v: f32| xs.iter().position(|&x| x == v).map(|i| short[i]);
            assert_eq!(at(0.0), Some(1.0), "{path}: 2^0 must be exactly 1");
            assert_eq!(at(f32::NEG_INFINITY), Some(0.0), "{path}: 2^-inf must be exactly 0");
        }
    }
}
