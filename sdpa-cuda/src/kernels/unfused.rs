//! The unfused baseline, as eager PyTorch runs attention: cuBLAS writes the scores `S = Q·Kᵀ` (f32, all
//! `B·Hq·Sq·Sk` of them), a softmax kernel applies scale and mask and writes `P` in the input dtype (and
//! the LSE), cuBLAS multiplies `O = P·V`. f32 inputs multiply exactly (`CUBLAS_COMPUTE_32F`) or in TF32
//! (`F32Math::Tf32`, `CUBLAS_COMPUTE_32F_FAST_TF32`).
//!
//! GQA and any strides without copies: the products are strided-batched over kv heads, one cuBLAS call per
//! (batch, position in the head group); with no GQA and batch-uniform strides (BHSD) one call covers
//! everything.

use crate::checked::call::Call;
use crate::checked::launch::{launch, LaunchDims};
use crate::checked::params::AttnParams;
use crate::error::{unsupported, CudaError};
use crate::sys::modules::UNFUSED;
use crate::sys::program::Program;
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::{DevicePtr, DeviceRepr};
use sdpa_core::{DType, F32Math, Result};

/// The one program of the unfused path: `kernels/unfused.cu` whole (its softmax and repair entries for each
/// dtype are plain functions, about a second to compile together on the H100 host).
pub fn program() -> Program {
    Program::whole(&UNFUSED)
}

/// Launch argument of `unfused_softmax_*` (mirrors `SoftmaxParams` in unfused.cu): the call's parameters and
/// a slab of scores, `rows` rows of `w` keys (from key `k0`) in each of the slab's GEMM batches. Row `x` of
/// batch `z` (counted from `z0`) is query row `q0 + x` (or `q0` when `fold`) of head
/// `(z % zb) * hz + h0` (plus `x` when `fold`: the rows are a group's query heads) in batch `z / zb`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct SoftmaxParams {
    pub a: AttnParams,
    pub s: u64,
    pub p: u64,
    pub z0: i32,
    pub zb: i32,
    pub hz: i32,
    pub h0: i32,
    pub fold: i32,
    pub q0: i32,
    pub k0: i32,
    pub w: i32,
    pub rows: i32,
    pub reserved: i32,
}
// SAFETY: C layout of plain integers and floats (AttnParams is DeviceRepr; two u64 and ten i32 follow, no
// padding: AttnParams is a multiple of 8 bytes).
unsafe impl DeviceRepr for SoftmaxParams {}

/// Launches the softmax over the slab `sp` describes, one block per row of its `n_z` GEMM batches.
///
/// # Safety
/// `sp.s` must hold `n_z · rows · w` f32 scores written before on `call.stream`, `sp.p` as many elements of
/// the dtype; every row the slab names must be a row of the call (its LSE entry and mask row exist).
pub(crate) unsafe fn launch_softmax(call: &Call<'_>, sp: &SoftmaxParams, n_z: usize) -> Result<()> {
    let blocks = n_z.checked_mul(sp.rows as usize).and_then(|n| u32::try_from(n).ok());
    let blocks = blocks.ok_or_else(|| unsupported("more than 2^32 query rows in one softmax launch"))?;
    let dims = LaunchDims { grid: (blocks, 1, 1), block: (256, 1, 1), smem_bytes: 0 };
    let name = format!("unfused_softmax_{}", call.spec.dtype.name());
    // SAFETY: see the function's contract.
    unsafe { launch(call.dev, call.stream, &program(), &name, dims, sp) }
}

/// The cuBLAS data type of `dtype`.
pub(crate) fn data_type(dtype: DType) -> cudaDataType {
    match dtype {
        DType::F32 => cudaDataType::CUDA_R_32F,
        DType::F16 => cudaDataType::CUDA_R_16F,
        DType::BF16 => cudaDataType::CUDA_R_16BF,
        // Never reached: the policy sends f8e4m3 calls to fa3 only.
        DType::F8E4M3 => cudaDataType::CUDA_R_8F_E4M3,
    }
}

/// `v` as cuBLAS's 32-bit int, or an error naming `name`.
pub(crate) fn c_int(name: &str, v: i64) -> Result<i32> {
    i32::try_from(v).map_err(|_| unsupported(format!("{name} = {v} exceeds cuBLAS's 32-bit sizes")))
}

/// One strided-batched GEMM in cuBLAS's column-major terms; pointers are byte addresses.
pub(crate) struct Gemm {
    pub transa: cublasOperation_t,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub a: u64,
    pub a_type: cudaDataType,
    pub lda: i32,
    pub stride_a: i64,
    pub b: u64,
    pub b_type: cudaDataType,
    pub ldb: i32,
    pub stride_b: i64,
    pub c: u64,
    pub c_type: cudaDataType,
    pub ldc: i32,
    pub stride_c: i64,
    pub batch: i32,
    pub compute: cublasComputeType_t,
}

impl Gemm {
    /// # Safety
    /// Every address must point to device memory covering the matrices the sizes, leading dimensions and
    /// strides describe, alive until the stream runs the GEMM.
    pub(crate) unsafe fn run(&self, handle: cudarc::cublas::sys::cublasHandle_t) -> Result<()> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: see the function's contract; alpha/beta are host f32 matching the f32 compute type.
        unsafe {
            cudarc::cublas::result::gemm_strided_batched_ex(
                handle,
                self.transa,
                cublasOperation_t::CUBLAS_OP_N,
                self.m,
                self.n,
                self.k,
                (&alpha as *const f32).cast(),
                self.a as *const _,
                self.a_type,
                self.lda,
                self.stride_a,
                self.b as *const _,
                self.b_type,
                self.ldb,
                self.stride_b,
                (&beta as *const f32).cast(),
                self.c as *mut _,
                self.c_type,
                self.ldc,
                self.stride_c,
                self.batch,
                self.compute,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| {
            CudaError::Cublas { call: "cublasGemmStridedBatchedEx", message: format!("{e:?}") }.into_sdpa("unfused")
        })
    }
}

/// The cuBLAS handle of `blas` (locked by the caller through `Device::with_blas`) set to the call's stream.
pub(crate) fn handle_on_stream(
    call: &Call<'_>,
    blas: &cudarc::cublas::CudaBlas,
) -> Result<cudarc::cublas::sys::cublasHandle_t> {
    let handle = *blas.handle();
    // SAFETY: the handle is live and locked for the caller's closure; the stream belongs to its context.
    unsafe { cudarc::cublas::result::set_stream(handle, call.stream.cu_stream() as _) }
        .map_err(|e| CudaError::Cublas { call: "cublasSetStream", message: format!("{e:?}") }.into_sdpa("unfused"))?;
    Ok(handle)
}

/// Runs the three steps on the call's stream.
pub fn run(call: &Call<'_>) -> Result<()> {
    // Ragged batches are the tensor-core kernels' (the policy never sends them here).
    super::policy::refuse_ragged("unfused", call.spec)?;
    let spec = call.spec;
    let s = spec.shape;
    let p = &call.params;
    let compute = match (spec.dtype, call.opts.f32_math) {
        (DType::F32, F32Math::Tf32) => cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
        (DType::F32, F32Math::SplitTf32) => {
            return Err(unsupported(
                "unfused runs its products in cuBLAS, which has no split-TF32 mode; use fa2 with split-tf32",
            ))
        }
        _ => cublasComputeType_t::CUBLAS_COMPUTE_32F,
    };
    let rows = (s.b * s.hq).checked_mul(s.sq).ok_or_else(|| unsupported("B·Hq·Sq overflows"))?;
    let n_scores = rows.checked_mul(s.sk).ok_or_else(|| unsupported("the score matrix size overflows"))?;
    let scores = call.scratch::<f32>(n_scores, "the unfused score matrix")?;
    let probs = call.scratch::<u8>(n_scores * spec.dtype.size_bytes(), "the unfused probability matrix")?;
    let (s_ptr, _gs) = scores.device_ptr(call.stream);
    let (p_ptr, _gp) = probs.device_ptr(call.stream);

    let es = spec.dtype.size_bytes() as u64;
    let dt = data_type(spec.dtype);
    let g = s.group_size() as i64;
    let (sq, sk) = (s.sq as i64, s.sk as i64);
    let [qb, qh, qs] = p.q_stride;
    let [kb, kh, ks] = p.k_stride;
    let [vb, vh, vs] = p.v_stride;
    let [ob, oh, os] = p.o_stride;
    // One call per (batch, group position) over kv heads; collapse to a single call when possible.
    let uniform = g == 1
        && qb == s.hq as i64 * qh
        && kb == s.hkv as i64 * kh
        && vb == s.hkv as i64 * vh
        && ob == s.hq as i64 * oh;
    let (outer_b, batch) = if uniform { (1, (s.b * s.hq) as i64) } else { (s.b as i64, s.hkv as i64) };
    let inner_r = if uniform { 1 } else { g };

    call.dev.with_blas(|blas| {
        let handle = handle_on_stream(call, blas)?;
        for b in 0..outer_b {
            for r in 0..inner_r {
                let srow0 = (b * s.hq as i64 + r) * sq * sk; // first score of (b, head r)
                                                             // S^T (Sk x Sq, col-major) = K (D x Sk)^T · Q (D x Sq)
                let gemm1 = Gemm {
                    transa: cublasOperation_t::CUBLAS_OP_T,
                    m: c_int("Sk", sk)?,
                    n: c_int("Sq", sq)?,
                    k: c_int("D", s.d as i64)?,
                    a: p.k + (b * kb) as u64 * es,
                    a_type: dt,
                    lda: c_int("K row stride", ks)?,
                    stride_a: kh,
                    b: p.q + (b * qb + r * qh) as u64 * es,
                    b_type: dt,
                    ldb: c_int("Q row stride", qs)?,
                    stride_b: g * qh,
                    c: s_ptr + srow0 as u64 * 4,
                    c_type: cudaDataType::CUDA_R_32F,
                    ldc: c_int("Sk", sk)?,
                    stride_c: g * sq * sk,
                    batch: c_int("batch", batch)?,
                    compute,
                };
                // SAFETY: Q, K and the score scratch cover every addressed element (validated strides,
                // scratch sized B·Hq·Sq·Sk); the guards keep them alive until queued.
                unsafe { gemm1.run(handle)? };
            }
        }
        Ok(())
    })?;

    // The whole call is one slab: batch z = b·Hq + h, every row, every key.
    let sp = SoftmaxParams {
        a: *p,
        s: s_ptr,
        p: p_ptr,
        z0: 0,
        zb: c_int("Hq", s.hq as i64)?,
        hz: 1,
        h0: 0,
        fold: 0,
        q0: 0,
        k0: 0,
        w: c_int("Sk", sk)?,
        rows: c_int("Sq", sq)?,
        reserved: 0,
    };
    // SAFETY: the scores were written above on this stream; P has B·Hq·Sq·Sk elements of the dtype; LSE
    // (if any) has B·Hq·Sq f32; the explicit mask covers its dims.
    unsafe { launch_softmax(call, &sp, s.b * s.hq)? };

    call.dev.with_blas(|blas| {
        let handle = handle_on_stream(call, blas)?;
        for b in 0..outer_b {
            for r in 0..inner_r {
                let prow0 = (b * s.hq as i64 + r) * sq * sk;
                // O^T (Dv x Sq) = V^T (Dv x Sk) · P^T (Sk x Sq)
                let gemm2 = Gemm {
                    transa: cublasOperation_t::CUBLAS_OP_N,
                    m: c_int("Dv", s.dv as i64)?,
                    n: c_int("Sq", sq)?,
                    k: c_int("Sk", sk)?,
                    a: p.v + (b * vb) as u64 * es,
                    a_type: dt,
                    lda: c_int("V row stride", vs)?,
                    stride_a: vh,
                    b: p_ptr + prow0 as u64 * es,
                    b_type: dt,
                    ldb: c_int("Sk", sk)?,
                    stride_b: g * sq * sk,
                    c: p.o + (b * ob + r * oh) as u64 * es,
                    c_type: dt,
                    ldc: c_int("O row stride", os)?,
                    stride_c: g * oh,
                    batch: c_int("batch", batch)?,
                    compute,
                };
                // SAFETY: P was written by the softmax on this stream; V and O cover every addressed element.
                unsafe { gemm2.run(handle)? };
            }
        }
        Ok(())
    })?;

    // SAFETY: O was written by the product above on this stream.
    unsafe { repair(call) }
}

/// cuBLAS multiplies a masked key's P = 0 by its V row, so NaN or inf there would reach rows that never see
/// the key. A grid-stride pass checks the output in 16-byte chunks and recomputes a row without masked keys
/// when it is not finite (kernels/unfused.cu); rows with finite output cost one read.
///
/// # Safety
/// Every row of O must have been written on `call.stream` before.
pub(crate) unsafe fn repair(call: &Call<'_>) -> Result<()> {
    let s = call.spec.shape;
    let rows = s.b * s.hq * s.sq;
    let dims = LaunchDims {
        grid: (repair_blocks(rows, s.dv, call.spec.dtype.size_bytes(), call.dev.info().sm_count), 1, 1),
        block: (REPAIR_WARPS as u32 * 32, 1, 1),
        smem_bytes: 0,
    };
    let name = format!("unfused_repair_{}", call.spec.dtype.name());
    // SAFETY: Q, K, V, O, the mask and the LSE cover the elements the parameters address (validated strides);
    // O was written before on this stream (the contract).
    unsafe { launch(call.dev, call.stream, &program(), &name, dims, &call.params) }
}

/// Warps per block of `unfused_repair_*`; mirrors `REPAIR_WARPS` in unfused.cu.
const REPAIR_WARPS: usize = 8;

/// Blocks of the check pass: enough for one group of rows per warp (a warp checks `32 / chunks` rows of
/// `chunks` 16-byte chunks at once when they fit in a warp, as unfused.cu does), at most a full GPU of
/// resident blocks; the kernel strides over the rest.
fn repair_blocks(rows: usize, dv: usize, elem_bytes: usize, sm_count: i32) -> u32 {
    let chunks = (dv * elem_bytes).div_ceil(16).max(1);
    let group = if chunks >= 32 { 1 } else { 32 / chunks };
    let needed = rows.div_ceil(group).div_ceil(REPAIR_WARPS);
    let resident = 8 * sm_count.max(1) as usize;
    needed.clamp(1, resident) as u32
}

#[cfg(test)]
mod tests {
    use super::repair_blocks;

    #[test]
    fn the_check_pass_covers_every_row_group_up_to_a_full_gpu() {
        // D = 64 bf16: 8 chunks of 16 bytes, 4 rows per warp, 32 rows per block.
        assert_eq!(repair_blocks(1, 64, 2, 132), 1);
        assert_eq!(repair_blocks(33, 64, 2, 132), 2);
        assert_eq!(repair_blocks(1 << 20, 64, 2, 132), 8 * 132);
        // D = 8192 f32: 2048 chunks, one row per warp.
        assert_eq!(repair_blocks(17, 8192, 4, 132), 3);
        // Dv = 1 still takes one chunk per row.
        assert_eq!(repair_blocks(64, 1, 2, 132), 1);
        assert_eq!(repair_blocks(0, 64, 2, 0), 1);
    }
}
