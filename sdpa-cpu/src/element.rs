//! Element types the CPU kernels read and write: f32, f16 and bf16, always computed in f32.

use half::{bf16, f16};
use sdpa_core::{DType, HostBuffer};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// An element type of Q, K, V and O. Implemented for `f32`, `half::f16` and `half::bf16`.
pub trait CpuElement: sealed::Sealed + Copy + Send + Sync + 'static {
    /// The matching sdpa-core dtype.
    const DTYPE: DType;

    /// Widens one element.
    fn to_f32(self) -> f32;

    /// Rounds an f32 to this type (round to nearest even).
    fn from_f32(x: f32) -> Self;

    /// The slice itself when the type is f32, so kernels can read it without packing.
    fn as_f32(s: &[Self]) -> Option<&[f32]>;

    /// The slice itself when the type is bf16 (the AVX512_BF16 kernel reads it in place).
    fn as_bf16(_: &[Self]) -> Option<&[bf16]> {
        None
    }

    /// The slice itself when the type is f16 (widened in the path's vectors).
    fn as_f16(_: &[Self]) -> Option<&[f16]> {
        None
    }

    /// The elements of a host buffer of this type (`None` for another dtype).
    fn of_host(b: &HostBuffer) -> Option<&[Self]>;

    /// The elements of a host buffer of this type, mutably.
    fn of_host_mut(b: &mut HostBuffer) -> Option<&mut [Self]>;

    /// Widens `src` into `dst` (same length).
    fn widen(src: &[Self], dst: &mut [f32]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }

    /// Rounds `src` into `dst` (same length).
    fn narrow(src: &[f32], dst: &mut [Self]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = Self::from_f32(s);
        }
    }
}

impl CpuElement for f32 {
    const DTYPE: DType = DType::F32;
    fn of_host(b: &HostBuffer) -> Option<&[Self]> {
        match b {
            HostBuffer::F32(v) => Some(v),
            _ => None,
        }
    }
    fn of_host_mut(b: &mut HostBuffer) -> Option<&mut [Self]> {
        match b {
            HostBuffer::F32(v) => Some(v),
            _ => None,
        }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    fn as_f32(s: &[Self]) -> Option<&[f32]> {
        Some(s)
    }
    fn widen(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    fn narrow(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
}

impl CpuElement for f16 {
    const DTYPE: DType = DType::F16;
    fn of_host(b: &HostBuffer) -> Option<&[Self]> {
        match b {
            HostBuffer::F16(v) => Some(v),
            _ => None,
        }
    }
    fn of_host_mut(b: &mut HostBuffer) -> Option<&mut [Self]> {
        match b {
            HostBuffer::F16(v) => Some(v),
            _ => None,
        }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn as_f32(_: &[Self]) -> Option<&[f32]> {
        None
    }
    fn as_f16(s: &[Self]) -> Option<&[f16]> {
        Some(s)
    }
    fn widen(src: &[f16], dst: &mut [f32]) {
        // half's slice conversion uses F16C when the CPU has it (detected at run time).
        half::slice::HalfFloatSliceExt::convert_to_f32_slice(src, dst);
    }
    fn narrow(src: &[f32], dst: &mut [f16]) {
        half::slice::HalfFloatSliceExt::convert_from_f32_slice(dst, src);
    }
}

impl CpuElement for bf16 {
    const DTYPE: DType = DType::BF16;
    fn of_host(b: &HostBuffer) -> Option<&[Self]> {
        match b {
            HostBuffer::BF16(v) => Some(v),
            _ => None,
        }
    }
    fn of_host_mut(b: &mut HostBuffer) -> Option<&mut [Self]> {
        match b {
            HostBuffer::BF16(v) => Some(v),
            _ => None,
        }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn as_f32(_: &[Self]) -> Option<&[f32]> {
        None
    }
    fn as_bf16(s: &[Self]) -> Option<&[bf16]> {
        Some(s)
    }
    fn widen(src: &[bf16], dst: &mut [f32]) {
        // A bf16 is the top half of an f32: a shift, which the compiler vectorises.
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = f32::from_bits((s.to_bits() as u32) << 16);
        }
    }
}

/// Widens `dst.len()` elements of `src` from `off` into `dst` inside a kernel compiled for SIMD path `S`:
/// bf16 and f16 with the path's vectors (a shift, or F16C's conversion, inlined into the kernel's loop), f32
/// as a copy. [`CpuElement::widen`] is compiled for the baseline x86-64 target wherever it
/// is not inlined, so a kernel widening K/V tiles row by row spends more on it than on a vector shift.
#[inline(always)]
pub(crate) fn widen_with<S: crate::simd::Simd, T: CpuElement>(s: S, src: &[T], off: usize, dst: &mut [f32]) {
    let n = dst.len();
    // SAFETY (both calls): the row of n values from `off` was bounds-checked by the slicing, `dst` holds n.
    if let Some(b) = T::as_bf16(src) {
        unsafe { s.widen_bf16(b[off..off + n].as_ptr().cast::<u16>(), dst.as_mut_ptr(), n) }
    } else if let Some(h) = T::as_f16(src) {
        unsafe { s.widen_f16(h[off..off + n].as_ptr().cast::<u16>(), dst.as_mut_ptr(), n) }
    } else {
        T::widen(&src[off..off + n], dst)
    }
}
