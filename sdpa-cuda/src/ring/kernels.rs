//! Launchers of `kernels/ring.cu`: the LSE merge of a step's partial output into the running one, the f32
//! accumulation of a step's gradients, their rounding into the dtype, and the gather of LSE rows. Each
//! argument struct mirrors the `.cu` struct of the same name.

use crate::checked::device::Device;
use crate::checked::launch::{launch, LaunchDims};
use crate::error::unsupported;
use crate::sys::modules::RING;
use crate::sys::program::Program;
use cudarc::driver::{CudaStream, DeviceRepr};
use sdpa_core::{DType, Result};

/// `RingMergeArgs` in ring.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MergeArgs {
    pub prev: u64,
    pub prev_lse: u64,
    pub part: u64,
    pub part_lse: u64,
    pub out: u64,
    pub heads: u64,
    pub rows: u64,
    pub part_row0: u64,
    pub part_rows: u64,
    pub dv: u64,
    pub prev_is_f32: i32,
    pub out_is_f32: i32,
}

/// `RingAddArgs` in ring.cu: rows `[row0, row0 + n)` of `[heads, rows_total, width]` in both buffers.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AddArgs {
    pub acc: u64,
    pub part: u64,
    pub heads: u64,
    pub rows_total: u64,
    pub row0: u64,
    pub n: u64,
    pub width: u64,
    pub first: i32,
    pub pad: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct ConvertArgs {
    acc: u64,
    out: u64,
    n: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct RowsArgs {
    src: u64,
    out: u64,
    heads: u64,
    src_rows: u64,
    row0: u64,
    rows: u64,
}

// SAFETY: plain data with C layout matching the kernels' by-value structs (u64 fields, then two i32).
unsafe impl DeviceRepr for MergeArgs {}
// SAFETY: as above.
unsafe impl DeviceRepr for AddArgs {}
// SAFETY: as above.
unsafe impl DeviceRepr for ConvertArgs {}
// SAFETY: as above.
unsafe impl DeviceRepr for RowsArgs {}

/// The one program of ring.cu (compiled whole).
pub fn program() -> Program {
    Program::whole(&RING)
}

fn suffix(dtype: DType) -> Result<&'static str> {
    match dtype {
        DType::F16 => Ok("f16"),
        DType::BF16 => Ok("bf16"),
        DType::F32 => Err(unsupported("f32 ring attention (the ring runs f16 and bf16)")),
        DType::F8E4M3 => Err(unsupported("f8e4m3 ring attention (the ring runs f16 and bf16)")),
    }
}

/// A grid-stride launch over `n` elements.
fn strided(dev: &Device, n: u64) -> LaunchDims {
    let sms = dev.info().sm_count.max(1) as u64;
    let blocks = n.div_ceil(256).clamp(1, 8 * sms) as u32;
    LaunchDims { grid: (blocks, 1, 1), block: (256, 1, 1), smem_bytes: 0 }
}

/// Merges a step's part into the running output (one warp per row).
///
/// # Safety
/// Every address must be live device memory of `dev` holding the extents `a` describes, ordered on `stream`.
pub unsafe fn merge(dev: &Device, stream: &CudaStream, dtype: DType, a: &MergeArgs) -> Result<()> {
    let warps = a.heads * a.rows;
    let blocks = u32::try_from(warps.div_ceil(8)).map_err(|_| unsupported("ring merge grid exceeds 2^32 blocks"))?;
    let dims = LaunchDims { grid: (blocks.max(1), 1, 1), block: (256, 1, 1), smem_bytes: 0 };
    let name = format!("ring_merge_{}", suffix(dtype)?);
    // SAFETY: the caller guarantees the memory (see # Safety); the struct matches the kernel's.
    unsafe { launch(dev, stream, &program(), &name, dims, a) }
}

/// Adds (or, with `first`, writes) a step's gradient rows into an f32 accumulator.
///
/// # Safety
/// As [`merge`].
pub unsafe fn add(dev: &Device, stream: &CudaStream, dtype: DType, a: &AddArgs) -> Result<()> {
    let name = format!("ring_add_{}", suffix(dtype)?);
    // SAFETY: as above.
    unsafe { launch(dev, stream, &program(), &name, strided(dev, a.heads * a.n * a.width), a) }
}

/// Rounds `n` f32 values into the dtype.
///
/// # Safety
/// As [`merge`].
pub unsafe fn convert(dev: &Device, stream: &CudaStream, dtype: DType, acc: u64, out: u64, n: u64) -> Result<()> {
    let name = format!("ring_convert_{}", suffix(dtype)?);
    let a = ConvertArgs { acc, out, n };
    // SAFETY: as above.
    unsafe { launch(dev, stream, &program(), &name, strided(dev, n), &a) }
}

/// Copies rows `[row0, row0 + rows)` of `[heads, src_rows]` f32 values into a compact `[heads, rows]`.
///
/// # Safety
/// As [`merge`].
pub unsafe fn gather_rows(
    dev: &Device,
    stream: &CudaStream,
    (src, out): (u64, u64),
    heads: u64,
    src_rows: u64,
    row0: u64,
    rows: u64,
) -> Result<()> {
    let a = RowsArgs { src, out, heads, src_rows, row0, rows };
    // SAFETY: as above.
    unsafe { launch(dev, stream, &program(), "ring_rows_f32", strided(dev, heads * rows), &a) }
}
