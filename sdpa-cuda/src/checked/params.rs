//! The launch argument of every attention kernel: one `#[repr(C)]` struct passed by value, mirrored field
//! for field by `struct AttnParams` in `kernels/common.cuh` (both sides assert its size).
//!
//! Conventions: strides are in elements (int64); the head dim is contiguous; `mask` points to additive f32
//! values addressed by `mask_stride_*` (0 for broadcast dims); `lse` is `[B, Hq, Sq]` f32 contiguous or
//! null; query row `i` sees keys `j < causal_limit(i)` where `causal_limit(i) = clamp(i + 1 +
//! causal_offset, 0, Sk)` when `mask_kind` is causal (offset 0 top-left, `Sk - Sq` bottom-right).

use crate::error::unsupported;
use cudarc::driver::DeviceRepr;
use sdpa_core::{AttentionSpec, Mask, Result, Strides};

/// `mask_kind`: no mask.
pub const MASK_NONE: i32 = 0;
/// `mask_kind`: causal (either alignment; `causal_offset` says which).
pub const MASK_CAUSAL: i32 = 1;
/// `mask_kind`: explicit additive f32 mask through `mask`.
pub const MASK_EXPLICIT: i32 = 2;

/// Kernel parameters; see the module docs. Field order matches `common.cuh` exactly.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnParams {
    /// Q base pointer (device address, element type per kernel).
    pub q: u64,
    /// K base pointer.
    pub k: u64,
    /// V base pointer.
    pub v: u64,
    /// O base pointer.
    pub o: u64,
    /// Additive f32 mask or 0.
    pub mask: u64,
    /// LSE output (f32, `[B, Hq, Sq]`) or 0.
    pub lse: u64,
    /// Scratch memory for kernels that need it (split-KV partials) or 0.
    pub workspace: u64,
    /// Q strides (batch, head, seq), elements.
    pub q_stride: [i64; 3],
    /// K strides.
    pub k_stride: [i64; 3],
    /// V strides.
    pub v_stride: [i64; 3],
    /// O strides.
    pub o_stride: [i64; 3],
    /// Mask strides over (b, h, q, k), elements; 0 for broadcast dims.
    pub mask_stride: [i64; 4],
    /// Batch.
    pub b: i32,
    /// Query heads.
    pub hq: i32,
    /// Key/value heads.
    pub hkv: i32,
    /// `hq / hkv`: query head `h` reads kv head `h / group`.
    pub group: i32,
    /// Query length.
    pub sq: i32,
    /// Key length.
    pub sk: i32,
    /// Head dim of Q and K.
    pub d: i32,
    /// Head dim of V and O.
    pub dv: i32,
    /// One of `MASK_NONE`, `MASK_CAUSAL`, `MASK_EXPLICIT`.
    pub mask_kind: i32,
    /// Causal diagonal offset: 0 top-left, `sk - sq` bottom-right.
    pub causal_offset: i32,
    /// Multiplier of Q·Kᵀ.
    pub scale: f32,
    /// `scale * log2(e)`, for kernels that use `exp2`.
    pub scale_log2: f32,
    /// Number of key splits (split-KV), 1 otherwise.
    pub num_splits: i32,
    /// Free for kernel-specific use (0 by default).
    pub extra: i32,
}

/// Size checked against `static_assert(sizeof(AttnParams) == 240)` in common.cuh.
pub const ATTN_PARAMS_SIZE: usize = 240;
const _: () = assert!(std::mem::size_of::<AttnParams>() == ATTN_PARAMS_SIZE);

// SAFETY: plain-old-data of integers and floats with C layout and no padding (size asserted above), the
// same layout the kernels declare.
unsafe impl DeviceRepr for AttnParams {}

/// Entry-point suffix of a `mask_kind` (`{kernel}_{dtype}_{D}_{mask}`): "none", "causal" or "explicit".
pub fn mask_suffix(mask_kind: i32) -> &'static str {
    match mask_kind {
        MASK_CAUSAL => "causal",
        MASK_EXPLICIT => "explicit",
        _ => "none",
    }
}

fn st(s: Strides) -> [i64; 3] {
    [s.b as i64, s.h as i64, s.s as i64]
}

fn i32_dim(name: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| unsupported(format!("{name} = {v} exceeds the 32-bit range of the CUDA kernels")))
}

impl AttnParams {
    /// Whether every row of Q, K, V and O starts 16 bytes aligned for 2-byte elements, as the tensor-core
    /// kernels' 16-byte `cp.async` and `ldmatrix` need: base pointers multiples of 16 bytes and every
    /// stride a multiple of 8 elements.
    pub fn qkvo_aligned_8_elements(&self) -> bool {
        let ptrs_ok = [self.q, self.k, self.v, self.o].iter().all(|&a| a % 16 == 0);
        let strides_ok =
            [self.q_stride, self.k_stride, self.v_stride, self.o_stride].iter().flatten().all(|&st| st % 8 == 0);
        ptrs_ok && strides_ok
    }

    /// Builds the parameters of a validated `spec` with the given device pointers (0 for absent ones).
    pub fn new(spec: &AttentionSpec, q: u64, k: u64, v: u64, o: u64, mask: u64, lse: u64) -> Result<Self> {
        let s = spec.shape;
        // Strides and offsets are int64 on the device; every addressed offset fits because lengths were
        // validated as usize, which is 64-bit on every CUDA host.
        let (mask_kind, causal_offset, mask_stride) = match &spec.mask {
            Mask::None => (MASK_NONE, 0, [0; 4]),
            Mask::CausalTopLeft => (MASK_CAUSAL, 0, [0; 4]),
            Mask::CausalBottomRight => (MASK_CAUSAL, i32_dim("Sk - Sq", s.sk)? - i32_dim("Sq", s.sq)?, [0; 4]),
            Mask::Explicit(m) => {
                let [a, b, c, d] = m.strides();
                (MASK_EXPLICIT, 0, [a as i64, b as i64, c as i64, d as i64])
            }
        };
        let scale = spec.scale() as f32;
        Ok(AttnParams {
            q,
            k,
            v,
            o,
            mask,
            lse,
            workspace: 0,
            q_stride: st(spec.q_strides),
            k_stride: st(spec.k_strides),
            v_stride: st(spec.v_strides),
            o_stride: st(spec.o_strides),
            mask_stride,
            b: i32_dim("B", s.b)?,
            hq: i32_dim("Hq", s.hq)?,
            hkv: i32_dim("Hkv", s.hkv)?,
            group: i32_dim("Hq/Hkv", s.group_size())?,
            sq: i32_dim("Sq", s.sq)?,
            sk: i32_dim("Sk", s.sk)?,
            d: i32_dim("D", s.d)?,
            dv: i32_dim("Dv", s.dv)?,
            mask_kind,
            causal_offset,
            scale,
            scale_log2: (spec.scale() * std::f64::consts::LOG2_E) as f32,
            num_splits: 1,
            extra: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sdpa_core::{DType, Shape};

    /// The CUDA struct in common.cuh declares the same fields in the same order (sizes are asserted on
    /// both sides; this catches two fields of one size swapped).
    #[test]
    fn common_cuh_declares_the_same_fields_in_order() {
        let src = crate::sys::modules::COMMON_CUH;
        let body = src.split("struct AttnParams {").nth(1).and_then(|s| s.split("};").next()).unwrap_or_default();
        let mut cuda = Vec::new();
        for decl in body.lines().map(|l| l.split("//").next().unwrap_or("").trim()).filter(|l| !l.is_empty()) {
            // `const void* q;`, `int b, hq, hkv;`, `i64 q_stride[3];`: the name is the last word of each
            // comma-separated declarator.
            for part in decl.trim_end_matches(';').split(',') {
                let word = part.split_whitespace().last().unwrap_or("").trim_start_matches('*');
                cuda.push(word.split('[').next().unwrap_or(word).to_string());
            }
        }
        let rust = [
            "q",
            "k",
            "v",
            "o",
            "mask",
            "lse",
            "workspace",
            "q_stride",
            "k_stride",
            "v_stride",
            "o_stride",
            "mask_stride",
            "b",
            "hq",
            "hkv",
            "group",
            "sq",
            "sk",
            "d",
            "dv",
            "mask_kind",
            "causal_offset",
            "scale",
            "scale_log2",
            "num_splits",
            "extra",
        ];
        assert_eq!(cuda, rust);
    }

    #[test]
    fn bottom_right_offset_and_sizes() {
        let spec = AttentionSpec::new(Shape { b: 2, hq: 8, hkv: 2, sq: 3, sk: 10, d: 64, dv: 32 }, DType::F16)
            .with_mask(Mask::CausalBottomRight);
        let p = AttnParams::new(&spec, 1, 2, 3, 4, 0, 0).unwrap();
        assert_eq!((p.mask_kind, p.causal_offset, p.group), (MASK_CAUSAL, 7, 4));
        assert_eq!(p.q_stride, [8 * 3 * 64, 3 * 64, 64]);
        assert!((p.scale - 0.125).abs() < 1e-7);
    }
}
