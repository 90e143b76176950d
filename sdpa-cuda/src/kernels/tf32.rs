//! The opt-in tensor-core path for f32 inputs (`kernels/tf32.cu`), run as kernel `fa2` with
//! `F32Math::Tf32` (one TF32 product, about 3e-4 relative error) or `F32Math::SplitTf32` (three TF32
//! products per k-step, each group rounded once into an f32 sum: about f32 accuracy). Every result record
//! carries the `F32Math` it ran with.
//!
//! Head dims: any D and Dv from 1 to 256, equal or not (issue 21), both padded with zeros to the class
//! (16, 32, 64, 128 or 256) of the larger inside the kernel: Q and K columns past D and V columns past Dv
//! are zero in shared memory and O is stored to Dv. Larger head dims are `Unsupported` (the exact `fa1`
//! path covers them; [`super::policy::tf32_refuses`]). Any strides work: 16-byte `cp.async` loads when D,
//! Dv and every Q/K/V stride allow, scalar loads otherwise.
//!
//! On a compute-capability 9.0 device, plain TF32 with a head dim of 65..=128 on the 16-byte path runs
//! `kernels/tf32_wgmma.cu` (Hopper warpgroup MMA) instead of the `mma.sync` kernel; setting the environment
//! variable `SDPA_TF32_WGMMA=0` keeps the `mma.sync` kernel (for comparisons).

use crate::checked::call::Call;
use crate::checked::device::DeviceInfo;
use crate::checked::launch::{launch, LaunchDims};
use crate::checked::params::mask_suffix;
use crate::checked::params::AttnParams;
use crate::error::unsupported;
use crate::sys::modules::{TF32, TF32_WGMMA};
use crate::sys::program::Program;
use sdpa_core::{DType, F32Math, Result};

/// The tile of one entry point of `kernels/tf32.cu` (the arguments of its `TC_ENTRY` after the head dim).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tile {
    /// m16 row tiles per warp.
    pub mt: usize,
    /// Warps per block.
    pub warps: usize,
    /// Keys per K/V tile.
    pub bk: usize,
    /// K/V shared-memory buffers (2: double-buffered).
    pub stages: usize,
    /// K and V rounded (split) once per block in shared memory rather than by every warp at each use.
    pub pre: bool,
}

impl Tile {
    /// Query rows per block.
    pub fn rows(&self) -> usize {
        16 * self.mt * self.warps
    }

    /// Dynamic shared memory for padded head dim `dp`, bytes (`TcCfg::SMEM_BYTES`).
    pub fn smem_bytes(&self, dp: usize, split: bool) -> usize {
        let ld = dp + 4;
        let halves = if split { 2 } else { 1 };
        let kv_bufs = if self.pre { halves } else { 1 } * self.stages;
        4 * (halves * self.rows() * ld + 2 * kv_bufs * self.bk * ld)
    }
}

/// The tile of the entry instantiated for padded head dim `dp`, split TF32 or not, and a mask kind
/// (`params::MASK_*`; every mask takes the same tile at present, the table allows one per mask), chosen by
/// measurement on the H100 (`dev/tf32_bench.py`; bench/results/gpu/tf32.md).
pub fn tile_for(dp: usize, split: bool, _mask_kind: i32) -> Tile {
    let t = |mt, warps, bk, stages, pre| Tile { mt, warps, bk, stages, pre };
    match (dp, split) {
        (16 | 32, false) => t(2, 4, 64, 2, true),
        (64, false) => t(2, 8, 64, 2, true),
        (128, false) => t(2, 8, 32, 1, true),
        (16 | 32 | 64, true) => t(2, 4, 32, 1, true),
        (128, true) => t(1, 8, 32, 1, true),
        _ => t(1, 4, 16, 1, true),
    }
}

/// The smaller tile instantiated (entry suffix `s`) for padded head dims whose [`tile_for`] needs more
/// shared memory per block than a device without the H100's 227 KB allows: at most 99 KB, the opt-in limit of
/// compute capability 8.6/8.9 parts (an A100 allows 163 KB and takes it too where the H100 tile does not
/// fit). `None` where the H100 tile fits in 99 KB already. Correct on any device; its speed is measured on
/// none but the H100 (`tests/tf32_kernels.rs` runs it there by lowering `SDPA_CUDA_SMEM_OPTIN`).
pub fn small_tile_for(dp: usize, split: bool) -> Option<Tile> {
    let t = |mt, warps, bk, stages, pre| Some(Tile { mt, warps, bk, stages, pre });
    match (dp, split) {
        (64, false) => t(2, 4, 64, 1, true),
        (128, false) => t(1, 4, 32, 1, true),
        (64, true) => t(1, 4, 32, 1, true),
        (128, true) => t(1, 2, 16, 1, true),
        (256, true) => t(1, 1, 16, 1, false),
        _ => None,
    }
}

/// The tile a call runs with on a device allowing `optin` bytes of shared memory per block, and its entry
/// suffix: the H100 tile where it fits, else the small one (where none fits, the launch check reports it).
pub fn choose_tile(dp: usize, split: bool, mask_kind: i32, optin: usize) -> (Tile, &'static str) {
    let big = tile_for(dp, split, mask_kind);
    match small_tile_for(dp, split) {
        Some(small) if big.smem_bytes(dp, split) > optin => (small, "s"),
        _ => (big, ""),
    }
}

/// The wgmma kernel's block (`kernels/tf32_wgmma.cu`): two consumer warpgroups of 64 query rows each
/// and one producer warpgroup.
pub const WG_ROWS: usize = 128;
/// Threads per block of the wgmma kernel.
pub const WG_THREADS: usize = 384;
/// Its dynamic shared memory: Q (128 x 128 f32), 2-deep K and Vᵀ rings and one V staging tile of 64 x 128
/// f32, 8 mbarriers.
pub const WG_SMEM_BYTES: usize = WG_ROWS * 128 * 4 + 5 * 64 * 128 * 4 + 8 * 8;
const _: () = assert!(WG_SMEM_BYTES <= 227 * 1024, "over the H100's opt-in shared memory per block");

/// Whether the call runs the wgmma kernel: plain TF32, padded head dim 128, 16-byte loads, an sm_90 device
/// whose opt-in shared memory holds the kernel's 224 KB, and `allowed` (see [`wgmma_allowed`]).
fn use_wgmma(info: &DeviceInfo, dp: usize, split: bool, loads16: bool, allowed: bool) -> bool {
    allowed
        && !split
        && dp == 128
        && loads16
        && info.compute_capability == (9, 0)
        && info.smem_per_block_optin.max(0) as usize >= WG_SMEM_BYTES
}

/// False when the environment sets `SDPA_TF32_WGMMA=0` (the mma.sync kernel everywhere, for comparisons and
/// for testing that kernel on an H100).
fn wgmma_allowed() -> bool {
    std::env::var_os("SDPA_TF32_WGMMA").is_none_or(|v| v != "0")
}

/// Padded head dim the kernel is instantiated for, if any.
pub fn padded_head_dim(d: usize) -> Option<usize> {
    [16, 32, 64, 128, 256].into_iter().find(|&p| d <= p)
}

/// The program of entry `{tf32|tf32x3}_f32_{dp}{suffix}_{mask}` of `kernels/tf32.cu` with `tile`.
pub fn program(split: bool, dp: usize, suffix: &str, tile: Tile, mask_kind: i32) -> Program {
    let prefix = if split { "tf32x3" } else { "tf32" };
    let name = format!("{prefix}_f32_{dp}{suffix}_{}", mask_suffix(mask_kind));
    let Tile { mt, warps, bk, stages, pre } = tile;
    let mask = super::mask_const("TC", mask_kind);
    let line = format!("TC_ENTRY({name}, {dp}, {mt}, {warps}, {bk}, {stages}, {split}, {pre}, {mask})");
    Program::entry(&TF32, name, line)
}

/// The program of the wgmma entry `tf32wg_f32_128_{mask}` (`kernels/tf32_wgmma.cu`).
pub fn wgmma_program(mask_kind: i32) -> Program {
    let name = format!("tf32wg_f32_128_{}", mask_suffix(mask_kind));
    let line = format!("WG_ENTRY({name}, {})", super::mask_const("TC", mask_kind));
    Program::entry(&TF32_WGMMA, name, line)
}

/// Every instantiation of the f32 tensor-core kernels a launch can ask for.
pub fn programs() -> Vec<Program> {
    let mut all = Vec::new();
    for split in [false, true] {
        for dp in [16, 32, 64, 128, 256] {
            for &m in &super::MASK_KINDS {
                all.push(program(split, dp, "", tile_for(dp, split, m), m));
                all.extend(small_tile_for(dp, split).map(|t| program(split, dp, "s", t, m)));
            }
        }
    }
    all.extend(super::MASK_KINDS.iter().map(|&m| wgmma_program(m)));
    all
}

/// One planned launch of the f32 tensor-core path.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The program (one entry point).
    pub program: Program,
    /// Grid, block and shared memory.
    pub dims: LaunchDims,
    /// The call's parameters with the kernel's flag word (`extra`) set.
    pub params: AttnParams,
}

/// Program, launch shape and flags of the TF32 or split-TF32 kernel for the call.
pub fn plan(call: &Call<'_>) -> Result<Plan> {
    let s = call.spec.shape;
    if call.spec.dtype != DType::F32 {
        return Err(unsupported("the TF32 kernels take f32 inputs"));
    }
    if let Some(why) = super::policy::tf32_refuses(call.spec) {
        return Err(unsupported(why));
    }
    let split = match call.opts.f32_math {
        F32Math::Tf32 => false,
        F32Math::SplitTf32 => true,
        F32Math::Exact => return Err(unsupported("the tensor-core f32 kernel needs f32 math tf32 or split-tf32")),
    };
    // One class for both head dims: the kernel's Q·Kᵀ and P·V run DP columns, with Q/K zero past D and V
    // zero past Dv (Dv != D at no extra class).
    let dp = padded_head_dim(s.d.max(s.dv)).ok_or_else(|| {
        unsupported(format!(
            "f32 tensor-core path needs D and Dv <= 256 (got D = {}, Dv = {}); use fa1 for exact f32",
            s.d, s.dv
        ))
    })?;
    let p = &call.params;
    // `extra` is the kernel's flag word: bit 0, 16-byte loads (every Q/K/V row start 16-byte aligned);
    // bit 1, 8-byte output stores (every O row start 8-byte aligned, Dv even).
    let loads16 = [p.q, p.k, p.v].iter().all(|&a| a % 16 == 0)
        && s.d.is_multiple_of(4)
        && s.dv.is_multiple_of(4)
        && [p.q_stride, p.k_stride, p.v_stride].iter().flatten().all(|&st| st % 4 == 0);
    let stores8 = p.o.is_multiple_of(8) && s.dv.is_multiple_of(2) && p.o_stride.iter().all(|&st| st % 2 == 0);
    let params = AttnParams { extra: i32::from(loads16) | (i32::from(stores8) << 1), ..*p };
    let info = call.dev.info();
    let wgmma = use_wgmma(info, dp, split, loads16, wgmma_allowed());
    let (tile, suffix) = choose_tile(dp, split, p.mask_kind, info.smem_per_block_optin.max(0) as usize);
    let (rows, threads, smem) = if wgmma {
        (WG_ROWS, WG_THREADS, WG_SMEM_BYTES)
    } else {
        (tile.rows(), tile.warps * 32, tile.smem_bytes(dp, split))
    };
    let blocks =
        s.sq.div_ceil(rows)
            .checked_mul(s.b * s.hq)
            .and_then(|x| u32::try_from(x).ok())
            .filter(|&x| x <= i32::MAX as u32)
            .ok_or_else(|| unsupported("grid exceeds 2^31 blocks"))?;
    let dims = LaunchDims { grid: (blocks, 1, 1), block: (threads as u32, 1, 1), smem_bytes: smem as u32 };
    let program = if wgmma { wgmma_program(p.mask_kind) } else { program(split, dp, suffix, tile, p.mask_kind) };
    Ok(Plan { program, dims, params })
}

/// Launches the TF32 or split-TF32 kernel on the call's stream.
pub fn run(call: &Call<'_>) -> Result<()> {
    // Ragged batches are the tensor-core kernels' (the policy never sends them here).
    super::policy::refuse_ragged("fa2 with f32 inputs (TF32)", call.spec)?;
    let Plan { program, dims, params } = plan(call)?;
    // SAFETY: `call.params` was built from the validated spec and buffers whose lengths cover every strided
    // offset; the kernels stay within them (rows past Sq/Sk and columns past D are never read or written),
    // and 16-byte loads / 8-byte stores are only enabled when every address they touch is aligned. The
    // wgmma kernel is only launched with 16-byte loads, on an sm_90 device, for which its program is built.
    unsafe { launch(call.dev, call.stream, &program, &program.name, dims, &params) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checked::params::{MASK_CAUSAL, MASK_EXPLICIT, MASK_NONE};

    /// The wgmma kernel runs only where it was built for and measured: plain TF32, D padded to 128, the
    /// 16-byte path, compute capability 9.0, and not switched off.
    #[test]
    fn wgmma_only_for_plain_tf32_d128_on_sm90() {
        let dev = |cc, optin| DeviceInfo {
            ordinal: 0,
            name: String::new(),
            compute_capability: cc,
            sm_count: 132,
            max_threads_per_block: 1024,
            max_grid: (i32::MAX, 65535, 65535),
            smem_per_block: 48 * 1024,
            smem_per_block_optin: optin,
            driver_version: 13000,
            total_mem: 0,
        };
        let h100 = dev((9, 0), 227 * 1024);
        assert!(use_wgmma(&h100, 128, false, true, true));
        assert!(!use_wgmma(&h100, 128, false, true, false));
        assert!(!use_wgmma(&h100, 128, true, true, true));
        assert!(!use_wgmma(&h100, 64, false, true, true));
        assert!(!use_wgmma(&h100, 256, false, true, true));
        assert!(!use_wgmma(&h100, 128, false, false, true));
        assert!(!use_wgmma(&dev((9, 0), 163 * 1024), 128, false, true, true));
        assert!(!use_wgmma(&dev((8, 0), 227 * 1024), 128, false, true, true));
        assert!(!use_wgmma(&dev((10, 0), 227 * 1024), 128, false, true, true));
        let src = crate::sys::modules::TF32_WGMMA.source;
        assert!(src.contains("#define WG_NC 2") && src.contains("#define WG_ST 2"), "block shape changed");
    }

    /// The small tiles fit 99 KB (compute capability 8.6/8.9) and are what such a device runs; an H100 runs
    /// the big tiles; every small tile is instantiated under its `s` entries.
    #[test]
    fn small_tiles_for_devices_with_less_shared_memory() {
        let all = programs();
        for dp in [16, 32, 64, 128, 256] {
            for split in [false, true] {
                let big = tile_for(dp, split, MASK_NONE);
                assert_eq!(choose_tile(dp, split, MASK_NONE, 227 * 1024), (big, ""));
                let (t, suffix) = choose_tile(dp, split, MASK_CAUSAL, 99 * 1024);
                assert!(t.smem_bytes(dp, split) <= 99 * 1024, "dp {dp} split {split}: {t:?}");
                assert!(t.bk.is_multiple_of(16) && (1..=2).contains(&t.stages), "{t:?}");
                if let Some(small) = small_tile_for(dp, split) {
                    assert_eq!((t, suffix), (small, "s"));
                    let small = program(split, dp, "s", t, MASK_CAUSAL);
                    assert!(small.name.ends_with("s_causal") && all.contains(&small), "{small:?}");
                } else {
                    assert_eq!((t, suffix), (big, ""), "dp {dp} split {split}: the big tile fits 99 KB");
                }
            }
        }
    }

    /// Every tile fits the 227 KB opt-in shared memory of an H100/A100 block and has whole k16 steps.
    #[test]
    fn tiles_fit_shared_memory() {
        for dp in [16, 32, 64, 128, 256] {
            for split in [false, true] {
                for mask in [MASK_NONE, MASK_CAUSAL, MASK_EXPLICIT] {
                    let t = tile_for(dp, split, mask);
                    assert!(t.smem_bytes(dp, split) <= 227 * 1024, "dp {dp} split {split}: {t:?}");
                    assert!(t.bk.is_multiple_of(16) && (1..=2).contains(&t.stages), "{t:?}");
                }
            }
        }
        assert_eq!(padded_head_dim(40), Some(64));
        assert_eq!(padded_head_dim(257), None);
    }
}
