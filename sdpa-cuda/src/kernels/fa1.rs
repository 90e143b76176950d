//! `fa1`: FlashAttention-1, on tensor cores for f16/bf16 (`kernels/fa1_mma.cu`) and in SIMT arithmetic for
//! everything else (`kernels/fa1.cu`); see those files for the work split.
//!
//! Variant choice, first match wins (the entry point's name says which ran):
//! - `fa1m_{dtype}_{D}_{mask}` (tensor cores, [`MmaTile`]): f16/bf16 with D = Dv in [`FA1_MMA_HEAD_DIMS`],
//!   a positive scale, Q/K/V/O base pointers and strides multiples of 8 elements ([`mma_unsupported_reason`]).
//!   FA-1's split: the warps of a block split the keys of each K/V tile and merge their partial softmax
//!   states once at the end.
//! - SIMT otherwise (f32 always, so f32 stays exact). D = Dv in
//!   [`FA1_FAST_HEAD_DIMS`](crate::FA1_FAST_HEAD_DIMS) takes the register-tiled kernel `fa1t_{dtype}_{D}`
//!   ([`tiled_shape`]: 256 threads with 8 query rows each in 128-row blocks for 64 < D <= 128, 4 rows in
//!   64-row blocks otherwise; 128 threads with 8 rows and 8 keys each for f32 at D = 64) when Q, K and V
//!   have 16-byte aligned bases and strides (it copies tiles in 16-byte chunks) and its shared memory fits,
//!   else the plain fixed-size kernel `fa1_{dtype}_{D}` (4 x 4 per thread, 64-row blocks) when that fits;
//!   everything else takes the generic `fa1_{dtype}` with one block column per 64 columns of Dv.

use crate::checked::call::Call;
use crate::checked::launch::{launch, LaunchDims};
use crate::checked::params::Masking;
use crate::error::unsupported;
use crate::sys::modules::{FA1, FA1_MMA};
use crate::sys::program::{cuda_type, Program};
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

/// Head dims (D = Dv) with a tensor-core `fa1m` specialisation for f16/bf16.
pub const FA1_MMA_HEAD_DIMS: [usize; 2] = [64, 128];

/// Tile of one `fa1m` specialisation (the arguments of `FA1M_ENTRY` in `kernels/fa1_mma.cu` after the head dim).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmaTile {
    /// Query rows per block.
    pub bm: usize,
    /// Keys per K/V tile.
    pub bn: usize,
    /// Warp row groups (each owns `bm / wm` query rows).
    pub wm: usize,
    /// Warp key groups (each owns `bn / wn` keys of every K/V tile: FA-1's split).
    pub wn: usize,
    /// K/V buffers (2: double-buffered).
    pub stages: usize,
    /// Blocks per SM the registers must allow (`__launch_bounds__`).
    pub min_blocks: usize,
}

impl MmaTile {
    /// Threads per block.
    pub fn threads(&self) -> usize {
        self.wm * self.wn * 32
    }

    /// Dynamic shared memory for head dim `d`, bytes (`Fa1MmaTile::SMEM_BYTES`): the larger of the loop's
    /// Q and K/V buffers (rows padded by 8 elements) and the final merge's m, l and f32 O rows.
    pub fn smem_bytes(&self, d: usize) -> usize {
        let lp = (self.bm + 2 * self.stages * self.bn) * (d + 8) * 2;
        let merge = (2 * self.wn * self.bm + self.bm * (d + 4)) * 4;
        lp.max(merge)
    }
}

/// The `fa1m` tile for head dim `d`, if `d` is specialised.
pub fn mma_tile_for(d: usize) -> Option<MmaTile> {
    let t = |bm, bn, wm, wn, stages, min_blocks| Some(MmaTile { bm, bn, wm, wn, stages, min_blocks });
    match d {
        64 => t(128, 128, 4, 2, 2, 1), // fa1m-choice-64
        128 => t(128, 64, 4, 2, 2, 1), // fa1m-choice-128
        _ => None,
    }
}

/// The program of the tensor-core entry `fa1m_{dtype}_{d}_{mask}`.
pub fn mma_program(dtype: DType, d: usize, tile: MmaTile, masking: Masking) -> Program {
    let name = format!("fa1m_{}_{d}_{}", dtype.name(), masking.suffix());
    let MmaTile { bm, bn, wm, wn, stages, min_blocks } = tile;
    let (mask, t) = (super::mask_const("FA2", masking.kind), cuda_type(dtype));
    let line = if masking.var != 0 {
        let var = masking.var_const();
        format!("FA1M_ENTRY_VAR({name}, {t}, {d}, {bm}, {bn}, {wm}, {wn}, {stages}, {min_blocks}, {mask}, {var})")
    } else {
        format!("FA1M_ENTRY({name}, {t}, {d}, {bm}, {bn}, {wm}, {wn}, {stages}, {min_blocks}, {mask})")
    };
    Program::entry(&FA1_MMA, name, line)
}

/// The SIMT variants, by entry macro of `kernels/fa1.cu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Simt {
    /// `fa1t_{dtype}_{d}`: register-tiled.
    Tiled(usize),
    /// `fa1_{dtype}_{d}`: fixed 4 x 4 per thread.
    Fixed(usize),
    /// `fa1_{dtype}`: any head dims.
    Generic,
}

fn simt_program(dtype: DType, variant: Simt) -> Program {
    let (dt, t) = (dtype.name(), cuda_type(dtype));
    let (name, line) = match variant {
        Simt::Tiled(d) => (format!("fa1t_{dt}_{d}"), format!("FA1_TILED(fa1t_{dt}_{d}, {t}, {d})")),
        Simt::Fixed(d) => (format!("fa1_{dt}_{d}"), format!("FA1_FIXED(fa1_{dt}_{d}, {t}, {d})")),
        Simt::Generic => (format!("fa1_{dt}"), format!("FA1_GENERIC(fa1_{dt}, {t})")),
    };
    Program::entry(&FA1, name, line)
}

/// Every `fa1` instantiation a launch can ask for.
pub fn programs() -> Vec<Program> {
    let mut all = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        for d in FA1_MMA_HEAD_DIMS {
            let Some(tile) = mma_tile_for(d) else { continue };
            all.extend(Masking::all().into_iter().map(|m| mma_program(dtype, d, tile, m)));
        }
    }
    for dtype in DType::ALL {
        for d in crate::FA1_FAST_HEAD_DIMS {
            all.push(simt_program(dtype, Simt::Tiled(d)));
            all.push(simt_program(dtype, Simt::Fixed(d)));
        }
        all.push(simt_program(dtype, Simt::Generic));
    }
    all
}

/// Why the tensor-core `fa1m` cannot run this call (it then runs a SIMT variant), or `None` when it can.
pub fn mma_unsupported_reason(call: &Call<'_>) -> Option<String> {
    let spec = call.spec;
    let s = spec.shape;
    if !matches!(spec.dtype, DType::F16 | DType::BF16) {
        return Some(format!("dtype {} (fa1 runs f32 in SIMT, exactly)", spec.dtype));
    }
    if s.d != s.dv || mma_tile_for(s.d).is_none() {
        return Some(format!("head dims D = {}, Dv = {} (tensor cores: D = Dv in {FA1_MMA_HEAD_DIMS:?})", s.d, s.dv));
    }
    if spec.scale() <= 0.0 {
        return Some(format!("scale {} (the running max is taken before scaling)", spec.scale()));
    }
    if s.b > 65535 || s.hq > 65535 {
        return Some(format!("B = {} or Hq = {} above the grid's 65535", s.b, s.hq));
    }
    if !call.params.qkvo_aligned_8_elements() {
        return Some("operands not 16-byte aligned (base pointers and strides must be multiples of 8 elements)".into());
    }
    None
}

/// The tensor-core plan, when [`mma_unsupported_reason`] allows it.
fn mma_plan(call: &Call<'_>) -> Option<Result<(Program, LaunchDims)>> {
    if mma_unsupported_reason(call).is_some() {
        return None;
    }
    let s = call.spec.shape;
    let tile = mma_tile_for(s.d)?;
    let smem = tile.smem_bytes(s.d);
    if smem > call.dev.info().smem_per_block_optin as usize {
        return None;
    }
    let plan =
        u32::try_from(s.sq.div_ceil(tile.bm)).map_err(|_| unsupported("fa1: too many query tiles")).map(|tiles| {
            let dims = LaunchDims {
                grid: (tiles, s.hq as u32, s.b as u32),
                block: (tile.threads() as u32, 1, 1),
                smem_bytes: smem as u32,
            };
            (mma_program(call.spec.dtype, s.d, tile, Masking::of(call.spec)), dims)
        });
    Some(plan)
}

/// The program (one entry point), grid and shared memory `fa1` uses for the call.
pub fn plan(call: &Call<'_>) -> Result<(Program, LaunchDims)> {
    if let Some(p) = mma_plan(call) {
        return p;
    }
    simt_plan(call)
}

/// The SIMT entry point, grid and shared memory for the call.
fn simt_plan(call: &Call<'_>) -> Result<(Program, LaunchDims)> {
    let s = call.spec.shape;
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
        return Ok((simt_program(dtype, Simt::Tiled(s.d)), dims));
    }
    if fast && fixed_smem_bytes(s.d) <= optin {
        let dims =
            LaunchDims { grid: (blocks, 1, 1), block: (THREADS, 1, 1), smem_bytes: fixed_smem_bytes(s.d) as u32 };
        Ok((simt_program(dtype, Simt::Fixed(s.d)), dims))
    } else {
        let chunks = u32::try_from(s.dv.div_ceil(DVC)).map_err(|_| unsupported("Dv too large"))?;
        let dims =
            LaunchDims { grid: (blocks, chunks, 1), block: (THREADS, 1, 1), smem_bytes: generic_smem_bytes() as u32 };
        Ok((simt_program(dtype, Simt::Generic), dims))
    }
}

/// Launches `fa1` on the call's stream.
pub fn run(call: &Call<'_>) -> Result<()> {
    // Ragged batches are the tensor-core kernels' (the policy never sends them here).
    super::policy::refuse_ragged("fa1", call.spec)?;
    let (program, dims) = plan(call)?;
    // SAFETY: `call.params` holds pointers the backend checked against the validated spec (lengths cover
    // every strided offset); the kernel reads Q/K/V/mask and writes O/LSE only within those extents (the
    // tensor-core variant reads rows < Sq/Sk only, zero-filling the rest, and stores rows < Sq).
    unsafe { launch(call.dev, call.stream, &program, &program.name, dims, &call.params) }
}
