//! The opt-in tensor-core path for f32 inputs (`kernels/tf32.cu`), run as kernel `fa2` with
//! `F32Math::Tf32` (one TF32 product, about 3e-4 relative error) or `F32Math::SplitTf32` (three TF32
//! products, near-f32 accuracy). Every result record carries the `F32Math` it ran with.
//!
//! Head dims: D = Dv up to 256, padded with zeros to 16, 32, 64, 128 or 256 inside the kernel; larger or
//! unequal head dims are `Unsupported` (the exact `fa1` path covers them).

use crate::call::Call;
use crate::error::unsupported;
use crate::launch::{launch, LaunchDims};
use crate::modules::TF32;
use sdpa_core::{DType, F32Math, Result};

const BQ: usize = 64;
const WARPS: u32 = 4;

/// Padded head dim the kernel is instantiated for, if any.
pub fn padded_head_dim(d: usize) -> Option<usize> {
    [16, 32, 64, 128, 256].into_iter().find(|&p| d <= p)
}

/// Shared memory for padded head dim `dp`, bytes.
pub fn smem_bytes(dp: usize) -> usize {
    let bk = if dp >= 128 { 32 } else { 64 }; // TcTile<DP>::BK
    4 * (BQ * (dp + 8) + 2 * bk * (dp + 8) + WARPS as usize * 16 * (bk + 8))
}

/// Launches the TF32 or split-TF32 kernel on the call's stream.
pub fn run(call: &Call<'_>) -> Result<()> {
    let s = call.spec.shape;
    if call.spec.dtype != DType::F32 {
        return Err(unsupported("the TF32 kernels take f32 inputs"));
    }
    let prefix = match call.opts.f32_math {
        F32Math::Tf32 => "tf32",
        F32Math::SplitTf32 => "tf32x3",
        F32Math::Exact => return Err(unsupported("the tensor-core f32 kernel needs f32 math tf32 or split-tf32")),
    };
    let dp = match padded_head_dim(s.d) {
        Some(dp) if s.d == s.dv => dp,
        _ => {
            return Err(unsupported(format!(
                "f32 tensor-core path needs D = Dv <= 256 (got D = {}, Dv = {}); use fa1 for exact f32",
                s.d, s.dv
            )))
        }
    };
    let blocks =
        s.sq.div_ceil(BQ)
            .checked_mul(s.b * s.hq)
            .and_then(|x| u32::try_from(x).ok())
            .ok_or_else(|| unsupported("grid exceeds 2^32 blocks"))?;
    let dims = LaunchDims { grid: (blocks, 1, 1), block: (WARPS * 32, 1, 1), smem_bytes: smem_bytes(dp) as u32 };
    // 16-byte global loads when every row start is 16-byte aligned (`extra` is the kernel's flag).
    let p = &call.params;
    let aligned = [p.q, p.k, p.v].iter().all(|&a| a % 16 == 0)
        && s.d.is_multiple_of(4)
        && [p.q_stride, p.k_stride, p.v_stride].iter().flatten().all(|&st| st % 4 == 0);
    let params = crate::params::AttnParams { extra: i32::from(aligned), ..*p };
    // SAFETY: `call.params` was built from the validated spec and buffers whose lengths cover every strided
    // offset; the kernel stays within them (rows past Sq/Sk and columns past D are never read or written).
    unsafe { launch(call.dev, call.stream, &TF32, &format!("{prefix}_f32_{dp}"), dims, &params) }
}
