//! `fa1`: the FlashAttention-1 SIMT kernels of `kernels/fa1.cu` (see that file for the work split).
//!
//! Variant choice: D = Dv in [`FA1_FAST_HEAD_DIMS`](crate::FA1_FAST_HEAD_DIMS) takes the register-tiled
//! kernel `fa1t_{dtype}_{D}` ([`tiled_shape`]: 256 threads with 8 query rows each in 128-row blocks for
//! 64 < D <= 128, 4 rows in 64-row blocks otherwise; 128 threads with 8 rows and 8 keys each for f32 at
//! D = 64) when Q, K and V have 16-byte aligned bases and strides (it copies tiles in 16-byte chunks) and
//! its shared memory fits, else the plain fixed-size kernel `fa1_{dtype}_{D}` (4 x 4 per thread, 64-row
//! blocks) when that fits; everything else takes the generic `fa1_{dtype}` with one block column per 64
//! columns of Dv.

use crate::call::Call;
use crate::error::unsupported;
use crate::launch::{launch, LaunchDims};
use crate::modules::FA1;
use sdpa_core::{DType, Result};

const BQ: usize = 64;
const BK: usize = 64;
const LDQ: usize = BQ + 4;
const LDK: usize = BK + 4;
const DC: usize = 32;
const DVC: usize = 64;
const THREADS: u32 = 256;

/// Shared memory of the fixed variant for head dim `hd`, bytes (P shares the K tile's memory when it
/// fits there, as in `fa1_fixed`).
pub fn fixed_smem_bytes(hd: usize) -> usize {
    let p = if hd * LDK >= BK * LDQ { 0 } else { BK * LDQ };
    4 * (hd * LDQ + hd * LDK + BK * hd + p)
}

/// Shape of the tiled variant (`Fa1TiledChoice` in fa1.cu): threads per row group `tx` (16 row groups,
/// so 16 x `tx` threads) and query rows per thread `rows` (blocks of 16 x `rows` rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TiledShape {
    /// Threads per row group.
    pub tx: usize,
    /// Query rows per thread.
    pub rows: usize,
}

/// f32 head dims whose tiled variant is narrow (`NARROW` in `Fa1TiledChoice`: 8 threads per row group).
const NARROW_F32_DIMS: &[usize] = &[64]; // fa1-choice

/// The tiled variant's shape for head dim `hd` and element type `dtype`.
pub fn tiled_shape(hd: usize, dtype: DType) -> TiledShape {
    if dtype == DType::F32 && NARROW_F32_DIMS.contains(&hd) {
        TiledShape { tx: 8, rows: 8 }
    } else {
        TiledShape { tx: 16, rows: if hd <= 64 || hd > 128 { 4 } else { 8 } }
    }
}

/// Shared memory of the tiled variant, bytes (`Fa1Tiled::SMEM_FLOATS`: Q, K, V and P tiles, rows of Q and
/// K padded by four floats, P rows of BK + 4).
pub fn tiled_smem_bytes(hd: usize, dtype: DType) -> usize {
    let bq = 16 * tiled_shape(hd, dtype).rows;
    4 * (bq * (hd + 4) + BK * (hd + 4) + BK * hd + bq * (BK + 4))
}

/// Whether the tiled variant's 16-byte copies are legal for the call: Q, K and V base addresses and every
/// stride (batch, head, sequence) a multiple of 16 bytes.
fn tiled_aligned(call: &Call<'_>) -> bool {
    let elem = call.spec.dtype.size_bytes() as i64;
    let p = &call.params;
    [(p.q, p.q_stride), (p.k, p.k_stride), (p.v, p.v_stride)]
        .iter()
        .all(|(ptr, st)| ptr.is_multiple_of(16) && st.iter().all(|s| (s * elem) % 16 == 0))
}

/// Shared memory of the generic variant, bytes.
pub fn generic_smem_bytes() -> usize {
    4 * (DC * LDQ + DC * LDK + BK * DVC + BK * LDQ)
}

/// The entry point, grid and shared memory `fa1` uses for the call.
pub fn plan(call: &Call<'_>) -> Result<(String, LaunchDims)> {
    let s = call.spec.shape;
    let dt = call.spec.dtype.name();
    let q_tiles = s.sq.div_ceil(BQ);
    let blocks = q_tiles
        .checked_mul(s.b * s.hq)
        .and_then(|x| u32::try_from(x).ok())
        .ok_or_else(|| unsupported(format!("fa1 grid of {q_tiles} x {} blocks exceeds 2^32", s.b * s.hq)))?;
    let optin = call.dev.info().smem_per_block_optin as usize;
    let fast = s.d == s.dv && crate::FA1_FAST_HEAD_DIMS.contains(&s.d);
    let dtype = call.spec.dtype;
    if fast && tiled_smem_bytes(s.d, dtype) <= optin && tiled_aligned(call) {
        let shape = tiled_shape(s.d, dtype);
        let bq = 16 * shape.rows;
        let blocks =
            s.sq.div_ceil(bq).checked_mul(s.b * s.hq).and_then(|x| u32::try_from(x).ok()).ok_or_else(|| {
                unsupported(format!("fa1 grid of {} x {} blocks exceeds 2^32", s.sq.div_ceil(bq), s.b * s.hq))
            })?;
        let threads = 16 * shape.tx as u32;
        let smem_bytes = tiled_smem_bytes(s.d, dtype) as u32;
        let dims = LaunchDims { grid: (blocks, 1, 1), block: (threads, 1, 1), smem_bytes };
        return Ok((format!("fa1t_{dt}_{}", s.d), dims));
    }
    if fast && fixed_smem_bytes(s.d) <= optin {
        let dims =
            LaunchDims { grid: (blocks, 1, 1), block: (THREADS, 1, 1), smem_bytes: fixed_smem_bytes(s.d) as u32 };
        Ok((format!("fa1_{dt}_{}", s.d), dims))
    } else {
        let chunks = u32::try_from(s.dv.div_ceil(DVC)).map_err(|_| unsupported("Dv too large"))?;
        let dims =
            LaunchDims { grid: (blocks, chunks, 1), block: (THREADS, 1, 1), smem_bytes: generic_smem_bytes() as u32 };
        Ok((format!("fa1_{dt}"), dims))
    }
}

/// Launches `fa1` on the call's stream.
pub fn run(call: &Call<'_>) -> Result<()> {
    let (name, dims) = plan(call)?;
    // SAFETY: `call.params` holds pointers the backend checked against the validated spec (lengths cover
    // every strided offset); the kernel reads Q/K/V/mask and writes O/LSE only within those extents.
    unsafe { launch(call.dev, call.stream, &FA1, &name, dims, &call.params) }
}
